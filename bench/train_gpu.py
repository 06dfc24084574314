"""GPU checks of the train stage that are not a training run (those are `python -m train` itself); what each
check does: bench/README.md ("Single levers").

    python bench/train_gpu.py packed --data out/gpu/sft_packed.json --model qwen2.5-0.5b [--attention te --json F]
    python bench/train_gpu.py attention --model qwen2.5-0.5b --seq-length 4096
    python bench/train_gpu.py profile -- TRAIN-ARGS        (torchrun alike, rank 0 reports)
    python bench/train_gpu.py split --model qwen2.5-3b
    python bench/train_gpu.py same-weights -- A B
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from qwen_data_train.attention import compiled_flex_attention, document_mask
from qwen_data_train.data import samples_of_row
from qwen_data_train.distributed import init_distributed
from qwen_data_train.model import build_model
from qwen_data_train.plan import RunPlan
from qwen_data_train.shapes import PRESETS
from qwen_data_train.step import ForwardSpec, forward


def packed(args) -> None:
    from qwen_data_train.data import build_datasets

    device = init_distributed(1)
    train, _, _ = build_datasets(args.data, args.seq_length, train_samples=args.rows, valid_samples=0,
                                 test_samples=0, seed=args.seed)
    torch.manual_seed(args.seed)
    model = build_model(RunPlan.for_model(PRESETS[args.model], attention=args.attention,
                                          max_sequence_length=args.seq_length, cuda=True))
    model = model.to(device).eval()
    print(f"{args.model}, attention {args.attention}, {args.rows} packed rows of {args.seq_length} from {args.data}")
    for autocast in (True, False) if args.attention != "te" else (True,):
        spec = ForwardSpec(args.attention, device, autocast, cross_entropy="megatron", seq_length=args.seq_length)
        worst, total_abs, count, trained_worst, leak = 0.0, 0.0, 0, 0.0, 0.0
        segments_seen = 0
        for i in range(args.rows):
            row = {k: torch.as_tensor(v).unsqueeze(0) for k, v in train[i].items()}
            with torch.no_grad():
                whole = forward(model, row, spec)[0].float()
                leaky_row = dict(row, segment_ids=torch.zeros_like(row["segment_ids"]))
                # Leaky control: a causal mask over the whole row ignores sample boundaries.
                leaky = forward(model, leaky_row, spec)[0].float()
                for start, end, alone in samples_of_row(row):
                    single = forward(model, alone, spec)[0].float()
                    diff = (whole[start:end] - single).abs()
                    trained = row["loss_mask"][0, start:end].to(device) > 0
                    worst = max(worst, diff.max().item())
                    if trained.any():
                        trained_worst = max(trained_worst, diff[trained].max().item())
                    total_abs += diff.sum().item()
                    count += diff.numel()
                    segments_seen += 1
                leak = max(leak, (whole - leaky).abs().max().item())
        mode = "bf16 autocast" if autocast else "float32"
        print(f"[{mode}] {segments_seen} samples: per-token loss |packed - alone| max {worst:.3e} "
              f"(trained tokens: max {trained_worst:.3e}), mean {total_abs / count:.3e}; "
              f"control, attention leaking across samples: max {leak:.3e}")
        if autocast and args.json:
            with open(args.json, "w") as f:
                json.dump({"attention": args.attention, "max_abs_diff": trained_worst, "leak_control": leak,
                           "samples": segments_seen, "rows": args.rows}, f)


def attention(args) -> None:
    device = torch.device("cuda")
    preset = PRESETS[args.model]
    b, s, d = args.micro_batch_size, args.seq_length, preset.kv_channels
    q = torch.randn(b, preset.num_attention_heads, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, preset.num_query_groups, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grad = torch.randn_like(q)

    def run(fn):
        """fn's output and q, k, v gradients against `grad`."""
        q.grad = k.grad = v.grad = None
        out = fn()
        out.backward(grad)
        return [out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]

    def rel(a, b):  # worst relative difference over the output and the three gradients
        return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b))

    def time_it(fn, n=20):
        for _ in range(3):
            fn().backward(grad)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn().backward(grad)
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0) / n

    def flex(segments):
        mask = document_mask(segments).block_mask
        return lambda: compiled_flex_attention(q, k, v, block_mask=mask, scale=d ** -0.5, enable_gqa=True)

    shape = f"[{b}, {q.shape[1]}/{k.shape[1]} heads, {s}, {d}] bf16"
    one_doc = torch.zeros(b, s, dtype=torch.int32, device=device)
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, scale=d ** -0.5, enable_gqa=True)
    ref = run(sdpa)
    print(f"one document a row, {shape}: SDPA causal {time_it(sdpa):.2f} ms, flex {time_it(flex(one_doc)):.2f} ms "
          f"(differs by {rel(run(flex(one_doc)), ref):.1e})")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                print(f"  SDPA causal by {backend.name}: {time_it(sdpa):.2f} ms (differs by {rel(run(sdpa), ref):.1e})")
        except RuntimeError as e:  # a backend that does not take this shape
            print(f"  SDPA causal by {backend.name}: not run ({str(e).splitlines()[0][:100]})")
    from qwen_data_train.attention import have_transformer_engine
    if have_transformer_engine():
        from transformer_engine.pytorch import DotProductAttention
        te = DotProductAttention(q.shape[1], d, num_gqa_groups=k.shape[1], qkv_format="bshd", attn_mask_type="causal",
                                 softmax_scale=d ** -0.5)
        bshd = lambda: te(*(t.transpose(1, 2).contiguous() for t in (q, k, v))).view(b, s, q.shape[1], d).transpose(1, 2)  # noqa: E731
        print(f"one document a row: Transformer Engine (cuDNN fused attention) {time_it(bshd):.2f} ms "
              f"(differs from SDPA by {rel(run(bshd), ref):.1e})")
    # Four documents a row, as bench/gpu.sh's packed SFT rows hold on average.
    seg = (torch.rand(b, s, device=device) < 3 / s).cumsum(-1).to(torch.int32)
    dense = document_mask(seg.cpu()).dense().to(device)
    masked = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=dense, scale=d ** -0.5, enable_gqa=True)
    print(f"~4 documents a row: flex {time_it(flex(seg)):.2f} ms (differs from SDPA with a dense mask by "
          f"{rel(run(flex(seg)), run(masked)):.1e})")
    document_mask(seg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        document_mask(seg)
    torch.cuda.synchronize()
    print(f"block mask build ({b}×{s}): {100 * (time.perf_counter() - t0):.2f} ms")


def profile(args) -> None:
    import torch.distributed as dist
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.distributed import distributed
    from qwen_data_train.loop import Trainer, model_of
    from qwen_data_train.plan import Environment
    from qwen_data_train.patches import megatron_core
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    config = TrainConfig.parse(args.train)
    plan = RunPlan.resolve(config, model_of(config)[0], Environment.current())
    with megatron_core(), distributed(plan.tp, plan.pp, plan.ep, plan.cp) as device:  # torchrun: every rank
        trainer = Trainer(config, device, plan)
        if device.type != "cuda":  # a dry run
            torch.cuda.synchronize = lambda: None
        for _ in range(args.warm):
            trainer.train_step()
        torch.cuda.synchronize()
        with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step()
            torch.cuda.synchronize()
        step_ms = 1000 * (time.perf_counter() - started) / args.steps
        if dist.get_rank() != 0:
            return
        events = prof.key_averages()
        # Kernels' own time (streams that overlap count twice): near the step time, the GPU is the bound;
        # far below it, the host's launches or waits are.
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.self_device_time_total for e in kernels) / 1000 / args.steps
        print(f"{step_ms:.0f} ms/step over {args.steps} profiled steps; GPU kernels {busy_ms:.0f} ms/step "
              f"({busy_ms / step_ms:.0%})")
        print(events.table(sort_by=args.sort, row_limit=args.rows_shown, max_name_column_width=70))


