"""The MLP's SwiGLU by `train.kernels.swiglu` (a Triton forward and a backward that loads each
input once) where the kernels run: on CUDA, without a bias, fp8 input store or CPU offload.
Elsewhere megatron-core's own function, unchanged.

One H200, Qwen2.5-0.5B, micro batch 4, seq 4096: the backward's 48 calls 16.1 -> 9.3 ms a step (283 -> 198 us
a call, 4.0 TB/s), the forward unchanged (5.3 -> 5.6 ms); outputs and gradients bitwise those of
megatron-core's function compiled (bench/results/gpu/2026-11-30-small-mfu-kernels.md).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .replacing import replaced as _replaced


@contextlib.contextmanager
def swiglu_kernels() -> Iterator[None]:
    from megatron.core.transformer import mlp

    from .. import kernels

    original = mlp.bias_swiglu_impl

    def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
        if bias is not None or fp8_input_store or cpu_offload_input or not kernels.enabled(input):
            return original(input, bias, fp8_input_store, cpu_offload_input)
        return kernels.swiglu(input.contiguous())

    with _replaced(mlp, "bias_swiglu_impl", bias_swiglu_impl):
        yield
