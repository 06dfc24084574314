"""megatron-core's TransformerConfig of a model: its shape (Qwen's architecture, its experts), its
parallel layout, recompute and FP8, and the fields fixed for every run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer import TransformerConfig

from ..plan import RunPlan
from ..shapes import ModelShape


def architecture(preset: ModelShape) -> dict:
    """The shape of `preset` in TransformerConfig's fields: Qwen's RMSNorm, SwiGLU, biases."""
    return dict(
        num_layers=preset.num_layers,
        hidden_size=preset.hidden_size,
        num_attention_heads=preset.num_attention_heads,
        num_query_groups=preset.num_query_groups,
        kv_channels=preset.kv_channels,
        ffn_hidden_size=preset.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=preset.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=preset.qkv_bias,
        qk_layernorm=preset.qk_norm,
    )


def mixture_of_experts(preset: ModelShape, balance: str = "transformers", cuda: bool = False) -> dict:
    """The mixture of experts of `preset` in TransformerConfig's fields, computing what
    transformers' Qwen3MoeSparseMoeBlock does: a softmax router over all experts, the top k, their
    weights renormalised to sum to 1 (megatron-core: top k of the logits, then softmax over them,
    the same numbers) or, without norm_topk_prob, taken from the softmax over all (pre-softmax);
    no shared expert, no token dropped.

    The load-balancing loss (`balance`, config.BALANCE_LOSSES): "transformers", router_aux_loss_coef × E ×
    Σ_e f_e P_e once, over all layers' routing together (f_e: the share of routed tokens expert e
    gets, P_e: its mean router probability), is balance.py's, megatron-core's own switched off;
    "per-layer", megatron-core's, one per layer divided by the top k, with a coefficient that makes
    the two the same size where layers route alike.

    Tokens reach the experts by all-to-all on GPUs (`cuda`: megatron-core's choice for expert
    parallelism) and by all-gather on the CPU (its all-to-all needs a CUDA stream)."""
    return dict(
        num_moe_experts=preset.num_experts,
        moe_router_topk=preset.moe_topk,
        moe_ffn_hidden_size=preset.moe_ffn_hidden_size,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not preset.norm_topk_prob,
        moe_router_load_balancing_type="aux_loss" if balance == "per-layer" else "none",
        moe_aux_loss_coeff=preset.router_aux_loss_coef * preset.moe_topk / preset.num_layers
        if balance == "per-layer" else 0.0,
        moe_token_dispatcher_type="alltoall" if cuda else "allgather",
        moe_grouped_gemm=False,
    )


def parallel(plan: RunPlan) -> dict:
    """The parallel layout in TransformerConfig's fields. Pipeline stages pass the residual stream in
    its dtype (`RunPlan.residual_bf16`); the first and last hold the layers the plan gives them
    (`RunPlan.stage_layers`)."""
    return dict(
        tensor_model_parallel_size=plan.tp,
        pipeline_model_parallel_size=plan.pp,
        num_layers_in_first_pipeline_stage=plan.first_stage_layers,
        num_layers_in_last_pipeline_stage=plan.last_stage_layers,
        expert_model_parallel_size=plan.ep,
        context_parallel_size=plan.cp,
        pipeline_dtype=torch.bfloat16 if plan.residual_bf16 else torch.float32,
        sequence_parallel=plan.sequence_parallel,
    )


def recomputing(recompute: str | None, modules: tuple[str, ...] = ("mlp",)) -> dict:
    """Activation recompute (config: none, full, selective of `modules`) in TransformerConfig's fields."""
    return dict(
        recompute_granularity=recompute,
        recompute_method="uniform" if recompute == "full" else None,
        recompute_num_layers=1 if recompute == "full" else None,
        recompute_modules=list(modules) if recompute == "selective" else None,
    )


def fp8_fields(fp8: str | None) -> dict:
    """`fp8` (a resolved recipe): megatron-core's transformer block runs each layer under Transformer
    Engine's FP8 autocast, E4M3 forward and E5M2 gradients ("hybrid"); the delayed recipe keeps the
    amax of the last 1024 steps, as Megatron-LM's recipes do."""
    if not fp8:
        return {}
    fields = dict(fp8="hybrid", fp8_recipe=fp8)
    if fp8 == "delayed":
        fields.update(fp8_amax_history_len=1024, fp8_amax_compute_algo="max")
    return fields


def fixed(fuse_swiglu: bool = False) -> dict:
    """The fields every run shares: no dropout, the fusions the local spec can run, and a
    micro-batch's loss coming back as a sum over its trained tokens, scaled by the step
    (`calculate_per_token_loss`: megatron-core's schedules then divide by nothing)."""
    return dict(
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # megatron-core's SwiGLU kernel is torch.compile'd (keeps only its input for backward).
        bias_activation_fusion=fuse_swiglu,
        # Fusions that need Apex or TE kernels; the local spec has none of them.
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,
        transformer_impl="local",
    )


def fused_qkv_rope(plan: RunPlan) -> bool:
    """megatron-core's `fused_single_qkv_rope`: the QKV projection handed on unsplit to one function
    that splits it and rotates the query and key (patches/rope.py: train/kernels.py's kernel on CUDA).
    Where megatron-core takes that path (no QK norms, every rank holding whole query groups) and it
    was measured: on CUDA, without FP8 or context parallelism. One H200, Qwen2.5-0.5B, micro batch 4:
    bench/results/gpu/2026-11-30-small-mfu-qkv.md."""
    shape = plan.shape
    return (plan.cuda and not shape.qk_norm and shape.num_query_groups % plan.tp == 0 and plan.cp == 1
            and not plan.fp8)


def transformer_config(plan: RunPlan) -> TransformerConfig:
    """megatron-core's TransformerConfig of the plan's model (its attention already resolved).

    Parameters stay float32 (the optimizer's master weights); the loop runs the model under bf16
    autocast. Weights are initialised on the CPU from the global seed and then split, so every
    tensor-parallel layout starts from the same model. `plan.initialize` False (weights about to be
    loaded) initialises them where they live, the current device: faster, and any values do.
    (megatron's perform_initialization=False would skip marking the tensor-parallel split on
    the parameters, which the gradient norm and the checkpoints read.)
    """
    shape = plan.shape
    return TransformerConfig(
        **architecture(shape),
        **(mixture_of_experts(shape, plan.balance, plan.cuda) if shape.moe else {}),
        **fixed(fuse_swiglu=plan.compile != "none"),
        **parallel(plan),
        **recomputing(plan.recompute, plan.recompute_modules),
        use_cpu_initialization=plan.initialize,
        params_dtype=torch.float32,
        **fp8_fields(plan.fp8),
        fused_single_qkv_rope=fused_qkv_rope(plan),
    )
