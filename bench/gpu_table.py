"""The table of `bench/gpu.sh speed`: one row per run's --log-json file.

    python3 bench/gpu_table.py bench/results/gpu/speed-*.jsonl
    python3 bench/gpu_table.py --flash      # on a GPU: which SDPA kernels take our attention shapes
    python3 bench/gpu_table.py --against tp1.jsonl tp2.jsonl pp2.jsonl   # layouts against one GPU

Rates are steady state: the log intervals after iteration 10 (iteration 1 compiles, the first
interval warms up), tokens over their summed time. Loss at 1 is iteration 1's; loss at 100 is the
mean of the interval ending at iteration 100 (iterations 91-100). Memory is torch's peak allocated.
"""

from __future__ import annotations

import argparse
import json
import os

WARM = 10  # iterations left out of the rates


def steady_rate(records: list[dict], warm: int = WARM) -> tuple[float | None, float | None]:
    """(tokens/s, MFU) of the log intervals after iteration `warm`, each weighted by its time."""
    seconds = tokens = 0.0
    mfu_per_token, previous = None, 0
    for r in records:
        if previous >= warm:
            elapsed = r["step_ms"] * (r["iteration"] - previous) / 1000
            seconds += elapsed
            tokens += r["tokens_per_s"] * elapsed
            mfu_per_token = r["mfu"] / r["tokens_per_s"] if "mfu" in r else None
        previous = r["iteration"]
    rate = tokens / seconds if seconds else None
    return rate, (rate * mfu_per_token if rate and mfu_per_token else None)


def row(path: str) -> dict:
    with open(path) as f:
        records = [r for r in map(json.loads, f) if "loss" in r]
    steady, seconds, tokens, real = [], 0.0, 0.0, 0.0
    previous = 0
    for r in records:
        steps = r["iteration"] - previous
        if previous >= WARM:
            elapsed = r["step_ms"] * steps / 1000
            seconds += elapsed
            tokens += r["tokens_per_s"] * elapsed
            real += r["real_tokens_per_s"] * elapsed
            steady.append(r)
        previous = r["iteration"]
    at = {r["iteration"]: r["loss"] for r in records}
    rate = tokens / seconds if seconds else float("nan")
    mfu_per_token = steady[-1]["mfu"] / steady[-1]["tokens_per_s"] if steady and "mfu" in steady[-1] else None
    return {
        "run": os.path.basename(path).removeprefix("speed-").removesuffix(".jsonl"),
        "steps": previous,
        "tokens/s": f"{rate / 1e3:.1f}k",
        "real tokens/s": f"{real / seconds / 1e3:.1f}k" if seconds else "-",
        "MFU": f"{100 * rate * mfu_per_token:.1f}%" if mfu_per_token else "-",
        "peak GiB": f"{max(r.get('max_memory_gib', 0) for r in records):.1f}" if records else "-",
        "loss @1": f"{at[1]:.4f}" if 1 in at else "-",
        "loss @100": f"{at[100]:.4f}" if 100 in at else "-",
    }


def table(paths: list[str]) -> str:
    rows = [row(p) for p in paths]
    if not rows:
        return "no runs"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines)


def against(reference: str, paths: list[str]) -> str:
    """Parallel layouts against the one-GPU run of the same seed and data: first loss, the largest
    relative loss difference over the logged iterations, steady tokens/s (all GPUs together)."""
    def losses(path):
        with open(path) as f:
            return {r["iteration"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

    base = losses(reference)
    lines = ["| run | steps | loss @1 | max rel. loss diff vs " + os.path.basename(reference) + " | tokens/s |",
             "|---|---|---|---|---|"]
    for path in [reference] + paths:
        mine = losses(path)
        common = sorted(set(mine) & set(base))
        diff = max((abs(mine[i] - base[i]) / base[i] for i in common), default=float("nan"))
        r = row(path)
        lines.append(f"| {r['run']} | {max(mine, default=0)} | {mine.get(1, float('nan')):.4f} | "
                     f"{100 * diff:.3f}% | {r['tokens/s']} |")
    return "\n".join(lines)


def flash() -> str:
    """Each SDPA backend on the causal GQA shapes of Qwen2.5-0.5B and Qwen3-0.6B at 4096, bf16,
    in the [s, b, heads, dim] → [b, heads, s, dim] permuted layout the core attention passes."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for name, heads, groups, dim in (("qwen2.5-0.5b", 14, 2, 64), ("qwen3-0.6b", 16, 8, 128)):
        q = torch.randn(4096, 4, heads, dim, device="cuda", dtype=torch.bfloat16).permute(1, 2, 0, 3)
        k, v = (torch.randn(4096, 4, groups, dim, device="cuda", dtype=torch.bfloat16).permute(1, 2, 0, 3)
                for _ in range(2))
        for backend in (None, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            label = "default" if backend is None else backend.name
            try:
                run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                with sdpa_kernel(backend) if backend is not None else torch.autocast("cuda", enabled=False):
                    run()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        run()
                    end.record()
                    torch.cuda.synchronize()
                out.append(f"{name} {label}: {start.elapsed_time(end) / 10:.2f} ms")
            except RuntimeError as e:
                out.append(f"{name} {label}: refused ({str(e).splitlines()[0][:100]})")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="*")
    p.add_argument("--flash", action="store_true")
    p.add_argument("--against", default=None, metavar="LOG", help="compare the logs' losses with this run's")
    args = p.parse_args()
    print(flash() if args.flash else against(args.against, args.logs) if args.against else table(args.logs))


if __name__ == "__main__":
    main()
