"""Backports from newer megatron-core, each applied only below the version that fixes it.

The version window is policy: megatron-core 0.17 on requires Python >= 3.12 (its wheels say
Requires-Python >=3.12), so CI, on Python 3.11, runs the floor, 0.16.1, and the GPU hosts run the
newest, 0.19.2; pyproject.toml allows >=0.16,<0.20. `FIXED_IN` names the version that fixes each
backport: below it the backport applies, from it on megatron-core's own code runs. Once the floor
in pyproject.toml reaches that version the backport is dead code, and tests/train/test_train_patches.py
fails until it is deleted.

megatron-core 0.20 (upstream main, d98e8a6): its routers take a padding mask, as they have since
0.16 (`TopKRouter.forward(input, padding_mask)`, from `MoELayer.route`); what changes after 0.19.0
is that `_apply_expert_bias` masks each token's row of the routing map (`(~padding_mask)
.unsqueeze(-1)`; 0.19 broadcast the token mask across the experts). The trainer passes no padding
mask, and neither function our router patches replace changes signature (`router_gating_linear(inp,
weight, bias, router_dtype)`, `TopKRouter.attach_and_log_load_balancing_loss(..., valid_token_count)`),
so 0.20 needs nothing of them. Should the trainer pass its loss mask as the padding mask (padded
tokens then neither route nor count toward the balance loss), `moe_balance_loss_over_tp_cp` already
takes the valid token count it passes, and expert bias (aux-loss-free balancing) needs 0.20.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

import torch

from .replacing import replaced as _replaced


@contextlib.contextmanager
def backports() -> Iterator[None]:
    """Every backport the installed megatron-core lacks."""
    installed = megatron_core_version()
    with contextlib.ExitStack() as stack:
        for backport, fixed_in in FIXED_IN.items():
            if installed < fixed_in:
                stack.enter_context(backport())
        yield


def megatron_core_version() -> tuple[int, int]:
    """(major, minor) of the installed megatron-core."""
    import megatron.core

    return tuple(int(part) for part in megatron.core.__version__.split(".")[:2])


@contextlib.contextmanager
def moe_router_without_transformer_engine() -> Iterator[None]:
    """megatron-core 0.16 imports `te_general_gemm` for its MoE router only where Transformer
    Engine imports, and then asks whether it is None: without TE the router fails with a NameError.
    Inside the block the name is None, as 0.17 defines it (nothing else changes)."""
    from megatron.core.transformer.moe import moe_utils

    if hasattr(moe_utils, "te_general_gemm"):
        yield
        return
    with _replaced(moe_utils, "te_general_gemm", None):
        yield


@contextlib.contextmanager
def single_process_rank() -> Iterator[None]:
    """megatron-core before 0.18 calls torch.distributed.get_rank() unguarded when it writes a
    BlendedDataset cache; inside the block a process outside any process group is rank 0 (asked at
    each call, so a group initialised inside the block answers for itself)."""
    dist = torch.distributed
    original = dist.get_rank

    def get_rank(group=None):
        return original(group) if dist.is_available() and dist.is_initialized() else 0

    with _replaced(dist, "get_rank", get_rank):
        yield


@contextlib.contextmanager
def moe_balance_loss_over_tp_cp() -> Iterator[None]:
    """With a per-token loss, megatron-core attaches a layer's load-balancing loss times the tokens
    the rank holds. Under sequence or context parallelism a rank holds 1/(TP × CP) of them, and
    before 0.19 nothing made up for it: the loss's gradient was that much smaller than in one
    process (tiny-qwen3-moe under TP 2 or CP 2: gradient norm 7e-4 apart at step 2, tokens routed
    apart from step 2 on). 0.19 multiplies by the group's size; inside the block earlier versions
    attach the rest of that multiple too (what they log is unchanged)."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
    from megatron.core.transformer.moe.router import TopKRouter

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


# The (major, minor) megatron-core version that fixes each backport.
FIXED_IN: dict[Callable[[], ContextManager[None]], tuple[int, int]] = {
    moe_router_without_transformer_engine: (0, 17),
    single_process_rank: (0, 18),
    moe_balance_loss_over_tp_cp: (0, 19),
}