def split_join(args) -> None:
    from qwen_data_train import optimizer

    shape = PRESETS[args.model]
    h, q = shape.hidden_size, shape.num_attention_heads * shape.kv_channels
    kv = shape.num_query_groups * shape.kv_channels
    layer = [(q + 2 * kv, h), (h, q), (2 * shape.ffn_hidden_size, h), (h, shape.ffn_hidden_size)]
    weights = [torch.randn(rows, columns, device="cuda") for rows, columns in layer * shape.num_layers]
    eager = [optimizer._split(w) for w in weights]
    for name, split_, join in [("eager", optimizer._split, optimizer._join),
                               ("compiled", optimizer.split_float32, optimizer.join_float32)] * 2:
        torch.cuda.synchronize()
        started = time.perf_counter()
        parts = [split_(w) for w in weights]
        joined = [join(high, low) for high, low in parts]
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) and torch.equal(la, lb)
                   for (a, la), (b, lb) in zip(parts, eager))
        same = same and all(torch.equal(j.view(torch.int32), optimizer._join(*e).view(torch.int32))
                            for j, e in zip(joined, eager))
        print(f"{name}: split and join of {sum(w.numel() for w in weights) / 1e9:.2f}G elements "
              f"{1000 * (time.perf_counter() - started):.1f} ms, bits as eager: {same}")


def same_weights(args) -> None:
    import glob
    import os

    from safetensors.torch import load_file

    a, b = ({k: v for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))) for k, v in load_file(path).items()}
            for folder in args.train)
    differ = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not a[k].equal(b[k]))
    print(f"{len(a)} tensors in {args.train[0]}, {len(b)} in {args.train[1]}: "
          + (f"differ: {differ[:5]}" if differ else "same weights"))
    sys.exit(1 if differ else 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", choices=["packed", "attention", "profile", "split", "same-weights"])
    p.add_argument("--warm", type=int, default=4, help="profile: steps before the profiled ones")
    p.add_argument("--steps", type=int, default=2, help="profile: steps profiled")
    p.add_argument("--rows-shown", type=int, default=30)
    p.add_argument("--sort", default="cuda_time_total",
                   help="profile: the table's order (self_cuda_time_total: the kernels by their own time)")
    p.add_argument("--data", default="out/gpu/sft_packed.json")
    p.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "te"], help="packed: the core attention")
    p.add_argument("--json", help="packed: write the bf16 figures here")
    p.add_argument("--seed", type=int, default=1234)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    args.train = argv[split + 1:]  # profile: the train stage's arguments
    {"packed": packed, "attention": attention, "profile": profile, "split": split_join,
     "same-weights": same_weights}[args.check](args)


if __name__ == "__main__":
    main()
