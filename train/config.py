"""The command lines (`qwen-data train`, `qwen-data convert`) and the typed configuration a train run's
becomes, once, before anything runs.

Each field of a section is its option (`option`: flag, default, help and type stated together);
`build_parser` adds the sections' options in the order of TrainConfig's fields, and each section
builds itself from the parsed arguments by field name. Nothing here imports torch or megatron-core:
`--help` and a refused option answer at once."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional, get_type_hints

from qwen_data.blend.weights import split_argument
from qwen_data.options import INT32_MAX, DefaultsHelpFormatter, bounded

from .shapes import PRESETS

DESCRIPTION = "Train Qwen-architecture megatron-core GPTModels on qwen-data prefixes."
VERBOSE_HELP = "QWEN_DATA_VERBOSE=1 shows megatron-core's warnings and log."

ATTENTION_CHOICES = ("auto", "te", "sdpa", "local")  # model/__init__.py: what each is
# --compile: nothing; megatron-core's own torch.compile'd SwiGLU; or that and every transformer layer
# compiled (RMSNorm, rotary embedding, residual adds fused around the matmuls).
COMPILE_CHOICES = ("none", "swiglu", "layers")
CUDA_GRAPHS_CHOICES = ("auto", "on", "off")
CROSS_ENTROPY_CHOICES = ("fused", "megatron")  # --cross-entropy: loss.py's, or megatron-core's
# --fp8: megatron-core's names of Transformer Engine's FP8 recipes (plan.resolve_fp8: where each runs).
FP8_RECIPES = ("tensorwise", "delayed", "blockwise")
BALANCE_LOSSES = ("transformers", "per-layer")  # a mixture of experts' load-balancing loss (balance.py)
RECOMPUTE_CHOICES = ("selective", "full")
RECOMPUTE_MODULES = ("core_attn", "mlp")  # megatron-core's recompute_modules that run under autocast here


COUNT = bounded(int, 1)
# Tokens per sample: a row's lengths and cu_seqlens are int32, and a sample reads seq length + 1 tokens
# (the model's own limit is checked once its shape is known: `check_seq_length`).
SEQ_LENGTH = bounded(int, 1, INT32_MAX - 1)


def check_seq_length(seq_length: int, max_positions: int, model: str) -> None:
    """ValueError when a sample is longer than the positions the model was made for."""
    if seq_length > max_positions:
        raise ValueError(f"--seq-length {seq_length:,} is beyond the {max_positions:,} positions of {model} "
                         f"(its max_position_embeddings): train at most {max_positions:,} tokens a sample")


def option(flag: str, group: Optional[str] = None, **argparse_keywords) -> Any:
    """A config field that is the command-line option `flag`, parsed into the field's name;
    `argparse_keywords` go to add_argument as they are. `group`: the --help section of a field of
    TrainConfig's own (a section's fields are in its GROUP)."""
    return field(metadata={"flag": flag, "group": group, "argparse": argparse_keywords})


def add_option(group, f: dataclasses.Field) -> None:
    group.add_argument(f.metadata["flag"], dest=f.name, **f.metadata["argparse"])


class Section:
    """A part of TrainConfig whose fields are all `option`s, shown under GROUP in --help."""

    GROUP: ClassVar[str]

    @classmethod
    def add_arguments(cls, group) -> None:
        for f in fields(cls):
            add_option(group, f)

    @classmethod
    def from_args(cls, ns: argparse.Namespace):
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class DataConfig(Section):
    GROUP = "data"

    path: str = option("--data", required=True, metavar="DATA",
                       help="a `qwen-data blend` JSON, a Megatron blend, or one prefix")
    split: Optional[str] = option("--split", type=split_argument,
                                  help="Megatron split (e.g. 98,2,0) for blends without their own (none: the blend's, "
                                       "else 969,30,1)")
    data_cache: Optional[str] = option("--data-cache", help="where megatron-core caches sample indices (none: built "
                                                             "in memory each run)")
    num_workers: int = option("--num-workers", type=bounded(int, 0, 1024), default=2,
                              help="DataLoader workers per rank")
    allow_uncertified: bool = option("--allow-uncertified", action="store_true",
                                     help="train on prefixes whose certificate records ids that differ from the "
                                          "reference's (a `qwen-data verify --certify` recheck), or vouches for "
                                          "other data than the manifest's")
    data_check: bool = option(
        "--data-check", action=argparse.BooleanOptionalAction, default=True,
        help="read every byte of the data before anything is built: each prefix's files hashed against its "
             "manifest's fingerprint, its ids checked to be in its vocabulary (~1 GB/s a core, files side by side; "
             "once per node); --no-data-check saves that time, on data `qwen-data verify` checked where it lies")
    reset_position_ids: bool = option("--reset-position-ids", action="store_true",
                                      help="pretraining: positions restart after EOD")
    reset_attention_mask: bool = option(
        "--reset-attention-mask", action="store_true",
        help="pretraining: documents in a row never attend to each other (document mask)")
    # Qwen's pretraining practice (QwenLM/Qwen#427): documents joined by <|endoftext|>, the loss of
    # predicting it kept, the loss across the boundary (predicting a document's first token from the
    # previous one's end) dropped: megatron-core's eod_mask_loss, which zeroes the loss where the
    # input token is EOD.
    eod_mask_loss: bool = option(
        "--eod-mask-loss", action=argparse.BooleanOptionalAction, default=True,
        help="pretraining: no loss on predicting the token after an EOD (the next document's first), as Qwen "
             "pretrains; predicting the EOD itself keeps its loss; --no-eod-mask-loss trains every position")


@dataclass(frozen=True)
class ModelConfig(Section):
    GROUP = "model"

    name: Optional[str] = option(  # a key of PRESETS
        "--model", choices=sorted(PRESETS),
        help="a preset shape with random weights (default: tiny, unless --hf-model or the --load checkpoint "
             "gives the model)")
    hf_model: Optional[str] = option(
        "--hf-model", metavar="DIR",
        help="start from this Hugging Face Qwen2/2.5/3 or Qwen3-MoE checkpoint folder (its config.json gives the "
             "shape; none: see --model)")
    # attention and compile as asked ("auto" included); the trainer resolves them.
    attention: str = option("--attention", default="auto", choices=ATTENTION_CHOICES,
                            help="core attention: te (Transformer Engine), sdpa (PyTorch), local (megatron-core's "
                                 "unfused); auto: te for packed rows and sdpa for causal ones where the micro-batches "
                                 "are CUDA graphs on Hopper, else sdpa (measured; train/plan.py says why)")
    cross_entropy: str = option(
        "--cross-entropy", default="fused", choices=CROSS_ENTROPY_CHOICES,
        help="fused: output layer and loss by chunks, no logits kept (train/loss.py); megatron: megatron-core's "
             "output layer, then its cross-entropy over the float32 logits")
    compile: str = option(
        "--compile", default="auto", choices=("auto",) + COMPILE_CHOICES,
        help="swiglu: megatron-core's compiled SwiGLU; layers: also torch.compile each transformer layer; "
             "auto: layers on CUDA (swiglu with --sequence-parallel), none on the CPU")
    cuda_graphs: str = option(
        "--cuda-graphs", default="auto", choices=CUDA_GRAPHS_CHOICES,
        help="on: each micro-batch's forward and backward captured once (after the first micro-batch of its "
             "kind, run eagerly) as one CUDA graph and replayed, so the host launches one graph, not thousands of "
             "kernels; auto: on where it is built (one GPU, a dense model, sdpa or te attention, no recompute, FP8 "
             "only tensorwise or blockwise; the run's first line says why not)")
    recompute: Optional[str] = option(
        "--recompute", nargs="?", const="full", choices=RECOMPUTE_CHOICES,
        help="activation recompute: full = each layer's forward again in backward (keeps only its input), "
             "selective = only --recompute-modules; bare --recompute = full; none: keep every activation")
    recompute_modules: str = option(
        "--recompute-modules", default="mlp", metavar="M[,M]",
        help=f"what --recompute selective recomputes, megatron-core's names: {', '.join(RECOMPUTE_MODULES)} "
             "(core_attn gains nothing with fused attention, which keeps no score matrix)")
    fp8: Optional[str] = option(
        "--fp8", metavar="RECIPE", choices=FP8_RECIPES,
        help=f"FP8 matrix products through Transformer Engine's linear layers, by this scaling recipe "
             f"({', '.join(FP8_RECIPES)}: tensorwise = current per-tensor scaling, delayed = amax history, "
             f"blockwise = 128-wide blocks, Hopper); none: bf16")
    grouped_experts: bool = option(
        "--moe-grouped-gemm", action=argparse.BooleanOptionalAction, default=True,
        help="a mixture of experts' local experts computed by two grouped matrix products (torch's grouped GEMM); "
             "--no-moe-grouped-gemm: one expert after another (megatron-core's SequentialMLP)")
    balance_loss: Optional[str] = option(
        "--moe-balance-loss", choices=BALANCE_LOSSES,
        help="a mixture of experts' load-balancing loss: transformers = router_aux_loss_coef x transformers' loss "
             "over all layers' routing together, added once; per-layer = megatron-core's, one a layer (the two "
             "agree where layers route alike); none: transformers, per-layer under --pp")
    fp32_residual: bool = option(
        "--fp32-residual-connection", action="store_true",
        help="keep the residual stream float32 under bf16 autocast (megatron-core's option of that name); default: "
             "the stream in bf16 as megatron-core and transformers train in bf16 (0.5B on an H200 1.5-1.9%% faster, "
             "docs/performance.md)")
    num_layers: Optional[int] = option("--num-layers", type=bounded(int, 1), metavar="N",
                                       help="the --model preset with only its first N layers (speed probes of "
                                            "shapes that do not fit; none: all of them)")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ModelConfig:
        if ns.name and ns.hf_model:
            raise SystemExit("qwen-data train: give --model or --hf-model, not both")
        if ns.num_layers is not None and (not ns.name or ns.num_layers < 1):
            raise SystemExit("qwen-data train: --num-layers takes a positive count and a --model preset to cut")
        unknown = set(ns.recompute_modules.split(",")) - set(RECOMPUTE_MODULES)
        if unknown:
            raise SystemExit(f"qwen-data train: --recompute-modules takes {', '.join(RECOMPUTE_MODULES)}, not "
                             f"{', '.join(sorted(unknown))}")
        return super().from_args(ns)


@dataclass(frozen=True)
class ParallelConfig(Section):
    GROUP = "parallelism"

    tp: int = option("--tp", type=COUNT, default=1,
                     help="tensor-parallel size (data parallel = world / (tp × pp × cp))")
    pp: int = option("--pp", type=COUNT, default=1,
                     help="pipeline-parallel size: the layers split over pp stages, 1F1B schedule; by default the "
                          "last stage, which also runs the output layer, takes fewer layers where that evens out "
                          "the stages' work and the split fits the GPU (the run's first lines say which and why)")
    first_stage_layers: Optional[int] = option(
        "--decoder-first-pipeline-num-layers", type=bounded(int, 0), default=None, metavar="N",
        help="with --pp: the first stage's layers; the stages not named split the rest evenly (default: the "
             "split --pp describes)")
    last_stage_layers: Optional[int] = option(
        "--decoder-last-pipeline-num-layers", type=bounded(int, 0), default=None, metavar="N",
        help="with --pp: the last stage's layers; the stages not named split the rest evenly (default: the "
             "split --pp describes)")
    sequence_parallel: bool = option(
        "--sequence-parallel", action="store_true",
        help="with --tp: activations outside attention and MLP split over the TP ranks along the sequence")
    ep: int = option("--ep", type=COUNT, default=1,
                     help="expert-parallel size (mixture-of-experts models): each layer's experts split over ep "
                          "data-parallel ranks, tokens sent to them and back; divides the data-parallel size")
    cp: int = option("--cp", type=COUNT, default=1,
                     help="context-parallel size: each row's tokens split over cp ranks (each takes 2 of its "
                          "2·cp equal chunks, one early, one late), keys and values gathered for attention; "
                          "--seq-length a multiple of 2·cp")
    # Off by default, as measured (bench/results/gpu/2026-11-29-scale.md, Qwen2.5-0.5B on 2 × H200, DP=2, layers
    # compiled): the distributed optimizer took 0.99× plain DP's tokens/s (its gain is memory: 1.84
    # against 3.68 GiB of AdamW state a GPU); overlapping the gradient reduce-scatter 0.90×, and the
    # parameter all-gather 0.81× (its forward hooks on every module make the compiled layers recompile).
    distributed_optimizer: bool = option(
        "--distributed-optimizer", action=argparse.BooleanOptionalAction, default=False,
        help="megatron-core's DistributedDataParallel and DistributedOptimizer: AdamW's moments sharded over the "
             "data-parallel ranks (CUDA); checkpoints resume under any DP size")
    overlap_grad_reduce: bool = option(
        "--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=False,
        help="with --distributed-optimizer: reduce-scatter gradient buckets during backward")
    overlap_param_gather: bool = option(
        "--overlap-param-gather", action=argparse.BooleanOptionalAction, default=False,
        help="with --distributed-optimizer: all-gather the updated parameters during the next forward")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ParallelConfig:
        if (ns.overlap_grad_reduce or ns.overlap_param_gather) and not ns.distributed_optimizer:
            raise SystemExit("qwen-data train: --overlap-grad-reduce and --overlap-param-gather go with "
                             "--distributed-optimizer")
        return super().from_args(ns)


@dataclass(frozen=True)
class OptimConfig(Section):
    GROUP = "optimisation"

    lr: float = option("--lr", type=bounded(float, 0), default=3e-4, help="peak learning rate")
    min_lr: float = option("--min-lr", type=bounded(float, 0), help="default: lr / 10")
    warmup_iters: int = option("--warmup-iters", type=bounded(int, 0), help="default: 1%% of train iters, at least 1")
    weight_decay: float = option("--weight-decay", type=bounded(float, 0), default=0.1,
                                 help="AdamW's, on all but biases and norm weights")
    adam_beta1: float = option("--adam-beta1", type=bounded(float, 0, 1), default=0.9, help="AdamW's beta1")
    adam_beta2: float = option("--adam-beta2", type=bounded(float, 0, 1), default=0.95, help="AdamW's beta2")
    adam_eps: float = option("--adam-eps", type=bounded(float, above=0), default=1e-8, help="AdamW's epsilon")
    clip_grad: float = option("--clip-grad", type=bounded(float, 0), default=1.0, help="0 = no clipping")
    bf16_weights: Optional[bool] = option(
        "--bf16-weights", action=argparse.BooleanOptionalAction,
        help="keep each dense matrix as the bf16 weight autocast computes with plus the 16 bits that make it the "
             "float32 master again: the same masters and AdamW, no cast of every weight at every use. Default: "
             "where it is built (bf16 on CUDA, dense models, no --fp8, not with --distributed-optimizer)")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> OptimConfig:
        """The defaults that depend on other options filled in."""
        optim = super().from_args(ns)
        return dataclasses.replace(
            optim, min_lr=optim.lr / 10 if optim.min_lr is None else optim.min_lr,
            warmup_iters=max(1, ns.train_iters // 100) if optim.warmup_iters is None else optim.warmup_iters)


@dataclass(frozen=True)
class CheckpointConfig(Section):
    GROUP = "checkpoints and logs"

    save: Optional[str] = option("--save", help="checkpoint directory (none: no checkpoints)")
    save_interval: int = option("--save-interval", type=bounded(int, 0), default=0,  # and at --exit-after
                                help="0 = only at the end")
    load: Optional[str] = option("--load", help="resume from this checkpoint directory (its latest iteration; "
                                                  "none: start afresh)")
    save_hf: Optional[str] = option(
        "--save-hf", metavar="OUT",
        help="also save as a Hugging Face folder: OUT at the end, OUT/iter_N at each --save-interval (none: no "
             "export)")


@dataclass(frozen=True)
class EvalConfig(Section):
    GROUP = "checkpoints and logs"

    eval_interval: int = option("--eval-interval", type=bounded(int, 0), default=0, help="0 = no evaluation")
    eval_iters: int = option("--eval-iters", type=COUNT, default=10, help="global batches per evaluation")


@dataclass(frozen=True)
class LogConfig(Section):
    GROUP = "checkpoints and logs"

    log_interval: int = option("--log-interval", type=COUNT, default=10, help="iterations per log line")
    log_json: Optional[str] = option("--log-json", help="append one JSON line per log interval here, and the "
                                                           "steady-state summary with the machine last (rank 0; none: "
                                                           "no JSON)")
    peak_tflops: Optional[float] = option("--peak-tflops", type=bounded(float, above=0),
                                          help="bf16 peak per GPU for MFU (default: by name)")
    profile: bool = option("--profile", action="store_true",
                           help="on a GPU, measure the run as bench/gpu.sh does: one step's kernels timed under "
                                "torch's profiler (how busy the GPU is, and its busiest kernels listed), the SM "
                                "clock and power sampled by nvidia-smi for the whole run; none: neither, only the "
                                "summary")
    tensorboard_dir: Optional[str] = option(
        "--tensorboard-dir", metavar="DIR",
        help="TensorBoard scalars here (rank 0: loss, lr, grad norm, tokens/s, MFU, memory, validation loss; needs "
             "the tensorboard package; none: no TensorBoard)")
    wandb_project: Optional[str] = option(
        "--wandb-project", metavar="NAME",
        help="the same scalars to Weights & Biases (needs wandb; WANDB_MODE=offline writes them locally only; "
             "none: no W&B)")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is told; its fields in the order of `--help`. Frozen: what depends on the
    ranks (the default global batch) is worked out by the plan (`plan.RunPlan.global_batch`)."""

    data: DataConfig
    model: ModelConfig
    parallel: ParallelConfig
    seq_length: int = option("--seq-length", "model", type=SEQ_LENGTH, default=4096, help="tokens per sample")
    micro_batch_size: int = option("--micro-batch-size", "optimisation", type=bounded(int, 1, INT32_MAX),
                                   default=1, help="samples per micro-batch and rank")
    global_batch_size: Optional[int] = option(  # None: one micro-batch per data-parallel rank
        "--global-batch-size", "optimisation", type=bounded(int, 1, INT32_MAX),
        help="default: micro batch × data parallel")
    train_iters: int = option("--train-iters", "optimisation", type=bounded(int, 1, INT32_MAX), default=100,
                              help="optimizer steps")
    optim: OptimConfig
    seed: int = option("--seed", "optimisation", type=bounded(int, 0, 2**32 - 1), default=1234,
                       help="weights and data order")
    fp32: bool = option("--fp32", "optimisation", action="store_true",
                        help="no bf16 autocast (the CPU always runs float32)")
    checkpoint: CheckpointConfig
    eval: EvalConfig
    log: LogConfig
    exit_after: Optional[int] = option("--exit-after", "checkpoints and logs", type=COUNT,
                                       help="stop (and save) after this iteration (none: at --train-iters)")

    @classmethod
    def sections(cls) -> dict[str, type[Section]]:
        hints = get_type_hints(cls)
        return {f.name: hints[f.name] for f in fields(cls) if "flag" not in f.metadata}

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TrainConfig:
        sections = cls.sections()
        return cls(**{f.name: sections[f.name].from_args(ns) if f.name in sections else getattr(ns, f.name)
                      for f in fields(cls)})

    @classmethod
    def parse(cls, argv: Optional[list[str]] = None) -> TrainConfig:
        return cls.from_args(build_parser().parse_args(argv))


