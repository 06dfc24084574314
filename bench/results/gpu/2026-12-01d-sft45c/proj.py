"""The attention output projection of Qwen2.5-0.5B over packed SFT's batch-major rows ([b, s] = [4, 4096],
896 wide), added to the [s, b] residual stream, compiled, under bf16 autocast: this tree's path
(BatchMajorLinear) against megatron-core's (the path before it: its linear over the [b, s] rows,
transposed), in one process on one GPU. Prints each compiled backward's kernels, the gradients'
differences from megatron-core's eager path, and the median time of a forward and backward."""

import inspect
import re
import sys

import torch
from megatron.core.tensor_parallel.layers import RowParallelLinear, linear_with_grad_accumulation_and_async_allreduce
from megatron.core.transformer import TransformerConfig
from torch._inductor.utils import run_and_get_code

from qwen_data_train.distributed import distributed
from qwen_data_train.model.layers import GroupedRowParallelLinear
from qwen_data_train.patches import megatron_core


def build(device):
    config = TransformerConfig(num_layers=1, hidden_size=896, num_attention_heads=14, use_cpu_initialization=True)
    torch.manual_seed(0)
    return GroupedRowParallelLinear(896, 896, config=config, init_method=lambda w: torch.nn.init.normal_(w, std=0.02),
                                    bias=False, input_is_parallel=True, skip_bias_add=True).to(device)


def blocks(linear):
    extra = {"gtp_remat_size": 1} if "gtp_remat_size" in inspect.signature(
        linear_with_grad_accumulation_and_async_allreduce).parameters else {}

    def new(rows, residual):
        return residual + linear(rows.transpose(0, 1))[0]

    def old(rows, residual):  # HEAD before this change: megatron-core's linear over the [b, s] rows
        out = RowParallelLinear._forward_impl(linear, rows, linear.weight, bias=None, gradient_accumulation_fusion=False,
                                              allreduce_dgrad=False, sequence_parallel=False, tp_group=linear.tp_group,
                                              grad_output_buffer=None, **extra)
        return residual + out.transpose(0, 1)
    return {"new": new, "old": old}


def step(fn, linear, rows, residual, grad):
    rows.grad = residual.grad = linear.weight.grad = None
    with torch.autocast("cuda", torch.bfloat16, enabled=rows.is_cuda):
        out = fn(rows, residual)
    out.backward(grad)
    return out.detach().float(), rows.grad.float(), residual.grad.float(), linear.weight.grad.float()


def timed(fn, *args, n=50):
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def main():
    with megatron_core(), distributed(1) as device:
        linear = build(device)
        cuda = torch.device(device).type == "cuda"
        b, s, h = (4, 4096, 896) if cuda else (2, 64, 896)  # the CPU: a dry run of the script
        torch.manual_seed(1)
        dtype = torch.bfloat16 if cuda else torch.float32
        rows = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
        residual = torch.randn(s, b, h, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(s, b, h, device=device, dtype=dtype)
        fns = blocks(linear)
        ref = step(fns["old"], linear, rows, residual, grad)
        for name in ("new", "old"):
            run = torch.compile(fns[name])
            got, codes = run_and_get_code(step, run, linear, rows, residual, grad)
            kernels = sorted(set(re.findall(r"\b(triton_\w+|cpp_fused_\w+|extern_kernels\.\w+|aten\.\w+)\(", "\n".join(codes))))
            print(name, "kernels run by the compiled code:", kernels)
            for what, ours, theirs in zip(("out", "rows.grad", "residual.grad", "weight.grad"), got, ref):
                print(f"  {what}: max |diff| {(ours - theirs).abs().max().item():.3g}"
                      f" (max |ref| {theirs.abs().max().item():.3g})")
            if cuda:
                ms = timed(step, run, linear, rows, residual, grad)
                print(f"  {name}: forward+backward median {ms * 1000:.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
