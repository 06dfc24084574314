"""Blend weights: prefixes given as `PREFIX[=W]` → a `Blend` whose entries carry token shares and
Megatron's sample weights; and what a training budget consumes of each source.

Weights. `P=w` gives ratios (`--by ratio`, the default when weights are given); `--by tokens`
(the default without weights) weighs each source by its token count from the manifest, so every
source is consumed at the same rate; `--temperature T` weighs by tokens**(1/T) (T=1 is
`--by tokens`, larger T flattens the mix towards uniform). Ratios mean shares of training *tokens*.
Megatron's weights mean shares of *samples*: for pretraining (every sample is seq-length tokens)
the two are the same; for SFT (one sample = one conversation or packed row) each weight is
divided by the source's mean real tokens per sample, so a 0.7 share of tokens stays 0.7 whatever
the sources' conversation lengths. `--ratio-unit trained-tokens` makes ratios shares of *trained*
tokens (loss mask 1, the SFT manifest's `trained_tokens`): each weight is divided by the source's
mean trained tokens per sample instead, so sources whose prompts take different parts of their
samples still give the loss the asked shares (`--by tokens`/`--temperature` then weigh by trained
token counts); pretraining trains every token, so there it is `tokens`. `--ratio-unit samples`
writes ratios as sample weights unchanged.

Budget: `--train-tokens N`, `--train-samples N --seq-length S`, or `--train-iters I
--global-batch-size B --seq-length S` gives how many samples, tokens and epochs of each train
source the run consumes.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

from ..formats.manifest import strip_suffix
from .files import (RATIO_UNITS, SPLITS, Blend, BlendError, BlendRecord, Entry, Source, check_agreement, drawn_shares,
                    load_source)


def parse_spec(text: str) -> tuple[str, float | None]:
    """`PREFIX=W` or `PREFIX` → (prefix, weight or None)."""
    prefix, sep, weight = text.rpartition("=")
    if sep:
        try:
            value = float(weight)
        except ValueError:
            return text, None
        if not (value > 0 and math.isfinite(value)):
            raise BlendError(f"{text}: a weight must be a positive number below {sys.float_info.max:.3g}")
        return prefix, value
    return text, None


def unit_shares(sources: list[Source], by: str, temperature: float | None, ratio_unit: str = "tokens") -> list[float]:
    """Each source's share of `ratio_unit` (sums to 1): its ratio, or its count of that unit (`Source.count`).
    Scaled by the largest first, so that no weight or temperature overflows: a share too small for a
    float comes out 0 (see `_weigh`)."""
    if by == "ratio":
        top = max(s.ratio for s in sources)
        raw = [s.ratio / top for s in sources]
    else:
        exponent = 1.0 / (temperature or 1.0)
        top = max(s.count(ratio_unit) for s in sources)
        raw = [(s.count(ratio_unit) / top) ** exponent for s in sources]
    total = sum(raw)
    return [r / total for r in raw]


def megatron_weights(sources: list[Source], shares: list[float], ratio_unit: str = "tokens") -> list[float]:
    """Sample weights (what Megatron's blend weights mean) for shares of `ratio_unit`, normalised
    (`files.drawn_shares` backwards)."""
    if ratio_unit == "samples" or sources[0].kind == "pretrain":
        raw = list(shares)  # pretraining samples are all seq-length tokens, all trained: tokens ∝ samples
    else:
        raw = [share / s.per_sample(ratio_unit) for s, share in zip(sources, shares)]
    total = sum(raw)
    # 12 digits: what the blend files carry, so our record and Megatron's reading agree exactly.
    return [float(f"{r / total:.12g}") for r in raw]


# One part of a split as Megatron reads it whole: it takes every run of digits and dots in the string
# as a number, so "98,-2,0" or "1e3,1" would be read as other numbers than they say.
SPLIT_PART = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")


def parse_split(split: str) -> list[float]:
    """Megatron's `--split` reading: up to 3 comma-separated non-negative numbers, padded to 3, normalised."""
    parts = [part.strip() for part in split.split(",")]  # Megatron skips spaces too
    if len(parts) > 3 or not all(SPLIT_PART.fullmatch(part) for part in parts):
        raise BlendError(f"--split {split!r}: expected up to 3 non-negative numbers separated by commas, like 98,2,0 "
                         "(Megatron reads only digits and dots, so signs, exponents and other characters would "
                         "change the numbers it sees)")
    values = [float(part) for part in parts] + [0.0] * (3 - len(parts))
    total = sum(values)
    if not math.isfinite(total):
        raise BlendError(f"--split {split!r}: numbers too large; give shares like 98,2,0")
    if values[0] <= 0:
        raise BlendError(f"--split {split!r}: the train part must be positive")
    return [v / total for v in values]


# ---------------------------------------------------------------------------------------------
# Planning a blend


def weighed_blend(
    train: list[str],
    valid: list[str] = (),
    test: list[str] = (),
    *,
    by: str | None = None,
    temperature: float | None = None,
    ratio_unit: str = "tokens",
    split: str | None = None,
    absolute: bool = False,
) -> Blend:
    """Read and check every source, then weigh each split."""
    by = _weighting_asked(train, valid, test, by, temperature, split, ratio_unit)
    specs = {name: [parse_spec(text) for text in texts] for name, texts in zip(SPLITS, (train, valid, test))}
    chosen: dict[str, tuple[str, list[Source]]] = {}
    for name, items in specs.items():
        if items:
            split_by, items = _split_weighting(name, items, by)
            chosen[name] = split_by, _load_split(name, items, absolute)
    everything = [s for _, sources in chosen.values() for s in sources]
    check_agreement(everything)  # before weighing: SFT and pretraining weights differ in meaning
    splits = {name: _weigh(name, sources, split_by, temperature, ratio_unit)
              for name, (split_by, sources) in chosen.items()}
    train_by = by or ("ratio" if any(w is not None for _, w in specs["train"]) else "tokens")
    return Blend(splits, train_by, temperature, ratio_unit, split, everything)


def blend_of_record(record: BlendRecord) -> Blend:
    """The train split a blend file describes, weighed: its sources read and checked, each Megatron
    (sample) weight turned back into its share of training tokens (`drawn_shares`)."""
    prefixes, weights = record.splits["train"]
    sources = [load_source(p) for p in prefixes]
    check_agreement(sources)
    weights = weights or [1.0] * len(sources)
    weights = [w / sum(weights) for w in weights]
    entries = [Entry(s, t, w) for s, t, w in zip(sources, drawn_shares(sources, weights, "tokens"), weights)]
    return Blend({"train": entries}, "ratio", None, "tokens", record.split, sources)


def _weighting_asked(train, valid, test, by: str | None, temperature: float | None, split: str | None,
                     ratio_unit: str) -> str | None:
    """Refuse options that contradict each other; → the weighting asked for, if any."""
    if not train:
        raise BlendError("no train prefixes given")
    if ratio_unit not in RATIO_UNITS:
        raise BlendError(f"ratio unit {ratio_unit!r}: expected one of {', '.join(RATIO_UNITS)}")
    if split is not None and (valid or test):
        raise BlendError("--split and --valid/--test exclude each other (as in Megatron-LM): "
                         "either cut every prefix by --split, or name separate validation prefixes")
    if split is not None:
        parse_split(split)
    if temperature is None:
        return by
    check_temperature(temperature)
    if by == "ratio":
        raise BlendError("--temperature weighs by token counts; it cannot be used with --by ratio")
    return "tokens"


def check_temperature(temperature: float) -> float:
    """A weighing temperature: a finite number above 0 (BlendError otherwise)."""
    if not (temperature > 0 and math.isfinite(temperature)):
        raise BlendError(f"--temperature {temperature}: must be a positive number below {sys.float_info.max:.3g}")
    return temperature


def _split_weighting(name: str, items: list, by: str | None) -> tuple[str, list]:
    """How one split is weighed ("ratio" or "tokens"), and its (prefix, ratio) items."""
    if len(items) == 1:  # a lone prefix takes the whole split, whatever the weighting
        return "tokens", [(items[0][0], None)]
    given = [w is not None for _, w in items]
    if any(given) and by == "tokens":
        raise BlendError(f"{name}: weights (PREFIX=W) and --by tokens/--temperature exclude each other")
    # Validation/test prefixes without weights mirror their natural (token) mix.
    split_by = "ratio" if any(given) or (by == "ratio" and name == "train") else "tokens"
    if split_by == "ratio" and not all(given):
        missing = [p for p, w in items if w is None]
        raise BlendError(f"{name}: --by ratio needs a weight for every prefix (PREFIX=W); "
                         f"none for {', '.join(missing)}")
    return split_by, items


def _load_split(name: str, items: list, absolute: bool) -> list[Source]:
    sources = []
    for prefix, ratio in items:
        prefix = strip_suffix(prefix)
        source = load_source(prefix, ratio)
        if absolute:
            source.prefix = os.path.abspath(prefix)
        sources.append(source)
    seen = [s.prefix for s in sources]
    duplicates = sorted({p for p in seen if seen.count(p) > 1})
    if duplicates:
        raise BlendError(f"{name}: prefix given twice: {', '.join(duplicates)}")
    return sources


def _weigh(name: str, sources: list[Source], by: str, temperature: float | None, ratio_unit: str) -> list[Entry]:
    """Every source of a split with its share and weight; refused when a weight would be 0 or lose
    precision (below the smallest normal float64): Megatron would never, or wrongly, draw from it."""
    if ratio_unit == "trained-tokens":
        for s in sources:
            if s.trained_tokens <= 0:
                raise BlendError(f"{name}: {s.prefix}: its manifest counts no trained tokens (loss mask 1), so no "
                                 "share of trained tokens can be drawn from it: leave it out, or blend by --ratio-unit "
                                 "tokens")
    shares = unit_shares(sources, by, temperature, ratio_unit)
    weights = megatron_weights(sources, shares, ratio_unit)
    for s, weight in zip(sources, weights):
        if weight < sys.float_info.min:
            cause = (f"{s.prefix}={s.ratio:g} beside a weight of {max(x.ratio for x in sources):g}" if by == "ratio"
                     else f"--temperature {temperature:g}")
            raise BlendError(f"{name}: {cause} gives {s.prefix} a Megatron weight of {weight:.3g}, below "
                             f"{sys.float_info.min:.3g}, the smallest a float64 holds exactly: raise "
                             + ("its weight" if by == "ratio" else "the temperature") + " or leave it out")
    return [Entry(s, share, weight) for s, share, weight in zip(sources, shares, weights)]


# ---------------------------------------------------------------------------------------------
# Budget


@dataclass
class Budget:
    """What the run consumes: either data tokens in total, or samples (× seq length)."""

    tokens: int | None = None
    samples: int | None = None
    seq_length: int | None = None


@dataclass
class BudgetRow:
    """What the run takes of one train source, and how many epochs of it that is."""

    prefix: str
    weight: float
    share: float
    available_tokens: float
    samples: float | None
    tokens: float
    epochs: float


def budget_rows(blend: Blend, budget: Budget) -> list[BudgetRow]:
    """Per train source: samples and tokens the run takes, and how many epochs that is."""
    fraction = parse_split(blend.split)[0] if blend.split else 1.0
    rows = []
    for e, token_share in zip(blend.splits["train"], blend.drawn_shares("train", "tokens")):
        s = e.source
        available_tokens = s.real_tokens * fraction
        available_samples = s.documents * fraction
        if budget.tokens is not None:
            tokens = budget.tokens * token_share
            per_sample = s.tokens_per_sample or budget.seq_length
            samples = tokens / per_sample if per_sample else None
        else:
            samples = budget.samples * e.weight
            tokens = samples * (s.tokens_per_sample or budget.seq_length)
        epochs = samples / available_samples if s.kind == "sft" else tokens / available_tokens
        rows.append(BudgetRow(s.prefix, e.weight, token_share, available_tokens, samples, tokens, epochs))
    return rows


# -- argparse types (the CLI and the train stage import them where a split or temperature is given) --
def split_argument(text: str) -> str:
    """Megatron's --split, checked by `parse_split`'s rules while the command line is read."""
    import argparse

    try:
        parse_split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def temperature_argument(text: str) -> float:
    """A blend's --temperature, checked by `check_temperature` while the command line is read."""
    import argparse

    try:
        return check_temperature(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc) if "temperature" in str(exc) else f"{text!r} is not a number") from None
