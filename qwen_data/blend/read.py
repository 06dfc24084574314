"""What the train stage trains on, read once: a blend file `qwen-data blend` wrote (or a Megatron
blend file), a Megatron blend list, a single prefix, or a per-split dict, turned into megatron-core's
blend arguments, with the manifests of every prefix it names, checked to agree.

Plain Python like the rest of the blend code: the train stage hands the result to megatron-core.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

from .files import (SPLITS, BlendError, MegatronBlend, Source, blend_from_list, check_agreement, load_source,
                    read_blend, resolve)

# Megatron-LM's --split default when a blend comes without one.
DEFAULT_SPLIT = "969,30,1"


@dataclass(frozen=True)
class TrainBlend:
    """megatron-core's blend arguments: one distribution `blend` cut by `split`, or `per_split`
    blends (train, valid, test; each None when absent); and the sources they name."""

    blend: MegatronBlend | None
    per_split: list[MegatronBlend | None] | None
    split: str | None  # None with per_split
    sources: list[Source]


def read_train_blend(blend, split: str | None = None) -> TrainBlend:
    """`blend` as megatron-core takes it (see the module docstring); `split` cuts a blend that
    is one distribution (default: the blend's own, else Megatron's)."""
    one, per_split, split, expected = _megatron_arguments(blend, split)
    named = [one] if one is not None else [b for b in per_split if b is not None]
    return TrainBlend(one, per_split, split, _load_sources(named, expected))


def _megatron_arguments(blend, split: str | None):
    """→ (blend, per-split blends, split, expected fingerprints by prefix)."""
    if isinstance(blend, dict):
        if split is not None:
            raise BlendError("a per-split blend cannot also be cut by split")
        return None, [blend_from_list(_as_list(blend.get(n)), f"the {n} blend") for n in SPLITS], None, {}
    if not isinstance(blend, (str, os.PathLike)):
        return blend_from_list([os.fspath(b) for b in blend]), None, split or DEFAULT_SPLIT, {}
    kind, path = resolve(os.fspath(blend))
    if kind == "prefix":
        return ([path], None), None, split or DEFAULT_SPLIT, {}
    record = read_blend(path)
    splits = record.splits
    if record.per_split and split is None:
        return None, [splits[n] for n in SPLITS], None, record.fingerprints
    if splits.get("valid") is not None or splits.get("test") is not None:
        raise BlendError(f"{path}: a blend with separate valid/test prefixes cannot also be cut by split={split!r}")
    if split is not None and record.split not in (None, split):
        warnings.warn(f"{path}: using split {split}, not the blend's {record.split}")
    return splits["train"], None, split or record.split or DEFAULT_SPLIT, record.fingerprints


def _load_sources(blends: list[MegatronBlend], expected: dict[str, str]) -> list[Source]:
    """The manifests of every prefix the blends name, checked to agree; a prefix rewritten since
    the blend file was made (`expected` fingerprints) is warned about."""
    prefixes = list(dict.fromkeys(p for prefixes_, _ in blends for p in prefixes_))
    if not prefixes:
        raise BlendError("the blend names no prefixes")
    sources = [load_source(p) for p in prefixes]
    check_agreement(sources)
    for s in sources:
        if expected.get(s.prefix) not in (None, s.manifest.fingerprint):
            warnings.warn(f"{s.prefix} was rewritten after the blend was made (its weights may be stale): "
                          "re-run `qwen-data blend`")
    return sources


def _as_list(value):
    """Megatron's per-split values may be a whitespace-separated string."""
    return value.split() if isinstance(value, str) else value
