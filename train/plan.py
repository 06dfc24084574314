"""The run plan: every choice a train run makes, resolved once, before anything is built.

`RunPlan.resolve(config, shape, env)` turns what was asked (the command line's `TrainConfig`), the
model's shape and where the run is (`Environment`: CUDA, the GPU, Transformer Engine, the ranks)
into what will run: the attention and why, the FP8 recipe, the compile mode, the balance loss,
autocast, the data-parallel kind, bf16 weights, and the layout of a step: TP × PP × CP × DP ranks
of the world, micro and global batch, accumulation, the ranks a gradient is averaged over, the layers
of each pipeline stage. Every rule that ties one feature to another is a line of `RULES`, and every
refusal is raised here, before a process group, a weight or a GPU buffer exists. The trainer, the
model builder, data parallelism, the loader and the metrics read the plan; none of them decides
again, nor asks megatron-core's parallel_state for a size. Nothing here imports megatron-core, and torch only to look at the
machine (`Environment.current`), so the rules are tested without building a model.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .config import ATTENTION_CHOICES, COMPILE_CHOICES, FP8_RECIPES, TrainConfig, check_seq_length
from .shapes import ModelShape

# What `auto` runs where Transformer Engine is installed, and why: on an H100 (bench/gpu.sh te,
# bench/results/gpu/2026-11-29-te-fp8.md) TE's fused attention took 0.95× PyTorch's tokens/s pretraining and 0.91×
# on packed SFT, Qwen2.5-0.5B at seq 4096: cuDNN's causal kernel is slower than SDPA's flash kernel at
# head dim 64 (1.37 against 1.20 ms per layer, forward + backward) and the TE call splits each
# compiled layer in two.
AUTO_WITH_TE = ("sdpa", "PyTorch's attention measured faster than Transformer Engine's on an H100 "
                "(pretraining 1.05×, packed SFT 1.10×)")


# What `auto` runs under CUDA graphs where Transformer Engine is installed, and why: TE's cuDNN attention over
# packed rows as one THD stream (thd.py's fixed form, captured in the graphs) skips the pairs of different
# samples, which FlexAttention's document mask still computes tile by tile; causal rows stay PyTorch's
# (TE's causal kernel costs SDPA's GPU time and splits the compiled layer).
AUTO_TE_PACKED = ("te", "Transformer Engine's THD attention for packed rows inside the CUDA graphs (measured 1.045x "
                  "PyTorch's on packed SFT on an H200, 2026-12-01-te-graphs.md), PyTorch's SDPA for causal rows")


# Why `--cuda-graphs auto` captures where it can (measured: docs/performance.md, "CUDA graphs").
GRAPHS_PAY = "the host launches one graph a micro-batch instead of its kernels"


# The share of a GPU's memory a pipeline split chosen for speed may fill by `stage_bytes`' estimate: the
# rest is left to what it does not count (the CUDA context, workspaces, the allocator's gaps).
STAGE_MEMORY_SHARE = 0.9


# The options that log to a scalar sink, and the package each needs.
SINK_PACKAGES = {"--tensorboard-dir": "tensorboard", "--wandb-project": "wandb"}


@dataclass(frozen=True)
class Environment:
    """Where the run is: the facts a plan depends on besides what was asked."""

    cuda: bool = False
    te_installed: bool = False
    capability: Optional[tuple[int, int]] = None  # the GPU's compute capability
    world_size: int = 1  # ranks of the run
    gpu_memory: Optional[int] = None  # bytes of one GPU's memory
    installed: frozenset[str] = frozenset(SINK_PACKAGES.values())  # the scalar sinks' packages importable here

    @classmethod
    def current(cls) -> Environment:
        import torch
        import torch.distributed as dist

        from .attention import have_transformer_engine

        cuda = torch.cuda.is_available()
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
        return cls(cuda=cuda, te_installed=have_transformer_engine(),
                   capability=torch.cuda.get_device_capability() if cuda else None,
                   world_size=world or int(os.environ.get("WORLD_SIZE", "1")),
                   gpu_memory=torch.cuda.get_device_properties(0).total_memory if cuda else None,
                   installed=frozenset(p for p in SINK_PACKAGES.values() if importlib.util.find_spec(p)))


@dataclass(frozen=True)
class RunPlan:
    """What a run builds and runs (see the module's docstring). `initialize`: draw the weights (False:
    they are about to be loaded)."""

    shape: ModelShape
    attention: str = "sdpa"
    attention_why: str = "as asked"
    te_causal: bool = True  # attention te: causal rows through TE too (False: PyTorch's SDPA, auto's choice)
    fp8: Optional[str] = None
    compile: str = "none"
    balance: str = "transformers"
    autocast: bool = False
    data_parallel: str = "none"  # "megatron" (with the distributed optimizer), "torch" (DDP) or "none"
    bf16_weights: bool = False
    bf16_weights_why: str = "as asked"
    fp32_residual: bool = False  # the residual stream float32 under autocast (--fp32-residual-connection)
    cuda_graphs: bool = False  # each micro-batch's forward and backward one CUDA graph (graphs.py)
    cuda_graphs_why: str = "as asked"
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    dp: int = 1
    world: int = 1  # ranks of the run: tp × pp × cp × dp
    sequence_parallel: bool = False
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    stages_why: str = "as asked"
    recompute: Optional[str] = None
    recompute_modules: tuple[str, ...] = ("mlp",)
    grouped_experts: bool = True
    cross_entropy: str = "fused"
    weights_from: Optional[str] = None  # a Hugging Face folder the weights are loaded from
    overlap_grad_reduce: bool = False  # megatron-core's data parallelism (data_parallel "megatron")
    overlap_param_gather: bool = False
    max_sequence_length: Optional[int] = None
    seed: int = 0
    initialize: bool = True
    # what the rules also look at: the machine and the batch
    cuda: bool = False
    micro_batch_size: int = 1
    global_batch_size: Optional[int] = None  # None: one micro-batch per data-parallel rank
    sinks: tuple[str, ...] = ()  # the scalar sinks asked for (SINK_PACKAGES' options)
    installed: frozenset[str] = frozenset(SINK_PACKAGES.values())  # Environment.installed
    gpu_memory: Optional[int] = None  # Environment.gpu_memory

    @property
    def global_batch(self) -> int:
        """Rows a step takes over every data-parallel rank (a multiple of micro batch × DP: RULES)."""
        return self.global_batch_size or self.micro_batch_size * self.dp

    @property
    def residual_bf16(self) -> bool:
        """Whether the residual stream (the embedding's output, each layer's sums, what pipeline stages
        pass) is bf16: under autocast, unless --fp32-residual-connection. The float32 embedding table
        made it float32 otherwise, where megatron-core's bf16 runs and transformers' keep it bf16."""
        return self.autocast and not self.fp32_residual

    @property
    def accumulation(self) -> int:
        """Micro-batches each pipeline runs a step (the CP ranks of a pipeline, the same ones)."""
        return self.global_batch // (self.micro_batch_size * self.dp)

    @property
    def gradient_ranks(self) -> int:
        """The ranks over which a gradient is averaged (`distributed.gradient_group`): DP × CP."""
        return self.dp * self.cp

    @property
    def stage_layers(self) -> list[int]:
        """The layers of each pipeline stage (`pipeline_split`; checked by RULES)."""
        return pipeline_split(self.shape.num_layers, self.pp, self.first_stage_layers, self.last_stage_layers,
                              self.shape.name)

    def layer_offset(self, stage: int) -> int:
        """The layers of the pipeline stages before `stage`: its layer k is the model's layer offset + k."""
        return sum(self.stage_layers[:stage])

    @classmethod
    def resolve(cls, config: TrainConfig, shape: ModelShape, env: Environment) -> RunPlan:
        """The plan of `config` for `shape` in `env`; a ValueError names the first rule it breaks."""
        model, parallel = config.model, config.parallel
        autocast = env.cuda and not config.fp32
        attention, why = resolve_attention(model.attention, env, config.fp32)
        dp = max(1, env.world_size // (parallel.tp * parallel.pp * parallel.cp))
        plan = cls(
            shape=shape, attention=attention, attention_why=why,
            fp8=resolve_fp8(model.fp8, env, config.fp32),
            compile=resolve_compile(model.compile, env.cuda, parallel.sequence_parallel),
            balance=model.balance_loss or ("per-layer" if parallel.pp > 1 else "transformers"),
            autocast=autocast,
            data_parallel=("megatron" if parallel.distributed_optimizer
                           else "torch" if dp * parallel.cp > 1 and parallel.pp == 1 else "none"),
            bf16_weights=bool(config.optim.bf16_weights), fp32_residual=model.fp32_residual,
            tp=parallel.tp, pp=parallel.pp, ep=parallel.ep, cp=parallel.cp, dp=dp, world=env.world_size,
            sequence_parallel=parallel.sequence_parallel,
            first_stage_layers=parallel.first_stage_layers, last_stage_layers=parallel.last_stage_layers,
            recompute=model.recompute, recompute_modules=tuple(model.recompute_modules.split(",")),
            grouped_experts=model.grouped_experts, cross_entropy=model.cross_entropy, weights_from=model.hf_model,
            overlap_grad_reduce=parallel.overlap_grad_reduce, overlap_param_gather=parallel.overlap_param_gather,
            max_sequence_length=config.seq_length, seed=config.seed,
            initialize=model.hf_model is None, cuda=env.cuda, micro_batch_size=config.micro_batch_size,
            global_batch_size=config.global_batch_size, installed=env.installed, gpu_memory=env.gpu_memory,
            sinks=tuple(option for option, asked in (("--tensorboard-dir", config.log.tensorboard_dir),
                                                     ("--wandb-project", config.log.wandb_project)) if asked))
        check_seq_length(config.seq_length, shape.max_position_embeddings, model.hf_model or shape.name)
        if env.world_size % (parallel.tp * parallel.pp * parallel.cp):
            raise ValueError(f"world size {env.world_size} is not a multiple of --tp {parallel.tp} × --pp "
                             f"{parallel.pp} × --cp {parallel.cp}")
        if config.optim.bf16_weights is None:  # the default: where they are built
            unbuilt = bf16_weights_unbuilt(plan)
            plan = dataclasses.replace(plan, bf16_weights=unbuilt is None, bf16_weights_why=(
                f"split bf16 weights: {unbuilt}" if unbuilt else "the default where they are built"))
        if plan.pp > 1 and (plan.first_stage_layers, plan.last_stage_layers) == (None, None):
            first, last, why = balanced_stages(plan)
            plan = dataclasses.replace(plan, first_stage_layers=first, last_stage_layers=last, stages_why=why)
        unbuilt = cuda_graphs_unbuilt(plan)
        asked = model.cuda_graphs
        plan = dataclasses.replace(
            plan, cuda_graphs=asked == "on" or (asked == "auto" and unbuilt is None),
            cuda_graphs_why="as asked" if asked != "auto" else f"auto: {unbuilt or GRAPHS_PAY}")
        if model.attention == "auto" and env.te_installed and graphed_te_pays(plan, env.capability):
            choice, why = AUTO_TE_PACKED
            plan = dataclasses.replace(plan, attention=choice, te_causal=False, attention_why=f"auto: {why}")
        check(plan)
        return plan

    @classmethod
    def for_model(cls, shape: ModelShape, **choices) -> RunPlan:
        """A plan for building `shape` outside a train run (conversion, logits, tests): `choices` as the
        fields, checked by the rules of a build (BUILD_RULES; a forward pass needs no more)."""
        plan = cls(shape=shape, **choices)
        if "world" not in choices:
            plan = dataclasses.replace(plan, world=plan.tp * plan.pp * plan.cp * plan.dp)
        check(plan, BUILD_RULES)
        return plan


def resolve_attention(asked: str, env: Environment, fp32: bool = False) -> tuple[str, str]:
    """(the core attention to run, why): `asked`, or for "auto" the fastest that runs in `env`."""
    if asked not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, not {asked!r}")
    if asked == "te":
        if not env.te_installed:
            raise ValueError("--attention te needs Transformer Engine (transformer_engine), which is not importable "
                             "here: install it (README: Transformer Engine) or use --attention sdpa")
        if not env.cuda or fp32:
            raise ValueError("--attention te runs bf16 on CUDA only: use --attention sdpa"
                             + (" with --fp32" if env.cuda else " on the CPU"))
    if asked != "auto":
        return asked, "as asked"
    if not env.cuda:
        return "sdpa", "auto: no CUDA"
    if fp32:
        return "sdpa", "auto: float32 (Transformer Engine's fused attention is bf16/fp16)"
    if not env.te_installed:
        return "sdpa", "auto: Transformer Engine is not installed"
    choice, why = AUTO_WITH_TE
    return choice, f"auto: {why}"


def graphed_te_pays(p: RunPlan, capability: Optional[tuple[int, int]]) -> bool:
    """Whether `auto` takes Transformer Engine's attention for packed rows (AUTO_TE_PACKED) in a plan
    that resolved to PyTorch's: where its micro-batches are CUDA graphs, in bf16, on Hopper (measured
    so; eager, TE's host time a call lost what its kernel saves: 2026-11-30g-te-thd.md)."""
    return (p.attention == "sdpa" and p.cuda_graphs and p.autocast and not p.fp8
            and (capability or (0, 0))[0] == 9)


def resolve_fp8(recipe: Optional[str], env: Environment, fp32: bool = False) -> Optional[str]:
    """`recipe` (config.FP8_RECIPES) if it runs in `env`, else a clear refusal; None: bf16."""
    if recipe is None:
        return None
    if recipe not in FP8_RECIPES:
        raise ValueError(f"--fp8 takes one of {FP8_RECIPES}, not {recipe!r}")
    if not env.te_installed:
        raise ValueError("--fp8 needs Transformer Engine (transformer_engine), which is not importable here: install "
                         "it (README: Transformer Engine) or train in bf16 (no --fp8)")
    if not env.cuda or fp32:
        raise ValueError("--fp8 runs on CUDA under bf16 autocast: " + ("drop --fp32" if env.cuda
                                                                        else "this machine has no GPU"))
    capability = env.capability or (0, 0)
    if capability < (8, 9):
        raise ValueError(f"--fp8: this GPU (compute capability {capability[0]}.{capability[1]}) has no FP8 matrix "
                         "units; they start with Ada and Hopper (8.9, 9.0): train in bf16 (no --fp8)")
    if recipe == "blockwise" and capability[0] != 9:
        raise ValueError(f"--fp8 blockwise runs on Hopper (compute capability 9.x), not "
                         f"{capability[0]}.{capability[1]}: use --fp8 tensorwise or delayed")
    return recipe


def resolve_compile(asked: str, cuda: bool, sequence_parallel: bool) -> str:
    """--compile auto: each layer compiled on CUDA, nothing on the CPU. Under sequence parallelism
    only the SwiGLU: a compiled layer lost most of its gradient there (2 × H200: gradient norm 0.65
    against 15.6 at step 1, loss stuck), also with megatron-core's sequence-parallel linears kept
    out of the graph (loss 11.97 against 10.52 after 10 steps), so that combination is refused
    (RULES). Under FP8 layers compile around Transformer Engine's linears; in a mixture of experts
    around the MoE layer, whose dispatcher waits on the host for each expert's token count (Qwen3-30B-A3B's
    shape, 4 layers, micro batch 4, one H200: 1.11× the SwiGLU alone, bench/README.md)."""
    if asked not in ("auto",) + COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {COMPILE_CHOICES}, not {asked!r}")
    if asked != "auto":
        return asked
    if not cuda:
        return "none"
    return "swiglu" if sequence_parallel else "layers"


def pipeline_split(num_layers: int, stages: int, first: Optional[int] = None, last: Optional[int] = None,
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


def stage_bytes(p: RunPlan, stage: int, layers: int) -> float:
    """What pipeline stage `stage` holding `layers` layers takes of a GPU, estimated: 16 bytes a
    parameter (the weight and the float32 rest of its master, its gradient, AdamW's two moments) over
    TP (and EP for experts), and the activations of the micro-batches 1F1B keeps in flight there
    (PP − stage of them) for their backward (`ModelShape.activation_bytes_per_token`)."""
    shape = p.shape
    weights = layers * shape.layer_parameters(p.ep) + shape.vocab_size * shape.hidden_size * (
        (stage == 0) + (stage == p.pp - 1))  # the embedding first, the output layer (or the tied copy) last
    in_flight = min(p.pp - stage, p.accumulation)
    tokens = p.micro_batch_size * (p.max_sequence_length or 0) / p.cp
    return 16 * weights / p.tp + in_flight * layers * tokens * shape.activation_bytes_per_token() / p.tp


def balanced_stages(p: RunPlan) -> tuple[Optional[int], Optional[int], str]:
    """The first and last stage's layers when neither is asked (None: an even share), and why. The
    last stage also runs the output layer (Qwen2.5-7B's: 2.2 layers' FLOPs), so under an even split
    the others wait for it; the split whose slowest stage has the fewest FLOPs is taken where every
    stage fits STAGE_MEMORY_SHARE of the GPU by `stage_bytes`. Measured, Qwen2.5-7B over two H200s,
    global batch 128: 15 + 13 trains at 1.07× 14 + 14 (docs/performance.md, "Pipeline stages balanced")."""
    shape, stages, n = p.shape, p.pp, p.shape.num_layers
    if not (p.cuda and p.gpu_memory and p.max_sequence_length):
        return None, None, "even: no GPU's memory to fit another split in"
    layer = shape.layer_flops_per_token(p.max_sequence_length)
    output = shape.output_flops_per_token()
    budget = STAGE_MEMORY_SHARE * p.gpu_memory

    def split(first: int, last: int) -> Optional[list[int]]:
        middle, inner = n - first - last, stages - 2
        if first < 1 or last < 1 or middle < inner or (middle % inner if inner else middle):
            return None
        return [first] + [middle // inner] * inner + [last] if inner else [first, last]

    def work(s: list[int]) -> float:  # FLOPs a token of the slowest stage
        return max(k * layer + (i == stages - 1) * output for i, k in enumerate(s))

    even = split(n // stages, n // stages) if n % stages == 0 else None
    faster = [s for s in (split(first, last) for first in range(1, n) for last in range(1, n))
              if s and (even is None or work(s) < work(even))]
    fitting = [s for s in faster if all(stage_bytes(p, i, k) <= budget for i, k in enumerate(s))]
    if not fitting:
        return None, None, ("even: the stages' work is as balanced as it can be" if not faster
                            else "even: a more balanced split would not fit the GPU by the estimate")
    best = min(fitting, key=lambda s: (work(s), max(s) - min(s)))
    peak = max(stage_bytes(p, i, k) for i, k in enumerate(best))
    return best[0], best[-1], (f"balanced: the output layer is {output / layer:.1f} layers' work on the last stage; "
                               f"an estimated {peak / 2**30:.1f} of the GPU's {p.gpu_memory / 2**30:.1f} GiB")


# -- the rules ----------------------------------------------------------------------------------------
# Each rule looks at a plan and returns why the combination is refused, or None. `RULES` is the
# table, in the order they are checked.
Rule = Callable[[RunPlan], Optional[str]]


def _ep_divides_dp(p: RunPlan) -> Optional[str]:
    if p.dp % p.ep:
        return f"--ep {p.ep} does not divide the data-parallel size {p.dp}"


def _global_batch(p: RunPlan) -> Optional[str]:
    if p.global_batch_size is not None and p.global_batch_size % (p.micro_batch_size * p.dp):
        return (f"global batch {p.global_batch_size} is not a multiple of micro batch × DP "
                f"({p.micro_batch_size} × {p.dp})")


def _distributed_optimizer_on_cpu(p: RunPlan) -> Optional[str]:
    if p.data_parallel == "megatron" and not p.cuda:
        return ("--distributed-optimizer runs on CUDA (megatron-core's gradient buffers and DistributedOptimizer): "
                "drop it on the CPU")


def _fp8_moe(p: RunPlan) -> Optional[str]:
    if p.fp8 and p.shape.moe:
        return "--fp8 with a mixture-of-experts model is not built: train it in bf16 (no --fp8)"


def _shape_splits_over_tp(p: RunPlan) -> Optional[str]:
    s = p.shape
    sizes = {"{:,} attention heads": s.num_attention_heads, "{:,} key/value heads": s.num_query_groups,
             "an MLP {:,} wide": s.ffn_hidden_size, **({"experts {:,} wide": s.moe_ffn_hidden_size} if s.moe else {})}
    uneven = [what.format(n) for what, n in sizes.items() if n % p.tp]
    if uneven:
        return (f"--tp {p.tp} does not split {s.name} evenly ({', '.join(uneven)}): take a --tp that divides "
                f"its {s.num_query_groups} key/value heads")


def _sink_packages(p: RunPlan) -> Optional[str]:
    missing = [f"{option} needs the {SINK_PACKAGES[option]} package (pip install {SINK_PACKAGES[option]})"
               for option in p.sinks if SINK_PACKAGES[option] not in p.installed]
    if missing:
        return "; ".join(missing)


def _ep_without_experts(p: RunPlan) -> Optional[str]:
    if p.ep > 1 and not p.shape.moe:
        return f"--ep {p.ep} splits experts: {p.shape.name} has none"


def _moe_tp_needs_sp(p: RunPlan) -> Optional[str]:
    if p.shape.moe and p.tp > 1 and not p.sequence_parallel:
        return ("a mixture-of-experts model under --tp trains with --sequence-parallel (megatron-core refuses it "
                "without): add --sequence-parallel")


def _sp_needs_tp(p: RunPlan) -> Optional[str]:
    if p.sequence_parallel and p.tp == 1:
        return "--sequence-parallel splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more"


def _compiled_layers_sp(p: RunPlan) -> Optional[str]:
    if p.compile == "layers" and p.sequence_parallel:
        return "--compile layers with --sequence-parallel gives wrong gradients: use --compile swiglu or auto"


def _balance_in_one_stage(p: RunPlan) -> Optional[str]:
    if p.shape.moe and p.balance == "transformers" and p.pp > 1:
        return ("the transformers load-balancing loss needs every layer's routing in one stage: under --pp take "
                "--moe-balance-loss per-layer")


def _stages(p: RunPlan) -> Optional[str]:
    try:
        pipeline_split(p.shape.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers, p.shape.name)
    except ValueError as e:
        return str(e)


def _cp_chunks(p: RunPlan) -> Optional[str]:
    if p.cp > 1 and p.max_sequence_length and p.max_sequence_length % (2 * p.cp):
        return (f"--cp {p.cp} cuts each row into {2 * p.cp} equal chunks: --seq-length {p.max_sequence_length} is "
                f"not a multiple of {2 * p.cp}")


def _cp_attention(p: RunPlan) -> Optional[str]:
    if p.cp > 1 and p.attention != "sdpa":
        return f"--cp runs PyTorch's attention: use --attention sdpa (or auto), not {p.attention}"


def _cp_distributed_optimizer(p: RunPlan) -> Optional[str]:
    if p.cp > 1 and p.data_parallel == "megatron":
        return ("--cp with --distributed-optimizer is not built yet: --cp runs beside --tp, --pp, --ep and data "
                "parallelism")


def bf16_weights_unbuilt(p: RunPlan) -> Optional[str]:
    """Why `p` cannot hold bf16 weights split from their float32 masters; None: it can. Their
    gradients are added up beside the weights, outside torch's DDP (distributed.SplitGradReduction)
    and megatron-core's optimizer (which keeps its own masters); not for a mixture of experts, whose
    router multiplies outside autocast."""
    return ("it computes under bf16 autocast: on CUDA, without --fp32" if not p.autocast
            else "it is not built with --fp8" if p.fp8
            else "it is not built for a mixture-of-experts model" if p.shape.moe
            else "megatron-core's distributed optimizer keeps its own masters" if p.data_parallel == "megatron"
            else None)


def cuda_graphs_unbuilt(p: RunPlan) -> Optional[str]:
    """Why `p`'s micro-batches cannot run as captured CUDA graphs (graphs.py); None: they can. A
    graph replays kernels alone: whatever the host decides or exchanges during a micro-batch (other
    ranks' messages, a router's token counts, FP8's delayed scaling history, recompute's RNG states)
    is not in it. FP8's tensorwise and blockwise recipes scale each tensor from its own amax, on the
    GPU, inside the graph; Transformer Engine's attention (te) takes packed rows in a form of a fixed
    sample count, a graph for each (thd.py)."""
    return ("there is no CUDA here" if not p.cuda
            else f"they are built for one GPU, not {p.world} ranks" if p.world > 1
            else "a mixture of experts routes a different number of tokens every micro-batch" if p.shape.moe
            else "megatron-core's distributed optimizer reduces gradients from its own hooks"
            if p.data_parallel == "megatron"
            else "FP8's delayed recipe keeps an amax history the host updates" if p.fp8 == "delayed"
            else "recompute restores RNG states on the host" if p.recompute
            else f"only PyTorch's (sdpa) and Transformer Engine's (te) attention are captured, not {p.attention}"
            if p.attention not in ("sdpa", "te")
            else None)


def _cuda_graphs(p: RunPlan) -> Optional[str]:
    why = cuda_graphs_unbuilt(p) if p.cuda_graphs else None
    return f"--cuda-graphs on: {why}" if why else None


def _bf16_weights(p: RunPlan) -> Optional[str]:
    why = bf16_weights_unbuilt(p) if p.bf16_weights else None
    return f"--bf16-weights: {why}" if why else None


RULES: tuple[Rule, ...] = (
    _ep_divides_dp,               # experts split within a data-parallel group
    _global_batch,                # every data-parallel rank takes whole micro-batches
    _distributed_optimizer_on_cpu,
    _fp8_moe,                     # TE's FP8 linears are not built into the experts
    _ep_without_experts,
    _shape_splits_over_tp,        # megatron-core's TP layers split heads and widths evenly
    _moe_tp_needs_sp,             # megatron-core's MoE under TP
    _sp_needs_tp,
    _compiled_layers_sp,          # measured wrong gradients (resolve_compile)
    _balance_in_one_stage,        # transformers' balance loss sums every layer's routing
    _stages,                      # --pp and the first/last stage sizes
    _cp_chunks,                   # --cp's load-balanced chunks
    _cp_attention,
    _cp_distributed_optimizer,
    _bf16_weights,                # autocast, no FP8, dense, not megatron-core's optimizer
    _sink_packages,               # refused before the model is built, not after
    _cuda_graphs,                 # one GPU, dense, sdpa, no recompute, no delayed FP8
)


# What building a model needs of its plan, trained or not (megatron-core builds MoE layers under TP
# without sequence parallelism; only training them is refused).
BUILD_RULES: tuple[Rule, ...] = (_shape_splits_over_tp, _sp_needs_tp, _balance_in_one_stage, _stages)


def check(plan: RunPlan, rules: tuple[Rule, ...] = RULES) -> None:
    """A ValueError naming the first of `rules` that `plan` breaks."""
    for rule in rules:
        if (why := rule(plan)) is not None:
            raise ValueError(why)
