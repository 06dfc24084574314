"""`qwen-data stats`: what a prefix or a blend holds, in numbers.

A prefix: documents (rows), samples, tokens (padding apart), the trained share, sample lengths
(percentiles and a histogram, read from the data), packing fill, rejects by reason. Counts come
from the manifest, which `verify` proves against the files; lengths from the index and the data,
streamed into a count of samples by length (`LengthCounts`): memory stays flat however many
samples there are, and percentiles and histogram are exact.
A blend (any file `qwen-data blend` writes, or a Megatron blend file): each train source's weight,
the shares of training tokens and of trained tokens its weight draws against the share the blend
asked for (in its `--ratio-unit`, from our sidecar), and its own numbers; with a budget, the tokens
and epochs of each source it consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..blend.files import BlendError, Source, read_blend, resolve
from ..blend.weights import Budget, BudgetRow, blend_of_record, budget_rows
from .samples import Samples

PERCENTILES = (0, 10, 50, 90, 99, 100)
BINS = 20
DENSE = 1 << 20  # lengths below are counted in an array (8 MB); the few longer ones (at most tokens / DENSE) by value
BAR = 40  # characters of the longest histogram bar


@dataclass
class PrefixStats:
    prefix: str
    kind: str
    layout: str | None
    template: str | None
    documents: int
    samples: int
    tokens: int  # data tokens: padding and pai's labels apart
    trained: int
    pad_tokens: int
    rows: int | None  # packed rows
    seq_length: int | None
    fill: float | None
    percentiles: dict[int, int]
    mean_length: float
    histogram: tuple[np.ndarray, np.ndarray]  # counts, bin edges
    rejects: dict = field(default_factory=dict)  # {"count", "by_reason"}

    @property
    def trained_share(self) -> float:
        return self.trained / self.tokens if self.tokens else 0.0


def prefix_stats(path: str) -> PrefixStats:
    samples = Samples(prefix_of(path))
    m = samples.manifest
    s = m.sft  # None for pretraining
    tokens = Source(samples.prefix, m).real_tokens
    lengths = LengthCounts()
    for chunk in samples.length_chunks():
        lengths.add(chunk)
    values, counts = lengths.table()
    top = max((s and s.seq_length) or 0, int(values[-1]) if len(values) else 1)
    return PrefixStats(
        prefix=samples.prefix, kind=m.kind, layout=s and s.layout, template=s and s.template, documents=m.documents,
        samples=lengths.samples, tokens=tokens, trained=s.trained_tokens if s else tokens,
        pad_tokens=(s and s.pad_tokens) or 0, rows=s and s.rows, seq_length=s and s.seq_length, fill=s and s.fill,
        percentiles=dict(zip(PERCENTILES, lengths.percentiles(PERCENTILES))) if lengths.samples else {},
        mean_length=lengths.tokens / lengths.samples if lengths.samples else 0.0,
        histogram=lengths.histogram(top), rejects=m.rejects)


def prefix_of(path: str) -> str:
    """The prefix `path` names (`blend.files.resolve`); a ValueError saying what to give when it names none."""
    kind, prefix = resolve(path)
    if kind != "prefix":
        raise ValueError(f"{path}: a blend file, not a prefix: name one of its prefixes")
    return prefix


class LengthCounts:
    """How many samples have each length, counted a chunk of lengths at a time."""

    def __init__(self) -> None:
        self.dense = np.zeros(DENSE, np.int64)
        self.long: dict[int, int] = {}  # length ≥ DENSE → samples

    def add(self, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, np.int64)
        self.dense += np.bincount(lengths[lengths < DENSE], minlength=DENSE)
        for value, count in zip(*np.unique(lengths[lengths >= DENSE], return_counts=True)):
            self.long[int(value)] = self.long.get(int(value), 0) + int(count)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(each length that occurs, ascending; how many samples have it)."""
        values = np.concatenate([np.flatnonzero(self.dense), np.array(sorted(self.long), np.int64)])
        counts = np.concatenate([self.dense[values[values < DENSE]], [self.long[v] for v in sorted(self.long)]])
        return values, counts.astype(np.int64)

    @property
    def samples(self) -> int:
        return int(self.dense.sum()) + sum(self.long.values())

    @property
    def tokens(self) -> int:
        values, counts = self.table()
        return int(values @ counts)

    def percentiles(self, percents) -> list[int]:
        """numpy's `percentile(lengths, percents, method="inverted_cdf")`: for each q, the length of
        rank ceil(n·q) (at least 1) in ascending order, n·q computed in floats as numpy does."""
        values, counts = self.table()
        ranks = np.maximum(np.ceil(self.samples * np.true_divide(percents, 100)), 1)
        return [int(v) for v in values[np.searchsorted(np.cumsum(counts), ranks)]]

    def histogram(self, top: int) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) over BINS bins of a whole number of tokens each, from 0 past `top`."""
        width = max(1, -(-top // BINS))
        values, counts = self.table()
        binned = np.bincount(values // width, weights=counts, minlength=BINS).round().astype(np.int64)
        return binned, np.arange(len(binned) + 1) * width


@dataclass
class BlendStats:
    path: str
    split: str | None
    sources: list[tuple[float, float, PrefixStats]]  # (Megatron weight, token share, stats) per train source
    other_splits: dict[str, list[str]]  # valid/test prefixes
    budget: list[BudgetRow] | None
    trained_shares: list[float] = field(default_factory=list)  # the share of trained tokens each weight draws
    ratio_unit: str | None = None  # what the blend's ratios were shares of (None: no sidecar says)
    asked: list[float | None] = field(default_factory=list)  # each source's share of ratio_unit asked for


def blend_stats(path: str, budget: Budget | None = None) -> BlendStats:
    record = read_blend(path)
    try:
        blend = blend_of_record(record)
    except BlendError as exc:
        raise BlendError(f"{path}: not a blend of qwen-data prefixes: {exc}") from None
    rows = budget_rows(blend, budget) if budget is not None else None
    train = blend.splits["train"]
    return BlendStats(path, record.split, [(e.weight, e.share, prefix_stats(e.source.prefix)) for e in train],
                      {name: record.splits[name][0] for name in ("valid", "test") if record.splits.get(name)}, rows,
                      trained_shares=blend.drawn_shares("train", "trained-tokens"), ratio_unit=record.ratio_unit,
                      asked=[record.asked.get(e.source.prefix) for e in train])


def is_blend(path: str) -> bool:
    """A blend file (NAME.json of `qwen-data blend`, NAME.txt, NAME.qwen-data.json), not a prefix; a
    ValueError for what is neither (`blend.files.resolve`)."""
    return resolve(path)[0] == "blend"


# ---------------------------------------------------------------------------------------------
# Text


def prefix_lines(s: PrefixStats) -> list[str]:
    what = s.kind if s.kind == "pretrain" else f"sft, template {s.template}, {s.layout} layout"
    lines = [f"{s.prefix}: {what}",
             f"  documents {s.documents:,}   samples {s.samples:,}   tokens {s.tokens:,}   "
             f"trained {s.trained:,} ({s.trained_share:.1%})"]
    if s.rows is not None:
        lines.append(f"  packed: {s.rows:,} rows of {s.seq_length}, fill {s.fill:.2%}, {s.pad_tokens:,} pad tokens")
    if s.percentiles:
        lines.append("  sample length: " + "  ".join(f"p{p} {v:,}" for p, v in s.percentiles.items())
                     + f"  mean {s.mean_length:,.1f}")
        lines += ["  " + line for line in histogram_lines(*s.histogram)]
    reasons = s.rejects.get("by_reason") or {}
    lines.append(f"  rejects: {s.rejects.get('count', 0):,}" + (
        " (" + ", ".join(f"{reason} {n:,}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])) + ")"
        if reasons else ""))
    return lines


def histogram_lines(counts: np.ndarray, edges: np.ndarray) -> list[str]:
    """One line per bin that has samples: its length range, count and a bar."""
    peak = max(int(counts.max()), 1)
    lines = []
    for count, low, high in zip(counts, edges[:-1], edges[1:]):
        if count:
            bar = "█" * max(1, round(BAR * count / peak))
            lines.append(f"{int(low):>8,} – {int(high) - 1:<8,}{int(count):>10,}  {bar}")
    return lines


def blend_lines(b: BlendStats) -> list[str]:
    lines = [f"{b.path}: blend of {len(b.sources)} train source(s)" + (f", split {b.split}" if b.split else "")
             + (f", asked in shares of {b.ratio_unit}" if b.ratio_unit else "")]
    width = max(len(s.prefix) for _, _, s in b.sources)
    # tokens% and trained%: what the weights draw; asked: the blend's own share, in its ratio unit.
    lines.append(f"  {'source':<{width}}  {'weight':>8}  {'asked':>8}  {'tokens%':>8}  {'trained%':>8}  {'tokens':>14}  "
                 f"{'samples':>11}  trained")
    for (weight, share, s), trained, asked in zip(b.sources, b.trained_shares, b.asked):
        lines.append(f"  {s.prefix:<{width}}  {weight:>8.4g}  {'-' if asked is None else f'{asked:.2%}':>8}  "
                     f"{share:>8.2%}  {trained:>8.2%}  {s.tokens:>14,}  {s.samples:>11,}  {s.trained_share:.1%}")
    for name, prefixes in b.other_splits.items():
        lines.append(f"  {name}: {' '.join(prefixes)}")
    if b.budget:
        lines.append("  budget:")
        for r in b.budget:
            lines.append(f"    {r.prefix:<{width}}  {r.tokens:>16,.0f} tokens  {r.epochs:.3f} epochs"
                         + ("  (repeated)" if r.epochs > 1 else ""))
    for _, _, s in b.sources:
        lines += [""] + prefix_lines(s)
    return lines


# ---------------------------------------------------------------------------------------------
# Plot


def histogram_png(stats: list[PrefixStats], path_or_file) -> None:
    """Sample lengths of each prefix as a PNG (one panel each), by matplotlib without a display."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(len(stats), 1, figsize=(7, 2.4 * len(stats)), squeeze=False)
    for ax, s in zip(axes[:, 0], stats):
        counts, edges = s.histogram
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#3a7d44", edgecolor="white")
        if s.seq_length:
            ax.axvline(s.seq_length, color="#b03030", linestyle="--", linewidth=1, label=f"seq length {s.seq_length}")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_title(f"{s.prefix}: {s.samples:,} samples", fontsize=9)
        ax.set_xlabel("tokens per sample" if s.kind == "sft" else "tokens per document", fontsize=8)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path_or_file, format="png", dpi=90)
    plt.close(fig)
