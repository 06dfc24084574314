"""The table of `bench/gpu.sh speed`: one row per run's --log-json file.

    python3 bench/gpu_table.py bench/results/gpu/speed-*.jsonl
    python3 bench/gpu_table.py --flash      # on a GPU: which SDPA kernels take our attention shapes
    python3 bench/gpu_table.py --against tp1.jsonl tp2.jsonl pp2.jsonl   # layouts against one GPU

Rates are steady state: the log intervals after iteration 10 (iteration 1 compiles, the first
interval warms up), tokens over their summed time; MFU in the trainer's two counts (mfu_causal:
Megatron's, mfu_full: whole score matrices; train/metrics.py), each interval's weighted by its time.
Loss at 1 is iteration 1's; loss at 100 is the mean of the interval ending at iteration 100
(iterations 91-100). Memory is torch's peak allocated. The machine is the log's summary line's
(logs written before the trainer recorded it: "-").
"""

from __future__ import annotations

import argparse
import json
import os

WARM = 10  # iterations left out of the rates
MFU = ("mfu_causal", "mfu_full")
# The machine a run's summary names (train/metrics.py `machine` and `clock_report`: the SM clock, power
# draw and what held the clock down over the steps) and the share of a step its GPU's kernels ran
# (`Metrics.measure`: GPU-bound or launch-bound); CARD: the columns reports show of it
MACHINE = ("gpu_name", "gpu_uuid", "power_limit_w", "sm_clock_mhz", "max_sm_clock_mhz", "power_draw_w",
           "power_capped_share", "slowdown_share", "gpu_busy_share", "mem_clock_mhz", "temperature_c", "cpu_model")
CARD = MACHINE[1:]


def steady(records: list[dict], warm: int = WARM) -> dict:
    """tokens_per_s, real_tokens_per_s and each MFU of the log intervals after iteration `warm`,
    each interval weighted by its time; None where there are none, or the records lack the field."""
    fields = ("tokens_per_s", "real_tokens_per_s") + MFU
    seconds, sums, previous = 0.0, dict.fromkeys(fields, 0.0), 0
    for r in records:
        if previous >= warm:
            elapsed = r["step_ms"] * (r["iteration"] - previous) / 1000
            seconds += elapsed
            for k in fields:
                sums[k] = sums[k] + r[k] * elapsed if sums[k] is not None and k in r else None
        previous = r["iteration"]
    return {k: v / seconds if seconds and v is not None else None for k, v in sums.items()}


INTERVAL = ("iteration", "loss", "step_ms", "tokens_per_s")  # what every log interval holds


class LogError(ValueError):
    """A file that is not a train run's --log-json."""


def read_log(path: str) -> tuple[list[dict], dict]:
    """(the interval records, the summary line or {}) of a --log-json file."""
    intervals, summary = [], {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogError(f"{path}:{number}: not JSON ({e})") from None
            if not isinstance(entry, dict) or not ({"summary", "loss", "valid_loss"} & entry.keys()):
                raise LogError(f"{path}:{number}: not a line of the trainer's --log-json")
            if entry.get("summary"):
                summary = entry
            elif "loss" in entry:
                lacking = [k for k in INTERVAL if not isinstance(entry.get(k), (int, float))]
                if lacking:
                    raise LogError(f"{path}:{number}: a log interval without {', '.join(lacking)}")
                intervals.append(entry)
    return intervals, summary


def read(path: str) -> tuple[list[dict], dict]:
    """(the interval records, the machine of the summary line: None for each field it lacks) of a log."""
    intervals, summary = read_log(path)
    return intervals, {k: summary.get(k) for k in MACHINE}


def percent(value: float | None) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def row(path: str) -> dict:
    records, where = read(path)
    rates = steady(records)
    at = {r["iteration"]: r["loss"] for r in records}
    return {
        "run": os.path.basename(path).removeprefix("speed-").removesuffix(".jsonl"),
        "steps": records[-1]["iteration"] if records else 0,
        "tokens/s": f"{rates['tokens_per_s'] / 1e3:.1f}k" if rates["tokens_per_s"] else "-",
        "real tokens/s": f"{rates['real_tokens_per_s'] / 1e3:.1f}k" if rates["real_tokens_per_s"] else "-",
        "MFU (causal)": percent(rates["mfu_causal"]),
        "MFU (full)": percent(rates["mfu_full"]),
        "peak GiB": f"{max(r.get('max_memory_gib', 0) for r in records):.1f}" if records else "-",
        "loss @1": f"{at[1]:.4f}" if 1 in at else "-",
        "loss @100": f"{at[100]:.4f}" if 100 in at else "-",
        **{k: "-" if v is None else v for k, v in where.items()},
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
