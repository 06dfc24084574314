"""The marks the trainer sets on parameters and on the model, and reads elsewhere: each named once,
here, with the one function that sets it and the one that reads it (megatron-core keeps its own,
`tensor_model_parallel`, `allreduce`, `shared_embedding`, on its layers; the ones we read of those
are read here too).

The attribute names are part of the contract: megatron-core reads `sequence_parallel` itself
(finalize_model_grads, DistributedDataParallel), so the names stay what it expects.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

FLOAT32_GRAD = "float32_grad"  # a bf16 weight split from its float32 master: its float32 gradient
LOW_BITS = "low"  # that weight's other 16 bits (optimizer.split_float32)
SEQUENCE_PARALLEL = "sequence_parallel"  # a norm of the sequence-split stream: its gradient summed over TP
BALANCE_LOSS = "balance_loss"  # on the model: model/balance.py's BalanceLoss its routers share
LAYER_OFFSET = "layer_offset"  # on the model: the layers the pipeline stages before this rank's hold
EXPERT_ALLREDUCE = "allreduce"  # megatron-core's: False on the experts this expert-parallel rank holds alone
SHARED_EMBEDDING = "shared_embedding"  # megatron-core's: the last stage's copy of tied embeddings


def mark_float32_grad(param: torch.nn.Parameter, grad: Optional[torch.Tensor]) -> None:
    setattr(param, FLOAT32_GRAD, grad)


def float32_grad(param: torch.Tensor) -> Optional[torch.Tensor]:
    """The float32 gradient a split bf16 weight adds its gradients to; None: an ordinary parameter."""
    return getattr(param, FLOAT32_GRAD, None)


def gradient(param: torch.Tensor) -> Optional[torch.Tensor]:
    """The gradient `param` is stepped by: a split bf16 weight's float32 one, else its .grad."""
    grad = float32_grad(param)
    return param.grad if grad is None else grad


def mark_low_bits(param: torch.nn.Parameter, low: Optional[torch.Tensor]) -> None:
    setattr(param, LOW_BITS, low)


def low_bits(param: torch.nn.Parameter) -> Optional[torch.Tensor]:
    """The 16 bits a split weight's float32 master has besides its bf16 part; None: joined or not split."""
    return getattr(param, LOW_BITS, None)


def mark_sequence_parallel(param: torch.nn.Parameter, value: bool) -> None:
    setattr(param, SEQUENCE_PARALLEL, value)


def is_sequence_parallel(param: torch.nn.Parameter) -> bool:
    """A parameter whose gradient each tensor-parallel rank computes from its part of the sequence."""
    return getattr(param, SEQUENCE_PARALLEL, False)


def mark_balance_loss(model: torch.nn.Module, balance: Any) -> None:
    setattr(model, BALANCE_LOSS, balance)


def balance_loss(model: torch.nn.Module) -> Optional[Any]:
    """The load-balancing loss build_model installed (`balance.install`) on the model, unwrapped; None: none."""
    return getattr(model, BALANCE_LOSS, None)


def is_expert_parallel(param: torch.nn.Parameter) -> bool:
    """A parameter of the experts this expert-parallel rank holds alone (megatron-core's mark)."""
    return not getattr(param, EXPERT_ALLREDUCE, True)


def is_shared_embedding(param: torch.nn.Parameter) -> bool:
    """The last pipeline stage's copy of tied embeddings (megatron-core's mark)."""
    return getattr(param, SHARED_EMBEDDING, False)


def mark_layer_offset(model: torch.nn.Module, offset: int) -> None:
    setattr(model, LAYER_OFFSET, offset)


def layer_offset(model: torch.nn.Module) -> int:
    """Layer k of this stage's model is the whole model's layer `layer_offset(model) + k`."""
    return getattr(model, LAYER_OFFSET)
