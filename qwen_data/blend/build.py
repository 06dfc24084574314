"""`qwen-data blend`: weighted prefixes → the blend files Megatron-LM reads unchanged.

    qwen-data blend out/web=0.7 out/code=0.3 -o out/pretrain_blend.json
    qwen-data blend out/chat out/tools --by tokens --valid out/chat_val -o out/sft_blend.json
    qwen-data blend out/web out/code --temperature 2 --split 98,2,0 -o out/blend.json

`files` says what the files hold and what is checked before anything is written,
`weights` how the weights are computed and what a budget consumes; the command line and its
summary are `cli`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .files import Blend, BlendError, BlendPaths, megatron_flags, write_blend
from .weights import Budget, BudgetRow, budget_rows, plan_blend


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
    blend = plan_blend(config.train, config.valid, config.test, by=config.by, temperature=config.temperature,
                       ratio_unit=config.ratio_unit, split=config.split, absolute=config.absolute)
    budget = config.budget
    if budget is not None and budget.samples is not None and blend.kind == "pretrain" and not budget.seq_length:
        raise BlendError("a budget in samples or iterations needs --seq-length for pretraining data")
    paths = write_blend(blend, config.output)
    return BlendResult(blend, paths, budget_rows(blend, budget) if budget is not None else None)
