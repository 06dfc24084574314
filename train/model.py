"""Qwen-architecture GPTModels in megatron-core: the build of a `ModelShape` (a preset from the real
HF configs, `shapes.PRESETS`, or a Hugging Face folder's).

    preset = PRESETS["qwen2.5-0.5b"]
    model = build_model(preset, attention="auto")          # after parallel_state.initialize_model_parallel

Attention, the core of megatron-core's local layer spec (whose other modules torch.compile fuses):
  te     `train.attention.TECoreAttention`: Transformer Engine's fused attention (cuDNN), packed SFT
         rows as THD (PackedSeqParams, padding_causal).
  sdpa   `train.attention.SDPACoreAttention`: PyTorch's fused scaled_dot_product_attention for
         causal rows, FlexAttention with a document block mask for packed rows.
  local  megatron-core's own unfused DotProductAttention (a [b, h, s, s] score tensor: slow, memory
         hungry; kept for comparison only).
  auto   `resolve_attention`: the fastest of these that runs here.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import RowParallelLinear, _initialize_affine_weight_cpu
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.utils import get_pg_rank, get_pg_size

from .attention import SDPACoreAttention, TECoreAttention, have_transformer_engine
from .balance import install as install_balance
from .config import ATTENTION_CHOICES, COMPILE_CHOICES, FP8_RECIPES
from .experts import GroupedExperts
from .shapes import ModelShape

# What `auto` runs where Transformer Engine is installed, and why: on an H100 (bench/gpu.sh te,
# bench/results/gpu/te.json) TE's fused attention took 0.95× PyTorch's tokens/s pretraining and 0.91×
# on packed SFT, Qwen2.5-0.5B at seq 4096: cuDNN's causal kernel is slower than SDPA's flash kernel at
# head dim 64 (1.37 against 1.20 ms per layer, forward + backward) and the TE call splits each
# compiled layer in two.
AUTO_WITH_TE = ("sdpa", "PyTorch's attention measured faster than Transformer Engine's on an H100 "
                "(pretraining 1.05×, packed SFT 1.10×)")


def resolve_attention(attention: str, *, cuda: bool | None = None, fp32: bool = False,
                      te_installed: bool | None = None) -> tuple[str, str]:
    """(the core attention to run, why): `attention` as asked, or for "auto" the fastest that runs
    here. `cuda` and `te_installed` default to what this process finds."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, not {attention!r}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    te_installed = have_transformer_engine() if te_installed is None else te_installed
    if attention == "te":
        if not te_installed:
            raise ValueError("--attention te needs Transformer Engine (transformer_engine), which is not importable "
                             "here: install it (README: Transformer Engine) or use --attention sdpa")
        if not cuda or fp32:
            raise ValueError("--attention te runs bf16 on CUDA only: use --attention sdpa"
                             + (" with --fp32" if cuda else " on the CPU"))
    if attention != "auto":
        return attention, "as asked"
    if not cuda:
        return "sdpa", "auto: no CUDA"
    if fp32:
        return "sdpa", "auto: float32 (Transformer Engine's fused attention is bf16/fp16)"
    if not te_installed:
        return "sdpa", "auto: Transformer Engine is not installed"
    choice, why = AUTO_WITH_TE
    return choice, f"auto: {why}"


def resolve_fp8(recipe: str | None, *, cuda: bool | None = None, fp32: bool = False,
                te_installed: bool | None = None, capability: tuple[int, int] | None = None) -> str | None:
    """`recipe` (config.FP8_RECIPES) if it runs here, else a clear refusal; None: bf16. The facts
    default to what this process finds (`capability`: the GPU's compute capability)."""
    if recipe is None:
        return None
    if recipe not in FP8_RECIPES:
        raise ValueError(f"--fp8 takes one of {FP8_RECIPES}, not {recipe!r}")
    te_installed = have_transformer_engine() if te_installed is None else te_installed
    if not te_installed:
        raise ValueError("--fp8 needs Transformer Engine (transformer_engine), which is not importable here: install "
                         "it (README: Transformer Engine) or train in bf16 (no --fp8)")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda or fp32:
        raise ValueError("--fp8 runs on CUDA under bf16 autocast: " + ("drop --fp32" if cuda else "this machine has no GPU"))
    capability = torch.cuda.get_device_capability() if capability is None else capability
    if capability < (8, 9):
        raise ValueError(f"--fp8: this GPU (compute capability {capability[0]}.{capability[1]}) has no FP8 matrix "
                         "units; they start with Ada and Hopper (8.9, 9.0): train in bf16 (no --fp8)")
    if recipe == "blockwise" and capability[0] != 9:
        raise ValueError(f"--fp8 blockwise runs on Hopper (compute capability 9.x), not "
                         f"{capability[0]}.{capability[1]}: use --fp8 tensorwise or delayed")
    return recipe


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


