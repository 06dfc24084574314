"""Process groups: torch.distributed (nccl on GPUs, gloo on the CPU) and megatron-core's
tensor/pipeline/data-parallel groups (of the sizes the plan settled: `plan.RunPlan`), the
data-parallel wrapper, and the gradient reductions across them that a step needs besides DDP's."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from typing import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel as MegatronDDP
from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from . import marks
from .marks import is_expert_parallel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(tp: int, pp: int = 1, ep: int = 1, cp: int = 1) -> torch.device:
    """Join torchrun's process group (or make one of a lone process), set up megatron-core's
    groups (`ep`: expert parallelism within each data-parallel group; `cp`: context parallelism,
    ranks that share their micro-batches' rows); → this rank's device."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        # Segments that grow in place instead of blocks of fixed sizes: a 7B pipeline stage peaks at
        # 74 of an H100's 79 GiB, where fixed blocks fragmented until a step ran out of memory.
        # torch reads it once, when the caching allocator first starts (after this); a user's own setting stands.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # the rank's device named: torch 2.11 warned at every barrier (megatron-core's dataset builder's
        # included) that it guessed it, on stderr, which the GPU tests refuse
        backend = {"backend": "nccl", "device_id": device} if cuda else {"backend": "gloo"}
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(**backend)
        else:
            dist.init_process_group(**backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    # The sizes fit the world: plan.RULES (megatron-core refuses what does not, in its own words).
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             context_parallel_size=cp, expert_model_parallel_size=ep)
    return device


@contextlib.contextmanager
def distributed(tp: int, pp: int = 1, ep: int = 1, cp: int = 1) -> Iterator[torch.device]:
    """`init_distributed` for the block; the groups are torn down after it.

    A rank that fails in a job of several processes prints its error and ends at once instead:
    tearing NCCL's groups down waits for the device, whose pending transfers wait for ranks that
    will never send (a pipeline stage out of memory hung the job). torchrun then ends the others."""
    try:
        yield init_distributed(tp, pp, ep, cp)
    except (Exception, KeyboardInterrupt) as exc:
        if dist.is_initialized() and dist.get_world_size() > 1:
            _end_now(exc)
        raise
    finally:
        if dist.is_initialized():
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def _end_now(exc: BaseException) -> None:
    """End this rank of a job of several processes at once, saying why: a refusal (ValueError) in
    one line and exit status 2, as `qwen-data` says it, anything else with its traceback."""
    rank = dist.get_rank()
    if isinstance(exc, KeyboardInterrupt):
        print(f"rank {rank}: interrupted", file=sys.stderr)
    elif isinstance(exc, ValueError):
        print(f"rank {rank}: error: {exc}", file=sys.stderr)
    else:
        print(f"rank {rank} failed:", file=sys.stderr)
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130 if isinstance(exc, KeyboardInterrupt) else 2 if isinstance(exc, ValueError) else 1)


def is_rank0() -> bool:
    return dist.get_rank() == 0


def log0(*args) -> None:
    if is_rank0():
        print(*args, flush=True)


def gradient_group():
    """Data-parallel ranks and, with them, context-parallel ones: each holds part of the step's
    loss, and a parameter's gradient is averaged over all of them."""
    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def data_parallel(core: torch.nn.Module, plan, device: torch.device) -> torch.nn.Module:
    """The model as the step runs it, for the plan's data-parallel kind (`plan.RunPlan.data_parallel`,
    and its overlap options):
      megatron  megatron-core's DistributedDataParallel (contiguous float32 gradient buckets,
                reduce-scattered for the DistributedOptimizer; its finalize_model_grads does every
                reduction a step needs);
      torch     torch DDP (all-reduce overlapping backward): DP × CP > 1 without pipeline stages;
      none      the model itself (`reduce_grads` after the schedule)."""
    kind = plan.data_parallel
    if kind == "megatron":
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True,
                                            overlap_grad_reduce=plan.overlap_grad_reduce,
                                            overlap_param_gather=plan.overlap_param_gather)
        model = MegatronDDP(config=core.config, ddp_config=ddp, module=core)
        core.config.no_sync_func = model.no_sync  # the schedule: reduce only after the last micro-batch
        core.config.finalize_model_grads_func = finalize_model_grads
        return model
    if kind == "none":
        return core
    # What DDP never sees is reduced apart: an expert-parallel rank's experts (over their own group, by
    # `reduce_grads`) and the float32 gradients of bf16 weights split from their masters (`SplitGradReduction`).
    split = [p for p in core.parameters() if marks.float32_grad(p) is not None]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        core, [name for name, p in core.named_parameters()
               if is_expert_parallel(p) or marks.float32_grad(p) is not None])
    model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None,
                                    process_group=gradient_group())
    core.config.no_sync_func = model.no_sync  # megatron-core's schedules hold gradient sync with it
    model.split_grad_reduction = SplitGradReduction(model, split) if split else None  # read by reduce_grads
    return model


