"""The train loop: megatron-core model and parallel state, plain PyTorch around it.

    torchrun --nproc-per-node 8 -m train --data out/pretrain_blend.json --model qwen2.5-1.5b --tp 2 \
        --seq-length 4096 --micro-batch-size 2 --global-batch-size 64 --train-iters 2000 --save ckpt
    python -m train --data out/sft_blend.json --model tiny --train-iters 50        # one GPU, or the CPU

One step: fetch the step's micro-batches (timed: the data-loading share), count the step's trained
tokens over data parallelism, then per micro-batch forward under bf16 autocast (GPTModel returns the
unmasked per-token loss), loss = Σ(loss × loss_mask) / Σ loss_mask over the whole global batch,
backward; clip the global gradient norm (tensor-parallel shards counted once); AdamW; warmup + cosine.

Parallelism: tensor parallelism from megatron-core (`parallel_state`, the model's own TP layers),
data parallelism with torch DDP over megatron-core's data-parallel group. No pipeline parallelism.
Weights are float32 master weights, run in bf16 by autocast. Checkpoints are megatron-core
`dist_checkpointing` (torch_dist) directories, loadable under any TP/DP layout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

from .attention import document_mask
from .model import ATTENTION_CHOICES, PRESETS, build_model, patch_megatron_for_cpu, resolve_attention

# Dense bf16 peak of the chips we run on (datasheet), for MFU.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}
LATEST = "latest_checkpointed_iteration.txt"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train", description=__doc__.split("\n\n")[0],
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
    g.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    g.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (data parallel = world / tp)")
    g.add_argument("--sequence-parallel", action="store_true", help="with TP and Transformer Engine only")
    g.add_argument("--recompute", action="store_true", help="full activation recompute, one layer at a time")
    g.add_argument("--seq-length", type=int, default=4096)
    g = p.add_argument_group("optimisation")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch × data parallel")
    g.add_argument("--train-iters", type=int, default=100)
    g.add_argument("--lr", type=float, default=3e-4)
    g.add_argument("--min-lr", type=float, default=3e-5)
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
    g.add_argument("--eval-interval", type=int, default=0, help="0 = no evaluation")
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--log-json", default=None, help="append one JSON line per log interval here (rank 0)")
    g.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak per GPU for MFU (default: by name)")
    g.add_argument("--exit-after", type=int, default=None, help="stop (and save) after this iteration")
    return p


# ---------------------------------------------------------------------------------------------
# Setup


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(tp: int) -> torch.device:
    """torch.distributed (nccl on GPUs, gloo on the CPU; torchrun's environment or a lone process)
    and megatron-core's tensor/data-parallel groups."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        patch_megatron_for_cpu()
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group("nccl" if cuda else "gloo")
        else:
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}",
                                    rank=0, world_size=1)
    world = dist.get_world_size()
    if world % tp:
        raise ValueError(f"world size {world} is not a multiple of --tp {tp}")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    return device


