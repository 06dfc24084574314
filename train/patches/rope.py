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

`fused_qkv_rope` goes further where the model asks for megatron-core's `fused_single_qkv_rope`
(model/transformer.py: CUDA, no QK norms, no FP8 or context parallelism): megatron-core hands the
unsplit QKV projection, with its bias beside it (model.layers.FusedQKVSelfAttention), to Transformer
Engine's `apply_fused_qkv_rotary_pos_emb`, whose place this takes. On CUDA one Triton kernel
(`kernels.qkv_rope`) adds the bias, splits, rotates the query and key and writes all three in
autocast's dtype; with QWEN_TRAIN_KERNELS=torch the bias's add and megatron-core's split path run, the
same operations as without the flag (inductor fuses them as before). One H200, Qwen2.5-0.5B, micro
batch 4: the split and rotation's kernels 12.2 -> 3.0 ms a step, the step (with the statistics kernel)
270 -> 260 ms (bench/results/gpu/2026-11-30-small-mfu-qkv.md).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import torch

from .. import kernels
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

    from megatron.core.transformer import attention

    with _replaced(rope_utils, "_apply_rotary_pos_emb_bshd", apply), \
            _replaced(attention, "HAVE_FUSED_QKV_ROPE", True), \
            _replaced(attention, "apply_fused_qkv_rotary_pos_emb", fused_qkv_rope):
        yield


def fused_qkv_rope(mixed, q_freqs: torch.Tensor, k_freqs: torch.Tensor, split: list[int]):
    """Transformer Engine's `apply_fused_qkv_rotary_pos_emb` as megatron-core calls it: mixed
    [s, b, groups, (q + 2)·d], or (mixed, the projection's bias, whether the attention takes its rows
    batch-major) from model.layers.FusedQKVSelfAttention, and each head's share of it (`split`: q·d, d, d)
    → the rotated query [s, b, groups·q, d], the rotated key and the value [s, b, groups, d]; where the
    attention takes its rows batch-major, [b, s, ...] (the kernel writes them so: `kernels.qkv_rope`)."""
    from megatron.core.models.common.embeddings import rope_utils

    mixed, bias, batch_major = (*mixed, False)[:3] if isinstance(mixed, tuple) else (mixed, None, False)
    d = split[1]
    if kernels.enabled(mixed) and q_freqs is k_freqs and q_freqs.shape[-1] == d:
        summed = mixed.dtype if bias is None else torch.promote_types(mixed.dtype, bias.dtype)
        cos, sin = rope_tables(q_freqs, 1.0, summed)
        if kernels.qkv_rope_fits(mixed, bias, cos):  # written in autocast's dtype, which attention casts them to
            dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else summed
            return kernels.qkv_rope(mixed, bias, cos, sin, split[0] // d, dtype, batch_major)
    if bias is not None:
        mixed = mixed + bias.view(mixed.shape[2], -1)
    query, key, value = torch.split(mixed, split, dim=3)  # megatron-core's split path
    query = query.reshape(query.size(0), query.size(1), -1, d)
    out = (rope_utils._apply_rotary_pos_emb_bshd(query, q_freqs, rotary_interleaved=False),
           rope_utils._apply_rotary_pos_emb_bshd(key, k_freqs, rotary_interleaved=False), value)
    return tuple(t.transpose(0, 1) for t in out) if batch_major else out