def experts(preset: ModelShape, balance: str = "transformers") -> dict:
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

    Tokens reach the experts by all-to-all on GPUs (megatron-core's choice for expert
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
        moe_token_dispatcher_type="alltoall" if torch.cuda.is_available() else "allgather",
        moe_grouped_gemm=False,
    )


def transformer_config(preset: ModelShape, *, attention: str, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                       expert_parallel: int = 1, context_parallel: int = 1,
                       sequence_parallel: bool = False, recompute: str | None = None,
                       recompute_modules: tuple[str, ...] = ("mlp",), initialize: bool = True,
                       fuse_swiglu: bool = False,
                       fp8: str | None = None, balance: str = "transformers",
                       first_stage_layers: int | None = None, last_stage_layers: int | None = None
                       ) -> TransformerConfig:
    """megatron-core's TransformerConfig for `preset` (attention already resolved).

    Parameters stay float32 (the optimizer's master weights); the loop runs the model under bf16
    autocast. Weights are initialised on the CPU from the global seed and then split, so every
    tensor-parallel layout starts from the same model. `initialize=False` (weights about to be
    loaded) initialises them where they live, the current device: faster, and any values do.
    (megatron's perform_initialization=False would skip marking the tensor-parallel split on
    the parameters, which the gradient norm and the checkpoints read.)

    Pipeline stages pass float32 activations (the residual stream stays float32 under autocast),
    and a micro-batch's loss comes back as a sum over its trained tokens, scaled by the step
    (`calculate_per_token_loss`: megatron-core's schedules then divide by nothing). The stages hold
    `first_stage_layers` and `last_stage_layers` as `pipeline_split` reads them (build_model checks them).

    `fp8` (a resolved recipe): megatron-core's transformer block runs each layer under Transformer
    Engine's FP8 autocast, E4M3 forward and E5M2 gradients ("hybrid"); the delayed recipe keeps the
    amax of the last 1024 steps, as Megatron-LM's recipes do.
    """
    fp8_fields = {}
    if fp8:
        fp8_fields = dict(fp8="hybrid", fp8_recipe=fp8)
        if fp8 == "delayed":
            fp8_fields.update(fp8_amax_history_len=1024, fp8_amax_compute_algo="max")
    return TransformerConfig(
        **architecture(preset),
        **(experts(preset, balance) if preset.moe else {}),
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
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        num_layers_in_first_pipeline_stage=first_stage_layers,
        num_layers_in_last_pipeline_stage=last_stage_layers,
        expert_model_parallel_size=expert_parallel,
        context_parallel_size=context_parallel,
        pipeline_dtype=torch.float32,
        calculate_per_token_loss=True,
        sequence_parallel=sequence_parallel,
        recompute_granularity=recompute,
        recompute_method="uniform" if recompute == "full" else None,
        recompute_num_layers=1 if recompute == "full" else None,
        recompute_modules=list(recompute_modules) if recompute == "selective" else None,
        use_cpu_initialization=initialize,
        params_dtype=torch.float32,
        transformer_impl="local",
        **fp8_fields,
    )


