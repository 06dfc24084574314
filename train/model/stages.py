"""Where this rank's pipeline stage begins (the split itself is the plan's: `plan.pipeline_split`)."""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig

from ..plan import pipeline_split


def layer_offset(config: TransformerConfig) -> int:
    """How many layers the pipeline stages before this rank's hold."""
    split = pipeline_split(config.num_layers, config.pipeline_model_parallel_size,
                           config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage)
    return sum(split[:parallel_state.get_pipeline_model_parallel_rank()])