class SplitGradReduction:
    """Under torch's DDP, the float32 gradients of split bf16 weights averaged over `gradient_group`
    during the backward of the step's last micro-batch, each as soon as it is whole, as DDP overlaps
    its own reduction (averaged after backward, Qwen2.5-3B over two H200s ran 2% slower:
    docs/performance.md, "bf16 weights by default"). A gradient backward does not make (the output
    weight's, which the fused cross-entropy adds to itself) is left to `finish`'s caller."""

    def __init__(self, ddp: DistributedDataParallel, params: list[torch.nn.Parameter]) -> None:
        self.ddp = ddp
        self.pending: list[tuple[torch.nn.Parameter, dist.Work]] = []
        for p in params:  # after optimizer.AdamW's hook, which adds the bf16 gradient to the float32 one
            p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p: torch.nn.Parameter) -> None:
        if self.ddp.require_backward_grad_sync:  # False inside no_sync: a micro-batch before the last
            self.pending.append((p, dist.all_reduce(marks.float32_grad(p), group=gradient_group(), async_op=True)))

    def finish(self) -> set[torch.nn.Parameter]:
        """Wait for the reductions backward started and average them; → their parameters."""
        for _, work in self.pending:
            work.wait()
        done = [p for p, _ in self.pending]
        if done:
            torch._foreach_div_([marks.float32_grad(p) for p in done], float(dist.get_world_size(gradient_group())))
        self.pending = []
        return set(done)


@contextlib.contextmanager
def whole_parameters(model: torch.nn.Module) -> Iterator[None]:
    """Every parameter up to date inside the block (checkpoints, exports read them): with
    overlapped gathering, megatron-core's DDP brings a parameter's update in only when the next
    forward reaches it, so the gathers are finished first and the hooks put back after."""
    if not (isinstance(model, MegatronDDP) and model.ddp_config.overlap_param_gather):
        yield
        return
    model.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        model.enable_forward_pre_hook()


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside a data-parallel wrapper."""
    return model.module if isinstance(model, (DistributedDataParallel, MegatronDDP)) else model


# ---------------------------------------------------------------------------------------------
# Gradient reductions after a step's backward

BUCKET_ELEMENTS = 1 << 25  # gradient elements all-reduced at a time (128 MB of float32)


def all_reduce_grads(grads: list[torch.Tensor], group, divide_by: int = 1) -> None:
    """Sum `grads` over `group` (then divide), in place, as flat buckets of BUCKET_ELEMENTS."""
    bucket: list[torch.Tensor] = []
    elements = 0
    for grad in grads + [None]:  # None: the end, which sends the last bucket
        if bucket and (grad is None or elements + grad.numel() > BUCKET_ELEMENTS):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=group)
            if divide_by > 1:
                flat /= divide_by
            for g, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                g.copy_(reduced)
            bucket, elements = [], 0
        if grad is not None:
            bucket.append(grad)
            elements += grad.numel()


def average_data_parallel_grads(params: list[torch.nn.Parameter]) -> None:
    """Gradients (a split weight's float32 one: marks.gradient) averaged over `gradient_group`: what
    torch DDP does during backward, done after a pipeline schedule instead. (DDP prepares its
    reduction in forward, and 1F1B runs the last micro-batches' forwards before it lets gradients
    sync, so under DDP those would never be reduced.)"""
    group = gradient_group()
    size = dist.get_world_size(group)
    if size > 1:
        grads = [marks.gradient(p) for p in params if not is_expert_parallel(p)]
        all_reduce_grads([g for g in grads if g is not None], group, divide_by=size)


def average_expert_grads(params: list[torch.nn.Parameter]) -> None:
    """Gradients of expert-parallel parameters (whose tokens came from every rank of their expert-
    parallel group) summed over the ranks holding the same experts, then divided by the ranks the
    other gradients are averaged over (data × context parallel)."""
    experts = [p.grad for p in params if p.grad is not None and is_expert_parallel(p)]
    if experts:
        all_reduce_grads(experts, parallel_state.get_expert_data_parallel_group(),
                         divide_by=dist.get_world_size(gradient_group()))


def sum_partial_grads(core) -> None:
    """Gradients of parameters every tensor-parallel rank holds whole but sees only part of the
    work of, summed over the TP group (as megatron-core's finalize_model_grads does): Qwen3's QK
    norms (a rank normalises only its own heads) and, under sequence parallelism, the layer norms
    (a rank sees only its part of the sequence). Left alone, those copies would drift apart."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    sequence_parallel = core.config.sequence_parallel
    all_reduce_grads([p.grad for name, p in core.named_parameters()
                      if p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name
                                                 or (sequence_parallel and marks.is_sequence_parallel(p)))],
                     parallel_state.get_tensor_model_parallel_group())


def sync_tied_embedding_grads(core) -> None:
    """With tied embeddings split over pipeline stages, the first stage's embedding and the last
    stage's output layer are two copies of one weight: their gradients are summed, so both take
    the same step."""
    if (parallel_state.get_pipeline_model_parallel_world_size() > 1 and core.share_embeddings_and_output_weights
            and parallel_state.is_rank_in_embedding_group()):
        weight = core.shared_embedding_or_output_weight()
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


def reduce_grads(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
    """A step's gradients made whole after the schedule: averaged over data parallelism but for those
    torch's DDP `model` averaged during backward (its own, and the split weights' float32 ones its
    `SplitGradReduction` did), experts' over their own group, then the TP-partial and tied-embedding
    sums."""
    core, left = unwrapped(model), params
    if isinstance(model, DistributedDataParallel):
        done = model.split_grad_reduction.finish() if model.split_grad_reduction else set()
        left = [p for p in params if marks.float32_grad(p) is not None and p not in done]
    average_data_parallel_grads(left)
    average_expert_grads(params)
    sum_partial_grads(core)
    sync_tied_embedding_grads(core)