class GroupedRowParallelLinear(RowParallelLinear):
    """megatron-core's RowParallelLinear, handing its matmul the layer's own tensor-parallel group.

    The original passes `tp_group=None`, and the matmul then looks the same default group up with a
    DeprecationWarning on rank 0: a `warnings.warn` that torch.compile cannot trace, so every
    compiled layer broke into several graphs around its two row-parallel linears (attention output
    and MLP down projection). The group only matters to the matmul for sequence parallelism and
    gradient all-reduce, which a row-parallel linear does outside it, so the result is unchanged.
    """

    def _forward_impl(self, input, weight, *args, **kwargs):
        if kwargs.get("tp_group") is None:
            kwargs["tp_group"] = self.tp_group
        return super()._forward_impl(input, weight, *args, **kwargs)


def is_expert_parallel(param: torch.nn.Parameter) -> bool:
    """A parameter of the experts this expert-parallel rank holds alone (megatron-core's mark)."""
    return not getattr(param, "allreduce", True)


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


class SeededTransformerLayer(TransformerLayer):
    """megatron-core's TransformerLayer, its weights drawn from `init_seed` and its global layer
    number alone: a pipeline stage builds only its own layers, and without this a layer's weights
    would depend on how many were built before it on the same rank."""

    def __init__(self, config, submodules, layer_number: int = 1, *args, init_seed: int = 0, **kwargs):
        number = layer_number + layer_offset(config)
        torch.manual_seed(init_seed * 1_000_003 + number)
        super().__init__(config, submodules, layer_number, *args, **kwargs)
        assert self.layer_number == number, "megatron-core numbers this layer otherwise"
        if config.num_moe_experts and config.use_cpu_initialization:
            self._draw_each_expert(init_seed * 1_000_003 + number)

    def _draw_each_expert(self, seed: int) -> None:
        """Each expert's weights drawn again from `seed` and its global number: a rank builds only
        its expert-parallel share of the experts, whose draws would otherwise start where expert 0's
        do, and leave torch's generator elsewhere for the next module. By megatron-core's own
        initialization (the init method of each linear, the whole matrix drawn and this
        tensor-parallel rank's part kept, as the linear was built)."""
        local = self.mlp.experts.local_experts
        first = parallel_state.get_expert_model_parallel_rank() * len(local)
        for number, expert in enumerate(local, start=first):
            torch.manual_seed(seed * 1_000_003 + 1 + number)
            for linear, init in ((expert.linear_fc1, self.config.init_method),
                                 (expert.linear_fc2, self.config.output_layer_init_method)):
                weight, world = linear.weight, get_pg_size(linear.tp_group)
                dim = weight.partition_dim
                whole = [n * world if d == dim else n for d, n in enumerate(weight.shape)]
                drawn = torch.empty_like(weight)  # megatron marks the tensor it draws: a fresh one
                _initialize_affine_weight_cpu(drawn, *whole, weight.shape[dim], dim, init,
                                              stride=weight.partition_stride, params_dtype=weight.dtype,
                                              rank=get_pg_rank(linear.tp_group), world_size=world)
                weight.data.copy_(drawn)
        torch.manual_seed(seed * 1_000_003)  # what is drawn after this layer (the output layer) alike too


class RMSNorm(torch.nn.Module):
    """RMSNorm for megatron-core's local spec under sequence parallelism, which its own torch
    wrapper refuses.

    A norm of the sequence-split stream (`sequence_split`: before attention, before the MLP, the
    final one) marks its weight `sequence_parallel`, and the trainer sums its gradient over the
    tensor-parallel group (`distributed.sum_partial_grads`). Its output feeds a column-parallel linear,
    which gathers it over the group and in backward reduce-scatters a gradient of the input's
    dtype; under autocast that gradient is bf16, so the output is cast to autocast's dtype (what
    the linear computes in anyway). Qwen3's QK norms see whole sequences and stay as they are.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, *,
                 sequence_split: bool = True) -> None:
        super().__init__()
        self.eps, self.sequence_split = eps, sequence_split
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = sequence_split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        if self.sequence_split and torch.is_autocast_enabled(x.device.type):
            out = out.to(torch.get_autocast_dtype(x.device.type))
        return out


CORE_ATTENTION = {"sdpa": SDPACoreAttention, "te": TECoreAttention}  # local: the spec's own


def _submodules(spec):
    """A ModuleSpec's submodules (megatron-core 0.19 gives some specs as functools.partial)."""
    return spec.keywords["submodules"] if isinstance(spec, functools.partial) else spec.submodules


