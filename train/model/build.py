"""This rank's GPTModel from a `ModelShape` and the run's choices: `model_parts` turns the choices
into the TransformerConfig and the layer spec, `build_model` builds from them."""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from ..plan import RunPlan, pipeline_split
from ..shapes import ModelShape
from .balance import install as install_balance
from .marks import mark_balance_loss
from .spec import block_spec
from .transformer import transformer_config


def model_parts(shape: ModelShape, plan: RunPlan):
    """(TransformerConfig, the decoder's spec) of this rank's stage; the layout's sizes beside the
    tensor-parallel one come from parallel_state."""
    stage_layers = pipeline_split(shape.num_layers, parallel_state.get_pipeline_model_parallel_world_size(),
                                  plan.first_stage_layers, plan.last_stage_layers, shape.name
                                  )[parallel_state.get_pipeline_model_parallel_rank()]
    config = transformer_config(shape, attention=plan.attention, tensor_parallel=plan.tp,
                                pipeline_parallel=parallel_state.get_pipeline_model_parallel_world_size(),
                                expert_parallel=parallel_state.get_expert_model_parallel_world_size(),
                                context_parallel=parallel_state.get_context_parallel_world_size(),
                                sequence_parallel=plan.sequence_parallel, recompute=plan.recompute,
                                recompute_modules=tuple(plan.recompute_modules), initialize=plan.initialize,
                                fuse_swiglu=plan.compile != "none", fp8=plan.fp8, balance=plan.balance,
                                first_stage_layers=plan.first_stage_layers, last_stage_layers=plan.last_stage_layers)
    spec = block_spec(shape, plan.attention, plan.seed, plan.sequence_parallel, bool(plan.fp8), plan.grouped_experts,
                      layers=stage_layers)
    return config, spec


def gpt_model(preset: ModelShape, config: TransformerConfig, spec, max_sequence_length: int | None) -> GPTModel:
    """megatron-core's GPTModel of this pipeline stage: Qwen's RoPE, tied embeddings where it ties them."""
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        vocab_size=preset.vocab_size,
        max_sequence_length=max_sequence_length or preset.max_position_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=preset.rotary_base,
        share_embeddings_and_output_weights=preset.tied_embeddings,
    )


def build_model(shape: ModelShape, plan: RunPlan) -> GPTModel:
    """This rank's GPTModel (its pipeline stage's layers) as `plan` says, on the CPU, float32 (move it
    with `.to(device)`). Needs `parallel_state.initialize_model_parallel` first. Weights come from
    `plan.seed` (the embedding and output layer from torch's generator as it stands, each layer from
    the seed and its number), the same under every layout. The plan was checked when it was made
    (plan.RULES): nothing is refused here."""
    config, spec = model_parts(shape, plan)
    model = gpt_model(shape, config, spec, plan.max_sequence_length)
    if shape.moe and plan.balance == "transformers":
        mark_balance_loss(model, install_balance(model, shape.router_aux_loss_coef))
    if plan.compile == "layers":
        for layer in model.decoder.layers:
            layer.compile()
    return model
