"""Core attention for megatron-core's local layer spec: PyTorch's fused kernels, or Transformer Engine's.

megatron-core's own local `DotProductAttention` materialises the [b, heads, s, s] scores (measured on
an H100, Qwen2.5-0.5B shape, seq 4096: 14.2k tokens/s and 50.5 GiB, against 37.1k and 13.7 GiB with
PyTorch's SDPA). `SDPACoreAttention` is a drop-in for the layer spec's `core_attention` slot:

  attention_mask None          causal rows → F.scaled_dot_product_attention(is_causal=True)
  attention_mask DocumentMask  packed rows (samples that must never see each other) → FlexAttention
                               with a block mask built from segment ids: causal and same-segment,
                               fully masked tiles skipped, no s×s tensor anywhere. FlexAttention has
                               no backward on the CPU: there (tests only) SDPA takes the same mask
                               as a dense boolean tensor.
  attention_mask bool tensor   megatron's [b, 1, s, s] convention (True = masked) → SDPA with it
                               (correct, but dense: only for callers that insist)

`TECoreAttention` fills the same slot with Transformer Engine's DotProductAttention (cuDNN's fused
attention on Hopper): causal rows as [s, b, h, d] ("sbhd"), packed rows as one stream of
variable-length samples ("thd", padding_causal) described by the DocumentMask's PackedSeqParams.
Everything else in the layer stays megatron-core's local modules, which torch.compile fuses; the TE
call is kept out of the compiled graph, so its per-micro-batch metadata (how many samples, their
lengths) never makes a compiled layer recompile.

Context parallelism (--cp): each rank of a group holds two of the 2·cp chunks of every row
(`context_positions`); SDPACoreAttention gathers the group's keys and values (`gather_context`) and
attends its own queries to them under `context_mask`: causal by row position, within a segment.

GPTModel passes `attention_mask` through untouched to every layer, so the mask is built once per
micro-batch (`document_mask`, `thd_mask`) and shared by all layers. Rotary embeddings are applied by
position in the row, not restarted per sample: attention within a sample depends only on the
difference of two positions, so a packed sample attends exactly as it would alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from .thd import fill_fixed, stream_starts

# FlexAttention is only fused when compiled (inside a compiled layer this is traced inline). Made
# once here: built lazily inside a layer, its first use changed a global that the compiled layer
# had guarded on, and recompiled it.
compiled_flex_attention = torch.compile(flex_attention, dynamic=False)


@dataclass
class DocumentMask:
    """Attention restricted to earlier positions of the same segment."""

    segment_ids: torch.Tensor  # [b, s]: the whole rows
    block_mask: Optional[BlockMask] = None  # FlexAttention's (sdpa on CUDA)
    thd: Optional[PackedSeqParams] = None  # the b rows as one stream of samples (te)
    # Under context parallelism: the row positions of this rank's queries, and of the keys once
    # gathered from every rank of the group (`context_mask`); None: every position, in order.
    query_positions: Optional[torch.Tensor] = None
    key_positions: Optional[torch.Tensor] = None

    def dense(self) -> torch.Tensor:
        """[b, 1, queries, keys] bool, True = may attend (SDPA's convention)."""
        seg, s = self.segment_ids, self.segment_ids.shape[-1]
        every = torch.arange(s, device=seg.device)
        q = every if self.query_positions is None else self.query_positions
        k = every if self.key_positions is None else self.key_positions
        same = seg[:, q].unsqueeze(-1) == seg[:, k].unsqueeze(-2)
        return (same & (q.unsqueeze(-1) >= k.unsqueeze(-2))).unsqueeze(1)


def same_segment_causal(segment_ids: torch.Tensor):
    """FlexAttention's mask_mod over [b, s] segment ids: earlier positions of the same segment."""
    def mask_mod(batch, head, q_idx, kv_idx):
        return (segment_ids[batch, q_idx] == segment_ids[batch, kv_idx]) & (q_idx >= kv_idx)
    return mask_mod


def document_mask(segment_ids: torch.Tensor, mask_mod=None) -> DocumentMask:
    """[b, s] segment ids (equal ids = one sample) → causal within-segment mask for every layer.
    `mask_mod`: `same_segment_causal` of these segment ids, where the caller keeps one."""
    if segment_ids.device.type != "cuda":
        return DocumentMask(segment_ids, None)
    b, s = segment_ids.shape
    # Compiled, the mask is evaluated block by block on the GPU; eagerly it materialises [b, s, s]
    # booleans for every micro-batch.
    return DocumentMask(segment_ids, create_block_mask(mask_mod or same_segment_causal(segment_ids), b, None, s, s,
                                                       device=segment_ids.device, _compile=True))


def refill(mask: DocumentMask, segment_ids: torch.Tensor) -> None:
    """`mask` (of `document_mask`, on CUDA) made the mask of `segment_ids` in place: its tensors
    overwritten where they are, which is where a captured CUDA graph reads them (graphs.py)."""
    mask.segment_ids.copy_(segment_ids, non_blocking=True)
    fresh = document_mask(mask.segment_ids, mask.block_mask.mask_mod)
    for old, new in zip(mask.block_mask.as_tuple(), fresh.block_mask.as_tuple()):
        if isinstance(old, torch.Tensor):
            old.copy_(new)


def context_chunks(cp_rank: int, cp_size: int) -> tuple[int, int]:
    """The two of a row's 2·cp equal chunks a context-parallel rank holds: one early, one late, so
    every rank has the same share of causal attention's work (megatron-core's split, which its
    rotary embedding follows)."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def context_positions(s: int, cp_rank: int, cp_size: int, device=None) -> torch.Tensor:
    """The row positions (of rows of `s` tokens) a context-parallel rank holds, in its order."""
    chunk = s // (2 * cp_size)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device)
                      for c in context_chunks(cp_rank, cp_size)])


def context_mask(segment_ids: torch.Tensor, cp_rank: int, cp_size: int) -> DocumentMask:
    """Causal same-segment attention of this context-parallel rank's queries over the keys of
    every rank, gathered in rank order (`SDPACoreAttention`): from the whole rows' [b, s] segment
    ids (a row of one segment: causal attention)."""
    b, s = segment_ids.shape
    device = segment_ids.device
    queries = context_positions(s, cp_rank, cp_size, device)
    keys = torch.cat([context_positions(s, r, cp_size, device) for r in range(cp_size)])
    if device.type != "cuda":
        return DocumentMask(segment_ids, query_positions=queries, key_positions=keys)

    def same_segment_causal(batch, head, q_idx, kv_idx):
        q, k = queries[q_idx], keys[kv_idx]
        return (segment_ids[batch, q] == segment_ids[batch, k]) & (q >= k)

    block_mask = create_block_mask(same_segment_causal, b, None, len(queries), s, device=device, _compile=True)
    return DocumentMask(segment_ids, block_mask, query_positions=queries, key_positions=keys)


class _GatherContext(torch.autograd.Function):
    """[s, ...] parts of every rank of a group, joined along s in rank order; backward: the sum of
    every rank's gradient for this rank's part (each rank's queries attend to every part)."""

    @staticmethod
    def forward(ctx, part: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(part) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, part.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(dist.get_world_size(ctx.group))[dist.get_rank(ctx.group)], None


@torch.compiler.disable
def gather_context(part: torch.Tensor) -> torch.Tensor:
    """This rank's [s_local, ...] keys or values joined with those of its context-parallel group."""
    return _GatherContext.apply(part, parallel_state.get_context_parallel_group())


def thd_mask(batch: dict, device: torch.device) -> DocumentMask:
    """Packed rows for Transformer Engine: the [b, s] rows read as one stream of b·s tokens, cut
    where a sample (or a row's padding) starts. From the loader's segment_ids, cu_seqlens ([b, s + 1],
    each row's sample starts padded with s) and max_seqlen (each row's longest sample).

    TE chooses its kernel, and cuDNN builds its graph, once per distinct (number of samples,
    longest sample): both are rounded up to a power of two (at most s for the longest), so a run
    meets a handful of them, not one per micro-batch. The extra samples are empty, at the end.
    A CUDA graph's form is `fixed_thd_mask`'s."""
    segment_ids = batch["segment_ids"]
    b, s = segment_ids.shape
    cu = torch.from_numpy(stream_starts(batch["cu_seqlens"].numpy()))
    count = 1 << max(1, (len(cu) - 1).bit_length())
    cu = torch.cat([cu, torch.full((count + 1 - len(cu),), b * s, dtype=cu.dtype)]).to(torch.int32)
    longest = min(s, 1 << (int(batch["max_seqlen"].max()) - 1).bit_length())
    return DocumentMask(segment_ids, thd=_thd_params(cu.to(device, non_blocking=True), longest))


def takes_batch_major(mask) -> bool:
    """Whether the core attention takes a micro-batch under `mask` batch-major: Transformer Engine's THD
    stream of packed rows (`thd_mask`), row after row. The fused QKV kernel then writes the query, key
    and value [b, s, ...] (patches/rope.py; TECoreAttention.thd_batch_major), and the output projection
    multiplies the attention's output in that order (model.layers.GroupedRowParallelLinear): no copy into
    [s, b] order and back."""
    return isinstance(mask, DocumentMask) and mask.thd is not None


def _thd_params(cu_seqlens: torch.Tensor, longest: int) -> PackedSeqParams:
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


def thd_samples(batch: dict) -> int:
    """How many samples a micro-batch's rows hold (THD's count before rounding)."""
    return len(stream_starts(batch["cu_seqlens"].numpy()))


def fixed_thd_mask(batch: dict, device: torch.device, count: int) -> DocumentMask:
    """`thd_mask` in the form a CUDA graph replays (thd.py): `count` samples (empty ones at the
    end), the longest taken as s, cu_seqlens in a buffer of its own that `refill_thd` rewrites."""
    s = batch["segment_ids"].shape[1]
    buffer = torch.empty(count + 1, dtype=torch.int32, device=device)
    mask = DocumentMask(batch["segment_ids"], thd=_thd_params(buffer, s))
    refill_thd(mask, batch)
    return mask


def refill_thd(mask: DocumentMask, batch: dict) -> None:
    """`mask` (of `fixed_thd_mask`) made `batch`'s in place, where a captured graph reads it; a
    ValueError where its count is too small for the batch (thd.fixed_count: a graph class of its own)."""
    buffer = mask.thd.cu_seqlens_q
    fixed = np.empty(buffer.shape, dtype=np.int32)
    if fill_fixed(batch["cu_seqlens"].numpy(), fixed) is None:
        raise ValueError(f"{thd_samples(batch)} samples do not fit a THD form of {len(fixed) - 1}")
    buffer.copy_(torch.from_numpy(fixed), non_blocking=True)  # pageable: staged before copy_ returns


def have_transformer_engine() -> bool:
    import importlib.util
    return importlib.util.find_spec("transformer_engine") is not None


class SDPACoreAttention(MegatronModule):
    """`core_attention` for megatron-core's local spec (same constructor and forward signatures as
    its DotProductAttention, megatron-core 0.16 to 0.19). Takes [s, b, heads, head_dim] query/key/value
    (key/value with their own, smaller, head count: grouped-query attention) and returns
    [s, b, heads * head_dim]."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, **unused) -> None:
        super().__init__(config=config)
        if config.apply_query_key_layer_scaling:
            raise ValueError("SDPACoreAttention does not do query-key layer scaling")
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None:
            raise ValueError("packed (THD) sequences need Transformer Engine; pass a DocumentMask instead")
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention takes no attention bias")
        if self.config.context_parallel_size > 1:
            if not (isinstance(attention_mask, DocumentMask) and attention_mask.key_positions is not None):
                raise ValueError("under context parallelism the attention mask comes from context_mask")
            key, value = gather_context(key.to(value.dtype)), gather_context(value)
        # RoPE may have promoted query/key to float32 under autocast; value is the linear layer's dtype.
        dtype = value.dtype
        q, k, v = (t.to(dtype).permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        gqa = q.shape[1] != k.shape[1]
        dropout = self.dropout if self.training else 0.0
        if isinstance(attention_mask, DocumentMask) and attention_mask.block_mask is not None:
            if dropout:
                raise ValueError("FlexAttention path has no attention dropout")
            out = compiled_flex_attention(q, k, v, block_mask=attention_mask.block_mask, scale=self.softmax_scale,
                                          enable_gqa=gqa)
        elif isinstance(attention_mask, DocumentMask):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask.dense(), dropout_p=dropout,
                                                 scale=self.softmax_scale, enable_gqa=gqa)
        elif attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                 scale=self.softmax_scale, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask.bool(), dropout_p=dropout,
                                                 scale=self.softmax_scale, enable_gqa=gqa)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class TECoreAttention(MegatronModule):
    """`core_attention` for megatron-core's local spec over Transformer Engine's DotProductAttention
    (same signatures as SDPACoreAttention). It holds no weights: TE's module is kept off the module
    tree, so checkpoints are the same under sdpa and te."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, **unused) -> None:
        super().__init__(config=config)
        from transformer_engine.pytorch import DotProductAttention
        if config.context_parallel_size != 1:
            raise ValueError("TECoreAttention does not do context parallelism yet")
        tp = config.tensor_model_parallel_size
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.__dict__["te"] = DotProductAttention(
            config.num_attention_heads // tp, config.kv_channels, num_gqa_groups=config.num_query_groups // tp,
            attention_dropout=dropout, qkv_format="sbhd", attn_mask_type="causal", layer_number=layer_number,
            softmax_scale=softmax_scale or 1.0 / math.sqrt(config.kv_channels))
        # Under a THD mask the query, key and value come [b, s, heads, d] (`takes_batch_major`), not
        # [s, b, ...]: set by the layer that writes them so (model.layers.FusedQKVSelfAttention).
        self.thd_batch_major = False

    def train(self, mode: bool = True):
        self.te.train(mode)
        return super().train(mode)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None:
            raise ValueError("packed rows reach TECoreAttention as a DocumentMask (thd_mask)")
        if attention_bias is not None:
            raise ValueError("TECoreAttention takes no attention bias")
        # TE's fused kernels take bf16/fp16 of one layout: under autocast query, key and value can
        # arrive as float32 (RoPE, megatron-core's linear) and value as a strided view into the fused
        # QKV projection; anything else falls back to TE's unfused attention, which materialises
        # the scores. The casts and layout changes stay in the compiled layer (fused with RoPE and
        # the projections), only the TE call is left out of it (`_attend`).
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else value.dtype
        if not isinstance(attention_mask, DocumentMask):
            if attention_mask is not None:
                raise ValueError("TECoreAttention takes causal rows, or packed rows as thd_mask gives them")
            return self._attend(*(t.to(dtype).contiguous() for t in (query, key, value)), None)
        q, k, v, b, s = thd_stream(query, key, value, dtype, self.thd_batch_major)
        return self._attend(q, k, v, attention_mask).view(b, s, -1).transpose(0, 1)

    @torch.compiler.disable
    def _attend(self, q, k, v, mask: Optional[DocumentMask]) -> torch.Tensor:
        """TE's attention: [s, b, h, d] causal rows (mask None), or the [t, h, d] stream of packed rows."""
        if mask is None:
            return self.te(q, k, v)
        thd = mask.thd
        return self.te(q, k, v, qkv_format="thd", attn_mask_type="padding_causal",
                       cu_seqlens_q=thd.cu_seqlens_q, cu_seqlens_kv=thd.cu_seqlens_kv,
                       max_seqlen_q=thd.max_seqlen_q, max_seqlen_kv=thd.max_seqlen_kv)


def thd_stream(query, key, value, dtype: torch.dtype, batch_major: bool):
    """[s, b, heads, d] query, key and value, or [b, s, ...] where `batch_major`, as TE's THD stream
    ([b·s, heads, d] each, row after row, `dtype`, contiguous) → (q, k, v, b, s). Batch-major and
    contiguous (the fused QKV kernel's), each is a view: no copy, forward or backward."""
    b, s = query.shape[:2] if batch_major else query.shape[1::-1]
    rows = (lambda t: t) if batch_major else (lambda t: t.transpose(0, 1))
    q, k, v = (rows(t.to(dtype)).reshape(b * s, *t.shape[2:]).contiguous() for t in (query, key, value))
    return q, k, v, b, s


class TEPackedCoreAttention(TECoreAttention):
    """TECoreAttention for packed rows only: rows of one segment (causal) through PyTorch's SDPA, as
    SDPACoreAttention runs them, inside the compiled layer (`auto`'s choice under CUDA graphs:
    plan.AUTO_TE_PACKED)."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str, **kwargs) -> None:
        super().__init__(config, layer_number, attn_mask_type, attention_type, **kwargs)
        self.causal = SDPACoreAttention(config, layer_number, attn_mask_type, attention_type, **kwargs)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if attention_mask is None and packed_seq_params is None:
            return self.causal(query, key, value, None, attention_bias=attention_bias)
        return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)
