"""The layers of each pipeline stage."""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig


def pipeline_split(num_layers: int, stages: int, first: int | None = None, last: int | None = None,
                   name: str = "the model") -> list[int]:
    """The layers of each pipeline stage: `first` and `last` where given, the rest evenly over the
    other stages (megatron-core's num_layers_in_first/last_pipeline_stage); a ValueError says why not."""
    if stages == 1 and (first, last) != (None, None):
        raise ValueError("--decoder-first/last-pipeline-num-layers size pipeline stages: they need --pp 2 or more")
    given = {stage: n for stage, n in ((0, first), (stages - 1, last)) if n is not None}
    rest, others = num_layers - sum(given.values()), stages - len(given)
    if any(n < 1 for n in given.values()) or rest < others or (rest % others if others else rest):
        asked = " and ".join(f"--decoder-{'first' if stage == 0 else 'last'}-pipeline-num-layers {n}"
                             for stage, n in given.items())
        raise ValueError(f"{name}: {num_layers} layers do not split over --pp {stages} "
                         + (f"with {asked}: every stage needs a layer, and the others an equal share of the rest"
                            if given else "evenly: set --decoder-first/last-pipeline-num-layers"))
    return [given.get(stage, rest // others if others else 0) for stage in range(stages)]


def layer_offset(config: TransformerConfig) -> int:
    """How many layers the pipeline stages before this rank's hold."""
    split = pipeline_split(config.num_layers, config.pipeline_model_parallel_size,
                           config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage)
    return sum(split[:parallel_state.get_pipeline_model_parallel_rank()])
