"""What float32 masters under autocast cost.

The trainer keeps its weights in float32 and computes under bf16 autocast; megatron-core's own
runs keep bf16 weights and no autocast, and two of its pieces assume so. Every run of the trainer
needs these on any megatron-core version, for as long as it trains that way (`--fp32` and
checkpoint conversion run without autocast, where they change nothing).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import torch

from .replacing import replaced as _replaced


@contextlib.contextmanager
def float32_masters_under_autocast() -> Iterator[None]:
    with recompute_as_forward_ran(), moe_router_outside_autocast():
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
        not in force: with float32 weights under bf16 autocast it would recompute in float32.
        Inside the block it runs under the autocast its forward ran under.
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
def moe_router_outside_autocast() -> Iterator[None]:
    """megatron-core's MoE router computes its logits by an autograd function whose backward
    multiplies in its input's dtype: under autocast the forward's product ran in bf16, and the
    backward met a bf16 gradient beside a float32 weight ("expected mat1 and mat2 to have the same
    dtype"). Inside the block the router runs outside autocast, in float32 whatever the residual stream's
    dtype (its input cast, the product asked in float32: megatron-core's own casts forget Transformer
    Engine's GEMM), as it did when the stream was float32."""
    from megatron.core.transformer.moe import router

    original = router.router_gating_linear

    def gating(inp, weight, bias, router_dtype):
        with torch.autocast(inp.device.type, enabled=False):
            return original(inp.float(), weight, bias, torch.promote_types(router_dtype, torch.float32))

    with _replaced(router, "router_gating_linear", gating):
        yield
