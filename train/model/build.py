"""This rank's GPTModel from the run's plan (its shape and choices): `model_parts` turns the plan into
the TransformerConfig and the layer spec, `build_model` builds from them. Sizes come from the plan;
megatron-core's parallel_state says only which pipeline stage this rank is."""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from ..marks import mark_balance_loss, mark_layer_offset
from ..plan import RunPlan
from ..shapes import ModelShape
from .balance import install as install_balance
from .spec import block_spec
from .transformer import transformer_config


def model_parts(plan: RunPlan):
    """(TransformerConfig, the decoder's spec) of this rank's pipeline stage."""
    return transformer_config(plan), block_spec(plan, parallel_state.get_pipeline_model_parallel_rank())


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


def build_model(plan: RunPlan) -> GPTModel:
    """This rank's GPTModel (its pipeline stage's layers) as `plan` says, on the CPU, float32 (move it
    with `.to(device)`). Needs `parallel_state.initialize_model_parallel` first, with the plan's sizes.
    Weights come from `plan.seed` (the embedding and output layer from torch's generator as it stands,
    each layer from the seed and its number), the same under every layout. The plan was checked when
    it was made (plan.RULES): nothing is refused here."""
    shape, stage = plan.shape, parallel_state.get_pipeline_model_parallel_rank()
    config, spec = model_parts(plan)
    model = gpt_model(shape, config, spec, plan.max_sequence_length)
    mark_layer_offset(model, plan.layer_offset(stage))
    if shape.moe and plan.balance == "transformers":
        mark_balance_loss(model, install_balance(model, shape.router_aux_loss_coef))
    if plan.residual_bf16 and model.pre_process:
        model.embedding.register_forward_hook(in_autocast_dtype)
    if plan.compile == "layers":
        for layer in model.decoder.layers:
            layer.compile()
    return model


def in_autocast_dtype(module, args, output: torch.Tensor) -> torch.Tensor:
    """The embedding's output in autocast's dtype (a forward hook): the residual stream starts there."""
    device = output.device.type
    return output.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else output
