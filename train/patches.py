"""Scoped stand-ins for what megatron-core assumes of a run: CUDA, a process group, and weights
in the dtype they run in.

Each is a context manager that restores what it replaced on exit, so nothing outside the
`with` block (another test, a later GPU run in the same process) sees a patched library.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block; afterwards exactly what it was (an attribute the
    owner only inherited is removed again, not frozen into an own copy)."""
    own = vars(owner)
    had_own, original = name in own, own.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


class _TorchOnCpu:
    """`torch` as megatron-core's pipeline schedules see it inside `megatron_on_cpu`: what they
    make on "cuda" is made on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Let megatron-core's local spec build, run and checkpoint on a machine without CUDA
    (smoke tests, CI); does nothing where CUDA is available.

    megatron-core asks `torch.cuda.current_device()` for the device of RoPE's inverse frequencies,
    of its global memory buffer and of pipeline messages, forks the CUDA RNG tracker around
    dropout and keeps the CUDA generator's state for activation recompute, and dist_checkpointing
    synchronises CUDA before writing: inside the block these point
    at the CPU or do nothing.
    """
    if torch.cuda.is_available():
        yield
        return
    from megatron.core import tensor_parallel
    from megatron.core.models.common.embeddings import rotary_pos_embedding
    from megatron.core.pipeline_parallel import schedules

    with contextlib.ExitStack() as stack:
        # Under context parallelism RoPE keeps this rank's positions, picked by an index tensor
        # made in pinned memory, which needs CUDA.
        stack.enter_context(_replaced(rotary_pos_embedding, "get_pos_emb_on_this_cp_rank", _pos_emb_on_this_cp_rank))
        stack.enter_context(_replaced(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(_replaced(torch.cuda, "synchronize", lambda device=None: None))
        # Tied embeddings over pipeline stages: the stages agree on the weight with `.cuda()` then
        # an all-reduce; the schedules count tokens in a tensor made on "cuda".
        stack.enter_context(_replaced(torch.Tensor, "cuda", lambda self, *args, **kwargs: self))
        stack.enter_context(_replaced(schedules, "torch", _TorchOnCpu()))
        stack.enter_context(_replaced(tensor_parallel.get_cuda_rng_tracker(), "fork",
                                      lambda *args, **kwargs: contextlib.nullcontext()))
        # Activation recompute saves and restores the CUDA generator's state around the forward.
        stack.enter_context(_replaced(tensor_parallel.random, "_get_cuda_rng_state", lambda *args, **kwargs: None))
        stack.enter_context(_replaced(tensor_parallel.random, "_set_cuda_rng_state", lambda *args, **kwargs: None))
        yield


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group) -> torch.Tensor:
    from .attention import context_positions

    return pos_emb.index_select(seq_dim, context_positions(pos_emb.shape[seq_dim], cp_group.rank(), cp_group.size()))


@contextlib.contextmanager
def single_process_rank() -> Iterator[None]:
    """megatron-core ≤0.17 calls torch.distributed.get_rank() unguarded when it writes a
    BlendedDataset cache; a process outside any process group is rank 0."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        yield
        return
    with _replaced(dist, "get_rank", lambda group=None: 0):
        yield


def _as_forward_ran(function: Callable, autocast: tuple | None, arguments: tuple, *tensors):
    """`function` on `arguments`, the tensors among them replaced by `tensors`, under `autocast`
    ((device type, dtype), or None)."""
    given = iter(tensors)
    arguments = [next(given) if _saveable(a) else a for a in arguments]
    with torch.autocast(*autocast) if autocast else contextlib.nullcontext():
        return function(*arguments)


def _saveable(argument) -> bool:
    return argument is None or isinstance(argument, torch.Tensor)


@contextlib.contextmanager
def recompute_as_forward_ran() -> Iterator[None]:
    """megatron-core's activation recompute (`tensor_parallel.checkpoint`: --recompute full, and
    selective's modules), as the trainer's forward runs:
      - the recompute runs during backward, on autograd's thread, where the forward's autocast is
        not in force: with float32 weights under bf16 autocast, as the trainer keeps them, it would
        recompute in float32. Inside the block it runs under the autocast its forward ran under.
        (megatron-core's own runs keep bf16 weights and no autocast.)
      - it keeps its arguments with save_for_backward, which takes tensors only: the others (the
        document mask of packed rows) are bound into the function instead."""
    from megatron.core import tensor_parallel

    original = tensor_parallel.checkpoint

    def checkpoint(function, distribute_saved_activations, *args):
        autocast = next(((device, torch.get_autocast_dtype(device)) for device in ("cuda", "cpu")
                         if torch.is_autocast_enabled(device)), None)
        tensors = [a for a in args if _saveable(a)]
        return original(functools.partial(_as_forward_ran, function, autocast, args),
                        distribute_saved_activations, *tensors)

    with _replaced(tensor_parallel, "checkpoint", checkpoint):
        yield


@contextlib.contextmanager
def moe_router_without_transformer_engine() -> Iterator[None]:
    """megatron-core 0.16 imports `te_general_gemm` for its MoE router only where Transformer
    Engine imports, and then asks whether it is None: without TE the router fails with a NameError.
    Inside the block the name is None, as megatron-core 0.19 defines it (nothing else changes)."""
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        yield
        return
    with _replaced(moe_utils, "te_general_gemm", None):
        yield


@contextlib.contextmanager
def moe_router_outside_autocast() -> Iterator[None]:
    """megatron-core's MoE router computes its logits by an autograd function whose backward
    multiplies in its input's dtype: under autocast the forward's product ran in bf16, and the
    backward met a bf16 gradient beside a float32 weight ("expected mat1 and mat2 to have the same
    dtype"). Inside the block the router runs outside autocast, in its input's dtype (float32 with
    the trainer's float32 weights), as transformers' router runs in the model's dtype."""
    from megatron.core.transformer.moe import router

    original = router.router_gating_linear

    def gating(inp, weight, bias, router_dtype):
        with torch.autocast(inp.device.type, enabled=False):
            return original(inp, weight, bias, router_dtype)

    with _replaced(router, "router_gating_linear", gating):
        yield


@contextlib.contextmanager
def moe_balance_loss_over_tp_cp() -> Iterator[None]:
    """With a per-token loss, megatron-core attaches a layer's load-balancing loss times the tokens
    the rank holds. Under sequence or context parallelism a rank holds 1/(TP × CP) of them, and
    before 0.19 nothing made up for it: the loss's gradient was that much smaller than in one
    process (tiny-qwen3-moe under TP 2 or CP 2: gradient norm 7e-4 apart at step 2, tokens routed
    apart from step 2 on). 0.19 multiplies by the group's size; inside the block earlier versions
    attach the rest of that multiple too (what they log is unchanged)."""
    import megatron.core
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    from megatron.core.transformer.moe.router import TopKRouter

    if tuple(int(part) for part in megatron.core.__version__.split(".")[:2]) >= (0, 19):
        yield
        return
    original = TopKRouter.attach_and_log_load_balancing_loss

    def attach(self, activation, aux_loss_coeff, aux_loss, *args, valid_token_count=None, **kwargs):
        activation = original(self, activation, aux_loss_coeff, aux_loss, *args,
                              valid_token_count=valid_token_count, **kwargs)
        rest = self.tp_cp_group.size() - 1
        if self.calculate_per_token_loss and rest:
            tokens = valid_token_count if valid_token_count is not None else activation.shape[0]
            activation = MoEAuxLossAutoScaler.apply(activation, aux_loss * tokens * rest)
        return activation

    with _replaced(TopKRouter, "attach_and_log_load_balancing_loss", attach):
        yield
