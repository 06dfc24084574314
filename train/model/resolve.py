"""What runs here: the core attention `auto` picks, and whether an FP8 recipe can."""

from __future__ import annotations

import torch

from ..attention import have_transformer_engine
from ..config import ATTENTION_CHOICES, FP8_RECIPES

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
