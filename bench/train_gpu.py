"""GPU checks of the train stage that are not a training run (those are `python -m train` itself).

    python bench/train_gpu.py packed --data out/gpu/sft_packed.json --model qwen2.5-0.5b
    python bench/train_gpu.py attention --model qwen2.5-0.5b --seq-length 4096

packed     Per-token losses of packed SFT rows (FlexAttention document mask) against each of their
           samples run alone (SDPA, causal), in bf16 autocast and in float32. As a control, the
           same rows with attention leaking across samples (plain causal).
attention  One attention layer's shapes: FlexAttention with a single-document block mask against
           SDPA causal (the same function: difference and time), and the block mask's build time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from train.attention import _flex, document_mask  # noqa: E402
from train.data import samples_of_row  # noqa: E402
from train.distributed import init_distributed  # noqa: E402
from train.step import forward  # noqa: E402
from train.model import PRESETS, build_model  # noqa: E402


def packed(args) -> None:
    from train.data import build_datasets

    device = init_distributed(1)
    train, _, _ = build_datasets(args.data, args.seq_length, train_samples=args.rows, valid_samples=0,
                                 test_samples=0, seed=args.seed)
    torch.manual_seed(args.seed)
    model = build_model(PRESETS[args.model], attention="sdpa", max_sequence_length=args.seq_length).to(device).eval()
    print(f"{args.model}, {args.rows} packed rows of {args.seq_length} from {args.data}")
    for autocast in (True, False):
        worst, total_abs, count, trained_worst, leak = 0.0, 0.0, 0, 0.0, 0.0
        segments_seen = 0
        for i in range(args.rows):
            row = {k: torch.as_tensor(v).unsqueeze(0) for k, v in train[i].items()}
            with torch.no_grad():
                whole = forward(model, row, "sdpa", device, autocast)[0].float()
                leaky_row = dict(row, segment_ids=torch.zeros_like(row["segment_ids"]))
                # Leaky control: a causal mask over the whole row ignores sample boundaries.
                leaky = forward(model, leaky_row, "sdpa", device, autocast)[0].float()
                for start, end, alone in samples_of_row(row):
                    single = forward(model, alone, "sdpa", device, autocast)[0].float()
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


def attention(args) -> None:
    device = torch.device("cuda")
    preset = PRESETS[args.model]
    b, s, d = args.micro_batch_size, args.seq_length, preset.kv_channels
    q = torch.randn(b, preset.num_attention_heads, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, preset.num_query_groups, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    one_doc = torch.zeros(b, s, dtype=torch.int32, device=device)
    mask = document_mask(one_doc).block_mask
    flex = lambda: _flex()(q, k, v, block_mask=mask, scale=d ** -0.5, enable_gqa=True)  # noqa: E731
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, scale=d ** -0.5, enable_gqa=True)
    ref = sdpa()
    out = flex()
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"flex (one-document mask) vs SDPA causal, [{b}, {q.shape[1]}/{k.shape[1]} heads, {s}, {d}] bf16: "
          f"relative difference {rel:.2e}")
    grad = torch.randn_like(ref)

    def time_it(fn, n=20):
        for _ in range(3):
            fn().backward(grad)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn().backward(grad)
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0) / n

    print(f"forward+backward: SDPA causal {time_it(sdpa):.2f} ms, flex {time_it(flex):.2f} ms")
    seg = torch.randint(0, 8, (b, s), device=device).sort(dim=-1).values.to(torch.int32)
    document_mask(seg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        document_mask(seg)
    torch.cuda.synchronize()
    print(f"block mask build ({b}×{s}, 8 documents a row): {100 * (time.perf_counter() - t0):.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", choices=["packed", "attention"])
    p.add_argument("--data", default="out/gpu/sft_packed.json")
    p.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    {"packed": packed, "attention": attention}[args.check](args)


if __name__ == "__main__":
    main()
