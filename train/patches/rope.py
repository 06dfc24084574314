"""RoPE's cosine and sine as tables, not recomputed at every element.

megatron-core's rotary embedding (`_apply_rotary_pos_emb_bshd`, unfused) takes cos and sin of the
[s, 1, 1, d] angles inside each layer. Compiled, inductor inlines them into the kernels that rotate
the query and key: a float32 cosine and sine for every element of every head, forward and again in
backward. Here both are one custom op, opaque to inductor: two [s, 1, 1, d] tables a layer call,
which the rotation reads (the same numbers: cos and sin of the same angles, cast as megatron casts).

One H200, Qwen2.5-0.5B, micro batch 4, seq 4096: the query/key rotation's kernels 14.6 → 12.1 ms a
step, the step 285 → 282 ms; packed SFT's losses over 30 steps equal to the last digit logged
(bench/results/gpu/2026-11-30-small-mfu.md). Falls back to megatron-core's own off CUDA and for
interleaved or partial rotary embeddings.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import torch

from .replacing import replaced as _replaced


@torch.library.custom_op("qwen_data_train::rope_tables", mutates_args=())
def rope_tables(freqs: torch.Tensor, mscale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.cos(freqs) * mscale).to(dtype), (torch.sin(freqs) * mscale).to(dtype)


@rope_tables.register_fake
def _(freqs, mscale, dtype):
    return freqs.new_empty(freqs.shape, dtype=dtype), freqs.new_empty(freqs.shape, dtype=dtype)


@contextlib.contextmanager
def rope_from_tables() -> Iterator[None]:
    from megatron.core.models.common.embeddings import rope_utils

    original = rope_utils._apply_rotary_pos_emb_bshd

    names = list(inspect.signature(original).parameters)[2:]  # its options, in order (they differ by version)

    def apply(t, freqs, *args, **kwargs):
        options = {**dict(zip(names, args)), **kwargs}
        if any(options.get(k) for k in ("rotary_interleaved", "mla_rotary_interleaved", "multi_latent_attention")) \
                or not t.is_cuda or freqs.shape[-1] != t.shape[-1]:
            return original(t, freqs, *args, **kwargs)
        cos, sin = rope_tables(freqs, float(options.get("mscale", 1.0)), t.dtype)
        return t * cos + rope_utils._rotate_half(t, False) * sin

    with _replaced(rope_utils, "_apply_rotary_pos_emb_bshd", apply):
        yield
