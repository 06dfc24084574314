"""megatron-core's linear layers accumulating their weight's gradient into its float32 `main_grad`
by the matmul that makes it (`train.kernels.linear_accumulating`), for the weights that have one:
the bf16 weights split from their float32 masters where no data-parallel wrapper reduces their
gradients as backward makes them (distributed.data_parallel marks them). Every other linear, and
any with a bias, tensor-parallel communication, a deferred or gathered weight gradient, runs
megatron-core's own function, unchanged.

Where a bf16 product was written and then added to the float32 gradient in a pass of its own
(10 bytes a weight a micro-batch), the product's epilogue reads and writes the float32 gradient.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .replacing import replaced as _replaced


@contextlib.contextmanager
def weight_gradients_accumulated() -> Iterator[None]:
    from megatron.core.tensor_parallel import layers

    from .. import kernels

    original = layers.linear_with_grad_accumulation_and_async_allreduce

    def linear(input, weight, bias=None, gradient_accumulation_fusion=False, allreduce_dgrad=False,
               sequence_parallel=False, grad_output_buffer=None, *args, **kwargs):
        main_grad = getattr(weight, "main_grad", None)
        if (main_grad is None or bias is not None or allreduce_dgrad or sequence_parallel
                or grad_output_buffer is not None or kwargs.get("gtp_remat_size", 1) != 1):
            return original(input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel,
                            grad_output_buffer, *args, **kwargs)
        return kernels.linear_accumulating(input, weight, main_grad)

    linear.warned = False  # megatron-core's function reads and sets it on whatever its module's name holds
    with _replaced(layers, "linear_with_grad_accumulation_and_async_allreduce", linear):
        yield
