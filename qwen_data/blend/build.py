"""`qwen-data blend`: weighted prefixes → the blend files Megatron-LM reads unchanged.

    qwen-data blend out/web=0.7 out/code=0.3 -o out/pretrain_blend.json
    qwen-data blend out/chat out/tools --by tokens --valid out/chat_val -o out/sft_blend.json
    qwen-data blend out/web out/code --temperature 2 --split 98,2,0 -o out/blend.json

`files` says what the files hold and what is checked before anything is written (and
`formats.claims` which files a blend may write: never a source's, nor a file not its own),
`weights` how the weights are computed and what a budget consumes; the command line and its
summary are `cli`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..formats.claims import blend_owner
from ..formats.claims import check as check_outputs
from ..formats.layouts import layout_of
from .files import BLEND_FORMAT, Blend, BlendError, BlendPaths, megatron_flags, output_paths, write_blend
from .weights import Budget, BudgetRow, budget_rows, weighed_blend


@dataclass
class BlendConfig:
    """What to blend (`PREFIX[=W]` texts per split), how to weigh it, where to write it."""

    train: list[str]
    valid: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    output: str = "out/blend.json"
    by: str | None = None
    temperature: float | None = None
    ratio_unit: str = "tokens"
    split: str | None = None
    absolute: bool = False
    budget: Budget | None = None


@dataclass
class BlendResult:
    blend: Blend
    paths: BlendPaths
    budget: list[BudgetRow] | None = None  # per train source, when the config has a budget

    @property
    def written(self) -> list[str]:
        """The files written, sorted (no per-split file for a blend cut by a split)."""
        per_split = [self.paths.per_split] if self.blend.split is None else []
        return sorted([self.paths.data_args, self.paths.sidecar] + per_split)

    @property
    def megatron_args(self) -> list[str]:
        return megatron_flags(self.blend, self.paths)


def make_blend(config: BlendConfig) -> BlendResult:
    """Check and weigh the sources, write the blend files, and cost the budget if one is given."""
    blend = weighed_blend(config.train, config.valid, config.test, by=config.by, temperature=config.temperature,
                          ratio_unit=config.ratio_unit, split=config.split, absolute=config.absolute)
    budget = config.budget
    if budget is not None and budget.samples is not None and blend.kind == "pretrain" and not budget.seq_length:
        raise BlendError("a budget in samples or iterations needs --seq-length for pretraining data")
    paths = output_paths(config.output)
    check_outputs([paths.per_split, paths.data_args, paths.sidecar], _source_files(blend),
                  blend_owner(paths.sidecar, BLEND_FORMAT), remedy="give the blend another name (-o)")
    write_blend(blend, config.output)
    return BlendResult(blend, paths, budget_rows(blend, budget) if budget is not None else None)


def _source_files(blend: Blend) -> list[str]:
    """Every file of every source the blend reads: none may be one the blend writes."""
    files = []
    for source in blend.sources:
        channels = layout_of(source.manifest).channels(source.prefix, source.manifest.dtype)
        files += [name + ext for name, _ in channels for ext in (".bin", ".idx")] + [source.prefix + ".json"]
    return files
