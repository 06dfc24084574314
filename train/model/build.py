"""This rank's GPTModel from a `ModelShape` and the run's choices: `model_parts` turns the choices
into the TransformerConfig and the layer spec, `build_model` checks them and builds."""

from __future__ import annotations

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from ..config import COMPILE_CHOICES
from ..shapes import ModelShape
from .balance import install as install_balance
from .marks import mark_balance_loss
from .resolve import resolve_attention
from .spec import block_spec
from .stages import pipeline_split
from .transformer import transformer_config


def check_choices(preset: ModelShape, *, tensor_parallel: int, sequence_parallel: bool, compile: str,
                  balance: str) -> None:
    """A ValueError for choices that cannot build `preset` in this process's layout."""
    if preset.moe and balance == "transformers" and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("the transformers load-balancing loss needs every layer's routing in one stage: "
                         "under --pp take --moe-balance-loss per-layer")
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {COMPILE_CHOICES}, not {compile!r}")
    if sequence_parallel and tensor_parallel == 1:
        raise ValueError("--sequence-parallel splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more")


def model_parts(preset: ModelShape, *, attention: str, tensor_parallel: int, sequence_parallel: bool,
                recompute: str | None, recompute_modules: tuple[str, ...], initialize: bool, compile: str,
                seed: int, fp8: str | None, grouped_experts: bool, balance: str,
                first_stage_layers: int | None, last_stage_layers: int | None):
    """(TransformerConfig, the decoder's spec) of this rank's stage, `attention` resolved; the
    layout's other sizes come from parallel_state."""
    stage_layers = pipeline_split(preset.num_layers, parallel_state.get_pipeline_model_parallel_world_size(),
                                  first_stage_layers, last_stage_layers, preset.name
                                  )[parallel_state.get_pipeline_model_parallel_rank()]
    config = transformer_config(preset, attention=attention, tensor_parallel=tensor_parallel,
                                pipeline_parallel=parallel_state.get_pipeline_model_parallel_world_size(),
                                expert_parallel=parallel_state.get_expert_model_parallel_world_size(),
                                context_parallel=parallel_state.get_context_parallel_world_size(),
                                sequence_parallel=sequence_parallel, recompute=recompute,
                                recompute_modules=tuple(recompute_modules), initialize=initialize,
                                fuse_swiglu=compile != "none", fp8=fp8, balance=balance,
                                first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    spec = block_spec(preset, attention, seed, sequence_parallel, bool(fp8), grouped_experts, layers=stage_layers)
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


def build_model(preset: ModelShape, *, attention: str = "auto", tensor_parallel: int = 1,
                sequence_parallel: bool = False, recompute: str | None = None,
                recompute_modules: tuple[str, ...] = ("mlp",), max_sequence_length: int | None = None,
                initialize: bool = True, compile: str = "none",
                seed: int = 0, fp8: str | None = None, grouped_experts: bool = True,
                balance: str = "transformers", first_stage_layers: int | None = None,
                last_stage_layers: int | None = None) -> GPTModel:
    """This rank's GPTModel (its pipeline stage's layers), on the CPU, float32 (move it with `.to(device)`).

    Needs `parallel_state.initialize_model_parallel(tensor_parallel, pipeline_parallel)` first.
    `compile`: one of COMPILE_CHOICES (torch.compile needs a compiler toolchain; the trainer uses
    it on CUDA only). Weights come from `seed` (the embedding and output layer from torch's
    generator as it stands, each layer from `seed` and its number), the same under every layout.
    `balance`: a mixture of experts' load-balancing loss (config.BALANCE_LOSSES; "transformers" needs all
    layers in one stage). `first_stage_layers`, `last_stage_layers`: see `pipeline_split`.
    """
    attention, _ = resolve_attention(attention)
    check_choices(preset, tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel, compile=compile,
                  balance=balance)
    config, spec = model_parts(
        preset, attention=attention, tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
        recompute=recompute, recompute_modules=recompute_modules, initialize=initialize, compile=compile,
        seed=seed, fp8=fp8, grouped_experts=grouped_experts, balance=balance,
        first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    model = gpt_model(preset, config, spec, max_sequence_length)
    if preset.moe and balance == "transformers":
        mark_balance_loss(model, install_balance(model, preset.router_aux_loss_coef))
    if compile == "layers":
        for layer in model.decoder.layers:
            layer.compile()
    return model