def _with_module(spec, module: type):
    """`spec` building `module` instead (megatron-core 0.19 gives some specs as functools.partial)."""
    if isinstance(spec, functools.partial):
        return functools.partial(module, *spec.args, **spec.keywords)
    return dataclasses.replace(spec, module=module)


def layer_spec(preset: ModelShape, attention: str, seed: int = 0, sequence_parallel: bool = False,
               fp8: bool = False, grouped_experts: bool = True):
    """megatron-core's local layer: our core attention; under `fp8` Transformer Engine's linear
    layers (the same parameter names, so checkpoints and Hugging Face exports are unchanged); a
    mixture of experts' experts computed by grouped GEMM (experts.py), or one after another."""
    spec = get_gpt_layer_local_spec(num_experts=preset.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=preset.qk_norm, normalization="RMSNorm")
    spec.module, spec.params = SeededTransformerLayer, {**spec.params, "init_seed": seed}
    attention_parts = spec.submodules.self_attention.submodules
    mlp = _submodules(spec.submodules.mlp)
    mlp_parts = _submodules(mlp.experts) if preset.moe else mlp  # of a MoE layer: each expert's
    if preset.moe and grouped_experts:
        mlp.experts = _with_module(mlp.experts, GroupedExperts)
    attention_parts.linear_proj = mlp_parts.linear_fc2 = GroupedRowParallelLinear
    if attention in CORE_ATTENTION:
        attention_parts.core_attention = CORE_ATTENTION[attention]
    if fp8:
        attention_parts.linear_qkv = mlp_parts.linear_fc1 = fp8_linear("TEColumnParallelLinear")
        attention_parts.linear_proj = mlp_parts.linear_fc2 = fp8_linear("TERowParallelLinear")
    if sequence_parallel:
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = RMSNorm
        if preset.qk_norm:
            attention_parts.q_layernorm = attention_parts.k_layernorm = ModuleSpec(
                module=RMSNorm, params={"sequence_split": False})
    return spec


@functools.cache
def fp8_linear(name: str) -> type:
    """megatron-core's Transformer Engine linear `name`, called outside torch.compile's graphs:
    dynamo cannot trace TE's FP8 tensors ("'Float8Tensor' object has no attribute '_data'", torch
    2.11, TE 2.20), and so a compiled layer keeps its norms, RoPE, attention and SwiGLU fused
    around the FP8 matrix multiplications, as in bf16."""
    from megatron.core.extensions import transformer_engine

    linear = getattr(transformer_engine, name)
    return type(name, (linear,), {"forward": torch.compiler.disable(linear.forward), "__module__": __name__})


def block_spec(preset: ModelShape, attention: str, seed: int, sequence_parallel: bool, fp8: bool = False,
               grouped_experts: bool = True, layers: int = 1):
    """The decoder's spec: this stage's `layers`, and under sequence parallelism our RMSNorm as the
    final norm too (megatron-core would pick its torch wrapper)."""
    spec = layer_spec(preset, attention, seed, sequence_parallel, fp8, grouped_experts)
    if not sequence_parallel:
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=RMSNorm)


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
    if preset.moe and balance == "transformers" and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("the transformers load-balancing loss needs every layer's routing in one stage: "
                         "under --pp take --moe-balance-loss per-layer")
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {COMPILE_CHOICES}, not {compile!r}")
    if sequence_parallel and tensor_parallel == 1:
        raise ValueError("--sequence-parallel splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more")
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
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(preset, attention, seed, sequence_parallel, bool(fp8), grouped_experts,
                                          layers=stage_layers),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        vocab_size=preset.vocab_size,
        max_sequence_length=max_sequence_length or preset.max_position_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=preset.rotary_base,
        share_embeddings_and_output_weights=preset.tied_embeddings,
    )
    if preset.moe and balance == "transformers":
        install_balance(model, preset.router_aux_loss_coef)
    if compile == "layers":
        for layer in model.decoder.layers:
            layer.compile()
    return model