def log0(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


@dataclass
class Schedule:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at `total` iterations."""

    lr: float
    min_lr: float
    warmup: int
    total: int

    def __call__(self, it: int) -> float:
        if it < self.warmup:
            return self.lr * (it + 1) / self.warmup
        progress = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, args) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases and norm weights (the 1-D parameters), as Megatron."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps,
                             fused=fused)


# ---------------------------------------------------------------------------------------------
# Data


class MicroBatches(torch.utils.data.Sampler):
    """Megatron's sample order: global batch after global batch from `consumed` on; each
    data-parallel rank takes its `micro_batch_size` slice of every run of mbs × dp samples."""

    def __init__(self, total: int, consumed: int, micro_batch_size: int, dp_rank: int, dp_size: int) -> None:
        self.total, self.consumed = total, consumed
        self.mbs, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __iter__(self) -> Iterator[list[int]]:
        stride = self.mbs * self.dp_size
        for start in range(self.consumed, self.total - stride + 1, stride):
            first = start + self.dp_rank * self.mbs
            yield list(range(first, first + self.mbs))

    def __len__(self) -> int:
        return max(0, (self.total - self.consumed) // (self.mbs * self.dp_size))


def make_loader(dataset, consumed: int, args, device: torch.device) -> Iterator[dict]:
    sampler = MicroBatches(len(dataset), consumed, args.micro_batch_size,
                           parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size())
    workers = args.num_workers
    return iter(DataLoader(dataset, batch_sampler=sampler, num_workers=workers, pin_memory=device.type == "cuda",
                           persistent_workers=workers > 0, prefetch_factor=4 if workers else None))


def build_data(args):
    from .data import build_datasets  # megatron datasets: imported late, only the loop needs them

    evaluations = args.train_iters // args.eval_interval + 1 if args.eval_interval else 0
    train_ds, valid_ds, _ = build_datasets(
        args.data, args.seq_length,
        train_samples=args.train_iters * args.global_batch_size,
        valid_samples=max(1, evaluations * args.eval_iters) * args.global_batch_size,
        test_samples=0,
        seed=args.seed, cache_dir=args.data_cache, split=args.split,
        reset_position_ids=args.reset_position_ids, reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
    )
    return train_ds, valid_ds


# ---------------------------------------------------------------------------------------------
# Forward


def thd_params(batch: dict) -> tuple[dict, PackedSeqParams]:
    """Transformer Engine's packed form: the micro-batch as one [1, b·s] row of variable-length
    sequences, cu_seqlens over all of them (padding positions are a sequence of their own)."""
    b, s = batch["tokens"].shape
    starts = []
    for row in range(b):
        cu = batch["cu_seqlens"][row]
        starts.append(cu[cu < s] + row * s)
    cu = torch.cat(starts + [torch.tensor([b * s], dtype=torch.int32)]).to(torch.int32)
    longest = int(batch["max_seqlen"].max())
    flat = {k: batch[k].reshape(1, b * s) for k in ("tokens", "labels", "loss_mask", "position_ids")}
    return flat, PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=longest, max_seqlen_kv=longest)


def forward(model, batch: dict, attention: str, device: torch.device, autocast: bool) -> torch.Tensor:
    """Per-token loss [b, s] (float32, unmasked) of one micro-batch (CPU tensors from the loader).

    Rows that hold several segments (packed SFT, or pretraining with --reset-attention-mask) get a
    document mask (sdpa) or THD packing (te); single-segment rows run plain causal attention.
    """
    packed = bool(batch["segment_ids"].amax() > 0)
    packed_seq_params = None
    if packed and attention == "te":
        batch, packed_seq_params = thd_params(batch)
        packed_seq_params = PackedSeqParams(**{k: (v.to(device) if torch.is_tensor(v) else v)
                                               for k, v in vars(packed_seq_params).items()})
    to = lambda name: batch[name].to(device, non_blocking=True)  # noqa: E731
    tokens, labels, position_ids = to("tokens"), to("labels"), to("position_ids")
    mask = None
    if packed and attention == "sdpa":
        mask = document_mask(to("segment_ids"))
    elif attention == "local":  # megatron's own attention: a dense [b, 1, s, s] mask, True = masked
        mask = ~document_mask(to("segment_ids")).dense()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(tokens, position_ids, mask, labels=labels, packed_seq_params=packed_seq_params)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients over the model-parallel group (a TP-replicated parameter
    counted once), scaled down to `max_norm` if above (0 = measure only)."""
    grads = [p.grad for p in params if p.grad is not None]
    unique = [p.grad for p in params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
    norm_sq = torch.stack(torch._foreach_norm(unique)).float().square().sum()
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(norm_sq, group=parallel_state.get_tensor_model_parallel_group())
    norm = norm_sq.sqrt()
    if max_norm > 0:
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


@torch.no_grad()
def evaluate(model, batches: Iterator[dict], iters: int, attention: str, device, autocast: bool) -> Optional[float]:
    model.eval()
    total = torch.zeros(2, device=device)
    for _ in range(iters):
        batch = next(batches, None)
        if batch is None:
            break
        mask = batch["loss_mask"].to(device)
        total += torch.stack([(forward(model, batch, attention, device, autocast) * mask).sum(), mask.sum()])
    model.train()
    dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return (total[0] / total[1]).item() if total[1] > 0 else None


# ---------------------------------------------------------------------------------------------
# Checkpoints (megatron-core dist_checkpointing: sharded, layout-independent)


def _sharded_state(core, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> dict:
    """Optimizer moments as sharded tensors shaped and sharded like their parameters."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optim_state_to_sharding_state(optim_sd, get_param_id_to_sharded_param_map(model_sd, params),
                                  exclude_keys=("step",))
    return {"model": model_sd, "optimizer": optim_sd}


def save_checkpoint(root: str, iteration: int, core, optimizer, consumed: int, args) -> None:
    if importlib.util.find_spec("psutil") is None:
        # megatron-core ≤0.16 writes from a child process that needs psutil; without it the
        # child dies and the save hangs forever instead of failing.
        raise RuntimeError("checkpointing needs psutil (pip install psutil)")
    path = os.path.join(root, f"iter_{iteration:07d}")
    if dist.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    dist.barrier()
    state = _sharded_state(core, optimizer, core.sharded_state_dict(), optimizer.state_dict())
    state.update(iteration=iteration, consumed_samples=consumed, model_name=args.model,
                 seq_length=args.seq_length, global_batch_size=args.global_batch_size)
    dist_checkpointing.save(state, path)
    dist.barrier()
    if dist.get_rank() == 0:
        with open(os.path.join(root, LATEST), "w") as f:
            f.write(str(iteration))
    log0(f"saved checkpoint {path}")


def load_checkpoint(root: str, core, optimizer, args) -> tuple[int, int]:
    """(iteration, consumed samples) of the latest checkpoint under `root`, or (0, 0) if none."""
    latest = os.path.join(root, LATEST)
    if not os.path.isfile(latest):
        log0(f"no checkpoint in {root}: starting from scratch")
        return 0, 0
    with open(latest) as f:
        path = os.path.join(root, f"iter_{int(f.read().strip()):07d}")
    # The template: fresh moment tensors (the optimizer has none before its first step).
    params = [p for g in optimizer.param_groups for p in g["params"]]
    template_optim = {"state": {i: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                                for i, p in enumerate(params)},
                      "param_groups": optimizer.state_dict()["param_groups"]}
    template = _sharded_state(core, optimizer, core.sharded_state_dict(), template_optim)
    state = dist_checkpointing.load(template, path)
    if state["model_name"] != args.model:
        raise ValueError(f"{path} holds a {state['model_name']} model, not {args.model}")
    core.load_state_dict(state["model"])
    steps = torch.tensor(float(state["iteration"]))  # every parameter is stepped every iteration
    optim = {"state": {i: {**s, "step": steps.clone()} for i, s in state["optimizer"]["state"].items()},
             "param_groups": state["optimizer"]["param_groups"]}
    optimizer.load_state_dict(optim)
    log0(f"resumed from {path} (iteration {state['iteration']}, {state['consumed_samples']} samples consumed)")
    return state["iteration"], state["consumed_samples"]


# ---------------------------------------------------------------------------------------------
# The loop


def peak_flops(device: torch.device, override_tflops: Optional[float]) -> Optional[float]:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def train(args) -> dict:
    device = init_distributed(args.tp)
    dp = parallel_state.get_data_parallel_world_size()
    args.global_batch_size = args.global_batch_size or args.micro_batch_size * dp
    if args.global_batch_size % (args.micro_batch_size * dp):
        raise ValueError(f"global batch {args.global_batch_size} is not a multiple of micro batch × DP "
                         f"({args.micro_batch_size} × {dp})")
    accumulation = args.global_batch_size // (args.micro_batch_size * dp)
    warmup = args.warmup_iters if args.warmup_iters is not None else max(1, args.train_iters // 100)
    attention = resolve_attention(args.attention)
    autocast = device.type == "cuda" and not args.fp32
    preset = PRESETS[args.model]

    torch.manual_seed(args.seed)  # the same weights on every rank and under every TP layout
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    core = build_model(preset, attention=attention, tensor_parallel=args.tp,
                       sequence_parallel=args.sequence_parallel, recompute=args.recompute,
                       max_sequence_length=args.seq_length).to(device)
    optimizer = build_optimizer(core, args)
    iteration, consumed = load_checkpoint(args.load, core, optimizer, args) if args.load else (0, 0)
    model = core
    if dp > 1:
        model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None,
                                        process_group=parallel_state.get_data_parallel_group())
    params = [p for p in core.parameters() if p.requires_grad]
    schedule = Schedule(args.lr, args.min_lr, warmup, args.train_iters)

    train_ds, valid_ds = build_data(args)
    batches = make_loader(train_ds, consumed, args, device)
    flops_per_token = preset.train_flops_per_token(args.seq_length)
    peak = peak_flops(device, args.peak_tflops)
    world = dist.get_world_size()
    log0(f"model {preset.name}: {preset.parameters() / 1e6:.1f}M parameters, attention {attention}, "
         f"TP {args.tp} × DP {dp}, micro batch {args.micro_batch_size} × {accumulation} accumulation, "
         f"global batch {args.global_batch_size} × seq {args.seq_length}, {len(train_ds)} train samples, "
         f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
         f"{'bf16 autocast' if autocast else 'float32'}")

    dp_group = parallel_state.get_data_parallel_group()
    window = {"loss": torch.zeros(2, device=device), "tokens": 0, "real": 0, "data": 0.0, "steps": 0}
    totals = {"tokens": 0, "real": 0, "data": 0.0, "time": 0.0, "steps": 0}
    pad = train_ds.config.tokenizer.pad
    history = []
    window_start = time.perf_counter()
    while iteration < args.train_iters:
        # Fetch the whole step first: the trained-token count normalises every micro-batch's loss.
        t0 = time.perf_counter()
        micro = [next(batches) for _ in range(accumulation)]
        window["data"] += time.perf_counter() - t0
        masks = [mb["loss_mask"].to(device, non_blocking=True) for mb in micro]
        trained = torch.stack([m.sum() for m in masks]).sum()
        dist.all_reduce(trained, group=dp_group)
        scale = dp / trained.clamp(min=1)  # DDP averages over DP: undo that, divide by the global count
        for i, (mb, mask) in enumerate(zip(micro, masks)):
            sync = model.no_sync() if dp > 1 and i < accumulation - 1 else contextlib.nullcontext()
            with sync:
                loss_sum = (forward(model, mb, attention, device, autocast) * mask).sum()
                (loss_sum * scale).backward()
            window["loss"] += torch.stack([loss_sum.detach(), mask.sum()])
            window["tokens"] += mb["tokens"].numel()
            window["real"] += int((mb["tokens"] != pad).sum())
        lr = schedule(iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        grad_norm = clip_grad_norm(params, args.clip_grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iteration += 1
        consumed += args.global_batch_size
        window["steps"] += 1

        # The first iteration is logged on its own: its loss is the starting point, its time the warm-up.
        if iteration % args.log_interval == 0 or iteration in (1, args.train_iters):
            loss = window["loss"].clone()
            dist.all_reduce(loss, group=dp_group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - window_start
            # Tokens of one model replica × DP = the job's tokens; per GPU for MFU.
            tokens = window["tokens"] * dp
            real = window["real"] * dp
            record = {
                "iteration": iteration, "loss": (loss[0] / loss[1]).item() if loss[1] > 0 else float("nan"),
                "lr": lr, "grad_norm": grad_norm.item(), "step_ms": 1000 * elapsed / window["steps"],
                "tokens_per_s": tokens / elapsed, "real_tokens_per_s": real / elapsed,
                "data_share": window["data"] / elapsed, "consumed_samples": consumed,
            }
            if peak:
                record["mfu"] = tokens * flops_per_token / elapsed / world / peak
            if device.type == "cuda":
                record["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            history.append(record)
            if len(history) > 1:  # the first window (iteration 1) holds compilation and warm-up
                for k, v in (("tokens", tokens), ("real", real), ("data", window["data"]), ("time", elapsed),
                             ("steps", window["steps"])):
                    totals[k] += v
            log0(format_record(record, args.train_iters))
            if args.log_json and dist.get_rank() == 0:
                with open(args.log_json, "a") as f:
                    f.write(json.dumps(record) + "\n")
            window = {"loss": torch.zeros(2, device=device), "tokens": 0, "real": 0, "data": 0.0, "steps": 0}
            window_start = time.perf_counter()

        if valid_ds is not None and args.eval_interval and iteration % args.eval_interval == 0:
            skip = (iteration // args.eval_interval - 1) * args.eval_iters * args.global_batch_size
            loss = evaluate(model, make_loader(valid_ds, skip, args, device), args.eval_iters * accumulation,
                            attention, device, autocast)
            log0(f"validation at iteration {iteration}: loss {loss:.4f}")
            window_start = time.perf_counter()
        stop = args.exit_after is not None and iteration >= args.exit_after
        if args.save and ((args.save_interval and iteration % args.save_interval == 0)
                          or iteration == args.train_iters or stop):
            save_checkpoint(args.save, iteration, core, optimizer, consumed, args)
            window_start = time.perf_counter()
        if stop:
            break

    summary = {"iterations": iteration, "history": history}
    if totals["time"] > 0:
        summary.update(tokens_per_s=totals["tokens"] / totals["time"],
                       real_tokens_per_s=totals["real"] / totals["time"],
                       data_share=totals["data"] / totals["time"])
        if peak:
            summary["mfu"] = totals["tokens"] * flops_per_token / totals["time"] / world / peak
        log0("steady state (after iteration 1): " + ", ".join(
            f"{k} {v:.4g}" for k, v in summary.items() if k not in ("history", "iterations")))
    if device.type == "cuda":
        log0(f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    return summary


def format_record(r: dict, total: int) -> str:
    parts = [f"iter {r['iteration']:>6}/{total}", f"loss {r['loss']:.4f}", f"lr {r['lr']:.2e}",
             f"grad {r['grad_norm']:.3f}", f"{r['step_ms']:.0f} ms/step", f"{r['tokens_per_s'] / 1e3:.1f}k tok/s",
             f"real {r['real_tokens_per_s'] / 1e3:.1f}k tok/s"]
    if "mfu" in r:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    parts.append(f"data {100 * r['data_share']:.2f}%")
    if "max_memory_gib" in r:
        parts.append(f"mem {r['max_memory_gib']:.1f} GiB")
    return " | ".join(parts)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).* not installed")
    try:
        train(args)
    finally:
        if dist.is_initialized():
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
