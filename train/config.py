"""The command line and the typed configuration it becomes, once, before anything runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Optional

from .model import ATTENTION_CHOICES, COMPILE_CHOICES, PRESETS
from .loss import CROSS_ENTROPY_CHOICES

DESCRIPTION = "Train Qwen-architecture megatron-core GPTModels on qwen-data prefixes."


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen-data train", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", required=True, help="a `qwen-data blend` JSON, a Megatron blend, or one prefix")
    g.add_argument("--split", default=None, help="Megatron split (e.g. 98,2,0) for blends without their own")
    g.add_argument("--data-cache", default=None, help="where megatron-core caches sample indices")
    g.add_argument("--num-workers", type=int, default=2, help="DataLoader workers per rank")
    g.add_argument("--reset-position-ids", action="store_true", help="pretraining: positions restart after EOD")
    g.add_argument("--reset-attention-mask", action="store_true",
                   help="pretraining: documents in a row never attend to each other (document mask)")
    g.add_argument("--eod-mask-loss", action="store_true", help="pretraining: no loss on predicting from EOD")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None, choices=sorted(PRESETS),
                   help="a preset shape with random weights (default: tiny, unless --hf-model or the --load "
                        "checkpoint gives the model)")
    g.add_argument("--hf-model", default=None, metavar="DIR",
                   help="start from this Hugging Face Qwen2/2.5/3 dense checkpoint folder (its config.json "
                        "gives the shape)")
    g.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES)
    g.add_argument("--cross-entropy", default="fused", choices=CROSS_ENTROPY_CHOICES,
                   help="fused: output layer and loss by chunks, no logits kept (train/loss.py); megatron: "
                        "megatron-core's output layer, then its cross-entropy over the float32 logits")
    g.add_argument("--compile", default="auto", choices=("auto",) + COMPILE_CHOICES,
                   help="swiglu: megatron-core's compiled SwiGLU; layers: also torch.compile each transformer "
                        "layer; auto: layers on CUDA (swiglu with --sequence-parallel), none on the CPU")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (data parallel = world / (tp × pp))")
    g.add_argument("--pp", type=int, default=1,
                   help="pipeline-parallel size: the layers split evenly over pp stages, 1F1B schedule")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: activations outside attention and MLP split over the TP ranks along the sequence")
    g.add_argument("--recompute", action="store_true", help="full activation recompute, one layer at a time")
    g.add_argument("--seq-length", type=int, default=4096)
    g = p.add_argument_group("optimisation")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch × data parallel")
    g.add_argument("--train-iters", type=int, default=100)
    g.add_argument("--lr", type=float, default=3e-4)
    g.add_argument("--min-lr", type=float, default=None, help="default: lr / 10")
    g.add_argument("--warmup-iters", type=int, default=None, help="default: 1%% of train iters, at least 1")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0, help="0 = no clipping")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--fp32", action="store_true", help="no bf16 autocast (the CPU always runs float32)")
    g = p.add_argument_group("checkpoints and logs")
    g.add_argument("--save", default=None, help="checkpoint directory")
    g.add_argument("--save-interval", type=int, default=0, help="0 = only at the end")
    g.add_argument("--load", default=None, help="resume from this checkpoint directory (its latest iteration)")
    g.add_argument("--save-hf", default=None, metavar="OUT",
                   help="also save as a Hugging Face folder: OUT at the end, OUT/iter_N at each --save-interval")
    g.add_argument("--eval-interval", type=int, default=0, help="0 = no evaluation")
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--log-json", default=None, help="append one JSON line per log interval here (rank 0)")
    g.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak per GPU for MFU (default: by name)")
    g.add_argument("--exit-after", type=int, default=None, help="stop (and save) after this iteration")
    return p


@dataclass(frozen=True)
class DataConfig:
    path: str  # --data
    split: Optional[str]
    data_cache: Optional[str]
    num_workers: int
    reset_position_ids: bool
    reset_attention_mask: bool
    eod_mask_loss: bool


@dataclass(frozen=True)
class ModelConfig:
    name: Optional[str]  # --model: a key of PRESETS
    hf_model: Optional[str]  # a Hugging Face folder to start from
    attention: str  # as asked ("auto" included); the trainer resolves it
    cross_entropy: str  # CROSS_ENTROPY_CHOICES
    compile: str  # as asked ("auto" included); the trainer resolves it
    tp: int
    pp: int
    sequence_parallel: bool
    recompute: bool


@dataclass(frozen=True)
class OptimConfig:
    lr: float
    min_lr: float
    warmup_iters: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float  # 0 = measure the norm only


@dataclass(frozen=True)
class CheckpointConfig:
    save: Optional[str]
    save_interval: int  # 0 = only at the end (and at --exit-after)
    load: Optional[str]
    save_hf: Optional[str]


@dataclass(frozen=True)
class EvalConfig:
    eval_interval: int  # 0 = no evaluation
    eval_iters: int  # global batches per evaluation


@dataclass(frozen=True)
class LogConfig:
    log_interval: int
    log_json: Optional[str]
    peak_tflops: Optional[float]


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run is told, in the sections of `--help`. Frozen: what depends on the ranks
    (the default global batch) is worked out by the trainer (`distributed.Layout`)."""

    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    checkpoint: CheckpointConfig
    eval: EvalConfig
    log: LogConfig
    seq_length: int
    micro_batch_size: int
    global_batch_size: Optional[int]  # None: one micro-batch per data-parallel rank
    train_iters: int
    seed: int
    fp32: bool
    exit_after: Optional[int]

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TrainConfig:
        if ns.model and ns.hf_model:
            raise SystemExit("qwen-data train: give --model or --hf-model, not both")
        warmup = ns.warmup_iters if ns.warmup_iters is not None else max(1, ns.train_iters // 100)
        sections = dict(
            data=_section(DataConfig, ns, path=ns.data),
            model=_section(ModelConfig, ns, name=ns.model),
            optim=_section(OptimConfig, ns, warmup_iters=warmup,
                           min_lr=ns.lr / 10 if ns.min_lr is None else ns.min_lr),
            checkpoint=_section(CheckpointConfig, ns),
            eval=_section(EvalConfig, ns),
            log=_section(LogConfig, ns),
        )
        return cls(**sections, **{f.name: getattr(ns, f.name) for f in fields(cls) if f.name not in sections})

    @classmethod
    def parse(cls, argv: Optional[list[str]] = None) -> TrainConfig:
        return cls.from_args(build_parser().parse_args(argv))


def _section(cls, ns: argparse.Namespace, **given):
    """A config section: each field from the flag of the same name unless `given`."""
    return cls(**{f.name: given[f.name] if f.name in given else getattr(ns, f.name) for f in fields(cls)})