def build_parser() -> argparse.ArgumentParser:
    """The sections' options and TrainConfig's own, in its field order, grouped as they say."""
    p = argparse.ArgumentParser(prog="qwen-data train", description=DESCRIPTION, epilog=VERBOSE_HELP,
                                formatter_class=DefaultsHelpFormatter)
    groups = {}
    sections = TrainConfig.sections()
    for f in fields(TrainConfig):
        section = sections.get(f.name)
        title = section.GROUP if section else f.metadata["group"]
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        if section:
            section.add_arguments(groups[title])
        else:
            add_option(groups[title], f)
    return p


def convert_parser() -> argparse.ArgumentParser:
    """`qwen-data convert` (convert.py: what it does)."""
    p = argparse.ArgumentParser(prog="qwen-data convert", epilog=VERBOSE_HELP, formatter_class=DefaultsHelpFormatter,
                                description="convert between a Hugging Face Qwen folder and a megatron-core "
                                            "dist_checkpointing checkpoint")
    sub = p.add_subparsers(dest="direction", required=True)
    a = sub.add_parser("hf-to-mcore", help="a Hugging Face Qwen folder → a checkpoint for --load",
                       formatter_class=DefaultsHelpFormatter)
    a.add_argument("hf_model", metavar="HF_DIR", help="a Hugging Face Qwen2/2.5/3 or Qwen3-MoE checkpoint folder")
    a.add_argument("checkpoint", metavar="CKPT", help="the checkpoint directory to write")
    b = sub.add_parser("mcore-to-hf", help="a checkpoint's latest iteration → a Hugging Face folder",
                       formatter_class=DefaultsHelpFormatter)
    b.add_argument("checkpoint", metavar="CKPT", help="a checkpoint directory (of --save or hf-to-mcore)")
    b.add_argument("hf_out", metavar="OUT", help="the Hugging Face folder to write")
    b.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="tokenizer files to put in OUT (default: the tokenizer the checkpoint names)")
    for s in (a, b):
        s.add_argument("--tp", type=COUNT, default=1, help="tensor-parallel size of this conversion")
        s.add_argument("--pp", type=COUNT, default=1, help="pipeline stages of this conversion (world size tp × pp)")
    return p
