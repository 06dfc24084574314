"""The output projection's weight gradient from the stream's [s, b] gradient and the [b, s] rows, bf16,
Qwen2.5-0.5B packed SFT's shapes: each way timed alone (triton.testing.do_bench, median us)."""
import torch
from triton.testing import do_bench

b, s, n = 4, 4096, 896
torch.manual_seed(0)
g = torch.randn(s, b, n, device="cuda", dtype=torch.bfloat16)
x = torch.randn(b, s, n, device="cuda", dtype=torch.bfloat16)
gb = g.transpose(0, 1)
ways = {
    "copy only": lambda: gb.contiguous(),
    "mm only (rows already [b, s])": (lambda c: lambda: torch.mm(c.view(-1, n).t(), x.view(-1, n)))(gb.contiguous()),
    "copy + mm (megatron-core)": lambda: torch.mm(gb.contiguous().view(-1, n).t(), x.view(-1, n)),
    "bmm + sum fp32 (this tree)": lambda: torch.bmm(gb.transpose(1, 2), x).sum(0, dtype=torch.float32),
    "bmm fp32 out + sum": lambda: torch.bmm(gb.transpose(1, 2), x, out_dtype=torch.float32).sum(0),
    "mm + 3 addmm_ (bf16 out)": lambda: [o := torch.mm(gb[0].t(), x[0])] + [o.addmm_(gb[i].t(), x[i]) for i in range(1, b)],
    "mm + 3 addmm fp32 out": lambda: [o := torch.mm(gb[0].t(), x[0], out_dtype=torch.float32)]
    + [o.copy_(torch.addmm(o, gb[i].t(), x[i], out_dtype=torch.float32)) for i in range(1, b)],
}
for name, fn in ways.items():
    try:
        print(f"{name}: {do_bench(fn, warmup=50, rep=300, return_mode='median') * 1000:.1f} us", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: failed: {str(e)[:120]}")
