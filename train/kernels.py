"""Hand-written Triton kernels for the step's memory-bound pieces, each with the torch path it
replaces (the reference: the CPU, and CUDA when QWEN_TRAIN_KERNELS=torch).

  swiglu             SwiGLU as a custom op (opaque to inductor): forward silu(a)·b, backward both
                     halves of the input's gradient from one load of the gate, the input and the
                     output's gradient (inductor's backward of megatron-core's function loads the
                     input twice, once for each half of the concatenated gradient)
  softmax_stats      the fused cross-entropy's per-row maximum, Σ exp(logit − maximum) and the label's
                     logit in one read of the bf16 logits (online softmax: a running maximum, the sum
                     rescaled when it grows), where inductor read them twice
                     (each row split over STATS_PARTS programs, joined by a small second kernel)
  logit_grad_        c·(softmax − one-hot) written over the logits in place
  qkv_rope           the QKV projection's bias added, the heads split into query, key and value, the
                     query and key rotated (RoPE) and all three cast to autocast's dtype: one read of
                     the projection and one write of each, where inductor's split and rotation (four
                     kernels) could not take the bias or the cast once the rotation was opaque; its
                     backward writes the projection's gradient and the bias's by parts
  adamw_             one parameter's AdamW step in place, with the clipping's factor and the
                     gradient's zeroing in the same pass; a split bf16 weight (optimizer.AdamW's) read
                     and written as its two halves, where the float32 master was joined, stepped by
                     torch's fused AdamW, split and copied back in passes of their own

Arithmetic in float32, rounded once to the output's dtype, as inductor's fused kernels do; the sums
differ from the compiled path's only in their order, the rotation's products only by the fused
multiply-add's one rounding. Triton is imported on first use on CUDA: CI and the CPU never see it.

One H200, Qwen2.5-0.5B pretraining, micro batch 4, seq 4096 (bench/results/gpu/2026-11-30-small-mfu-kernels.md):
SwiGLU backward 16.1 -> 9.3 ms a step (bitwise the compiled path's numbers), the softmax passes 13.3 ->
9.5 ms; the step 277 -> 270 ms, 41.7% -> 42.9% MFU (causal), peak memory 22.5 -> 21.3 GiB. Then
(bench/results/gpu/2026-11-30-small-mfu-qkv.md) the QKV split, RoPE and bias 12.2 + 1.1 -> 3.0 ms a step
(incl. the bias's sums), the statistics 4.4 -> 2.9 ms; the step 270 -> 260 ms, 42.9% -> 44.4% MFU (causal).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import struct
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


# Read once, at import: `enabled` runs inside compiled layers, where a module constant is a guard
# and not a graph break.
TRITON = os.environ.get("QWEN_TRAIN_KERNELS", "triton") != "torch" and importlib.util.find_spec("triton") is not None


def enabled(t: torch.Tensor) -> bool:
    """The Triton kernels for `t`: on CUDA, Triton installed, not switched off by
    QWEN_TRAIN_KERNELS=torch in the environment (the torch path, for comparisons)."""
    return TRITON and t.is_cuda


@functools.cache
def _triton() -> dict:
    return _build()


def _build():
    """The kernels, defined once Triton is known to be there."""
    import triton
    import triton.language as tl

    return (_swiglu(triton, tl) | _softmax(triton, tl) | _qkv_rope_fwd_kernel(triton, tl)
            | _qkv_rope_bwd_kernel(triton, tl) | _adamw_kernel(triton, tl))


def _swiglu(triton, tl) -> dict:
    @triton.jit
    def swiglu_fwd(y, out, half, BLOCK: tl.constexpr):
        row, cols = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < half
        a = tl.load(y + row * 2 * half + cols, mask=keep).to(tl.float32)
        b = tl.load(y + row * 2 * half + half + cols, mask=keep).to(tl.float32)
        tl.store(out + row * half + cols, (a * tl.sigmoid(a) * b).to(out.dtype.element_ty), mask=keep)

    @triton.jit
    def swiglu_bwd(g, y, dy, half, BLOCK: tl.constexpr):
        row, cols = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < half
        a = tl.load(y + row * 2 * half + cols, mask=keep).to(tl.float32)
        b = tl.load(y + row * 2 * half + half + cols, mask=keep).to(tl.float32)
        grad = tl.load(g + row * half + cols, mask=keep).to(tl.float32)
        s = tl.sigmoid(a)
        tl.store(dy + row * 2 * half + cols, (grad * s * (1 + a * (1 - s)) * b).to(dy.dtype.element_ty), mask=keep)
        tl.store(dy + row * 2 * half + half + cols, (grad * a * s).to(dy.dtype.element_ty), mask=keep)

    return dict(swiglu_fwd=swiglu_fwd, swiglu_bwd=swiglu_bwd)


def _softmax(triton, tl) -> dict:
    @triton.jit
    def softmax_parts(logits, part_peak, part_sums, vocab, span, PARTS: tl.constexpr, BLOCK: tl.constexpr):
        """One of a row's PARTS spans of columns: its maximum and Σ exp(logit − maximum)."""
        row, part = tl.program_id(0).to(tl.int64), tl.program_id(1)
        base = logits + row * vocab
        first = part * span
        end = tl.minimum(vocab, first + span)
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        for start in range(first, end, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        tl.store(part_peak + row * PARTS + part, m)
        tl.store(part_sums + row * PARTS + part, s)

    @triton.jit
    def softmax_join(logits, at, here, part_peak, part_sums, peak, sums, target, n, vocab, PARTS: tl.constexpr,
                     ROWS: tl.constexpr):
        """ROWS rows' parts joined: the maximum, the sum rescaled to it, the label's logit − maximum."""
        rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        keep = rows < n
        parts = rows[:, None] * PARTS + tl.arange(0, PARTS)[None, :]
        pm = tl.load(part_peak + parts, mask=keep[:, None], other=float("-inf"))
        ps = tl.load(part_sums + parts, mask=keep[:, None], other=0.0)
        m = tl.max(pm, 1)
        s = tl.sum(tl.where(ps > 0, ps * tl.exp(pm - m[:, None]), 0.0), 1)
        label = tl.load(at + rows, mask=keep, other=0)
        t = tl.load(logits + rows * vocab + label, mask=keep, other=0.0).to(tl.float32) - m
        tl.store(peak + rows, m, mask=keep)
        tl.store(sums + rows, s, mask=keep)
        tl.store(target + rows, tl.where(tl.load(here + rows, mask=keep, other=0) != 0, t, 0.0), mask=keep)

    @triton.jit
    def logit_grad(logits, peak, sums, at, here, c, vocab, BLOCK: tl.constexpr):
        row, cols = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < vocab
        ptr = logits + row * vocab + cols
        x = tl.load(ptr, mask=keep).to(tl.float32)
        weight = tl.load(c + row)
        scale = weight / tl.load(sums + row)
        label = (cols == tl.load(at + row)) & tl.load(here + row)
        g = tl.exp(x - tl.load(peak + row)) * scale - tl.where(label, weight, 0.0)
        tl.store(ptr, g.to(logits.dtype.element_ty), mask=keep)

    return dict(softmax_parts=softmax_parts, softmax_join=softmax_join, logit_grad=logit_grad)


def _qkv_rope_fwd_kernel(triton, tl) -> dict:
    """One program: BLOCK_T tokens of one head of the fused QKV projection, whose slots run per
    query group as Q query heads, its key, its value (megatron-core's order). Each head's two
    halves are loaded apart: the rotation pairs element i with i + HALF. BATCH_MAJOR: the outputs'
    tokens written row by row ([b, s, heads, d] memory; mixed's run position by position)."""
    @triton.jit
    def qkv_rope_fwd(mixed, bias, cos, sin, q, k, v, tokens, batch, seq, Q: tl.constexpr, GROUPS: tl.constexpr,
                     HALF: tl.constexpr, BLOCK_T: tl.constexpr, HAS_BIAS: tl.constexpr, BATCH_MAJOR: tl.constexpr):
        slot = tl.program_id(1)
        group, j = slot // (Q + 2), slot % (Q + 2)
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None]
        d = tl.arange(0, HALF)[None, :]
        keep = t < tokens
        if BATCH_MAJOR:  # the output's token
            o = (t % batch) * seq + t // batch
        else:
            o = t
        src = mixed + t * (GROUPS * (Q + 2) * 2 * HALF) + slot * 2 * HALF + d
        a, b = tl.load(src, mask=keep).to(tl.float32), tl.load(src + HALF, mask=keep).to(tl.float32)
        if HAS_BIAS:  # the projection's bias, added in float32 as the linear's add would
            a += tl.load(bias + slot * 2 * HALF + d).to(tl.float32)
            b += tl.load(bias + slot * 2 * HALF + HALF + d).to(tl.float32)
        if j == Q + 1:  # the value: copied
            dst = v + o * (GROUPS * 2 * HALF) + group * 2 * HALF + d
            tl.store(dst, a.to(v.dtype.element_ty), mask=keep)
            tl.store(dst + HALF, b.to(v.dtype.element_ty), mask=keep)
        else:
            if j < Q:
                dst = q + o * (GROUPS * Q * 2 * HALF) + (group * Q + j) * 2 * HALF + d
            else:
                dst = k + o * (GROUPS * 2 * HALF) + group * 2 * HALF + d
            at = (t // batch) * 2 * HALF + d
            c1, c2 = tl.load(cos + at, mask=keep).to(tl.float32), tl.load(cos + at + HALF, mask=keep).to(tl.float32)
            s1, s2 = tl.load(sin + at, mask=keep).to(tl.float32), tl.load(sin + at + HALF, mask=keep).to(tl.float32)
            tl.store(dst, (a * c1 + (-b) * s1).to(dst.dtype.element_ty), mask=keep)
            tl.store(dst + HALF, (b * c2 + a * s2).to(dst.dtype.element_ty), mask=keep)

    return dict(qkv_rope_fwd=qkv_rope_fwd)


def _qkv_rope_bwd_kernel(triton, tl) -> dict:
    """The forward's programs, the inverse rotation: d(mixed) from the query's, key's and value's
    gradients (strided: SDPA's backward hands them over as [b, heads, s, d] permuted); with a bias,
    each program's sum over its tokens (the bias's gradient, once the programs' sums are added)."""
    @triton.jit
    def qkv_rope_bwd(dq, dk, dv, cos, sin, dmixed, dbias, tokens, batch, q_s, q_b, q_h, k_s, k_b, k_h, v_s, v_b, v_h,
                     Q: tl.constexpr, GROUPS: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                     HAS_BIAS: tl.constexpr):
        slot = tl.program_id(1)
        group, j = slot // (Q + 2), slot % (Q + 2)
        t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None]
        d = tl.arange(0, HALF)[None, :]
        keep = t < tokens
        pos, row = t // batch, t % batch
        if j == Q + 1:
            src = dv + pos * v_s + row * v_b + group * v_h + d
            o1 = tl.load(src, mask=keep, other=0.0).to(tl.float32)
            o2 = tl.load(src + HALF, mask=keep, other=0.0).to(tl.float32)
        else:
            if j < Q:
                src = dq + pos * q_s + row * q_b + (group * Q + j) * q_h + d
            else:
                src = dk + pos * k_s + row * k_b + group * k_h + d
            at = pos * 2 * HALF + d
            c1 = tl.load(cos + at, mask=keep, other=0.0).to(tl.float32)
            c2 = tl.load(cos + at + HALF, mask=keep, other=0.0).to(tl.float32)
            s1 = tl.load(sin + at, mask=keep, other=0.0).to(tl.float32)
            s2 = tl.load(sin + at + HALF, mask=keep, other=0.0).to(tl.float32)
            g1 = tl.load(src, mask=keep, other=0.0).to(tl.float32)
            g2 = tl.load(src + HALF, mask=keep, other=0.0).to(tl.float32)
            o1, o2 = g1 * c1 + g2 * s2, g2 * c2 - g1 * s1
        dst = dmixed + t * (GROUPS * (Q + 2) * 2 * HALF) + slot * 2 * HALF + d
        tl.store(dst, o1.to(dmixed.dtype.element_ty), mask=keep)
        tl.store(dst + HALF, o2.to(dmixed.dtype.element_ty), mask=keep)
        if HAS_BIAS:
            part = dbias + tl.program_id(0) * (GROUPS * (Q + 2) * 2 * HALF) + slot * 2 * HALF + tl.arange(0, HALF)
            tl.store(part, tl.sum(o1, 0))
            tl.store(part + HALF, tl.sum(o2, 0))

    return dict(qkv_rope_bwd=qkv_rope_bwd)


# ---- SwiGLU --------------------------------------------------------------------------------------

def _adamw_kernel(triton, tl) -> dict:
    @triton.jit(do_not_specialize=["lr_wd", "step_size", "bc2_sqrt"])
    def adamw(weight, low, grad, exp_avg, exp_avg_sq, coef, n, lr_wd, beta1, beta2, eps, step_size, bc2_sqrt,
              SPLIT: tl.constexpr, ZERO: tl.constexpr, BLOCK: tl.constexpr):
        """`adamw_reference_` of BLOCK elements (the float64 scalars come as their bits, int64); the
        weight float32, or SPLIT: bf16 bits + the low 16."""
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        keep = at < n
        if SPLIT:
            high = tl.load(weight + at, mask=keep).to(tl.int32)
            p = ((high << 16) + tl.load(low + at, mask=keep).to(tl.int32)).to(tl.float32, bitcast=True)
        else:
            p = tl.load(weight + at, mask=keep)
        g = (tl.load(grad + at, mask=keep) * tl.load(coef)).to(tl.float64)
        b1 = beta1.to(tl.int64).to(tl.float64, bitcast=True)
        b2 = beta2.to(tl.int64).to(tl.float64, bitcast=True)
        p64 = p.to(tl.float64)
        p = (p64 - lr_wd.to(tl.int64).to(tl.float64, bitcast=True) * p64).to(tl.float32)
        m = (b1 * tl.load(exp_avg + at, mask=keep).to(tl.float64) + (1 - b1) * g).to(tl.float32)
        v = (b2 * tl.load(exp_avg_sq + at, mask=keep).to(tl.float64) + (1 - b2) * g * g).to(tl.float32)
        denom = (tl.div_rn(tl.sqrt_rn(v), bc2_sqrt).to(tl.float64)
                 + eps.to(tl.int64).to(tl.float64, bitcast=True)).to(tl.float32)
        p = p - tl.div_rn(step_size * m, denom)
        tl.store(exp_avg + at, m, mask=keep)
        tl.store(exp_avg_sq + at, v, mask=keep)
        if SPLIT:
            bits = p.to(tl.int32, bitcast=True)
            high = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            tl.store(weight + at, high.to(tl.int16), mask=keep)
            tl.store(low + at, tl.minimum(bits - (high << 16), 0x7FFF).to(tl.int16), mask=keep)
        else:
            tl.store(weight + at, p, mask=keep)
        if ZERO:
            tl.store(grad + at, tl.zeros([BLOCK], tl.float32), mask=keep)

    return dict(adamw=adamw)


SWIGLU_BLOCK = 1024


def swiglu_reference(y: torch.Tensor) -> torch.Tensor:
    a, b = torch.chunk(y, 2, -1)
    return F.silu(a) * b


def swiglu_back_reference(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """megatron-core's `swiglu_back` in float32, rounded once (what inductor compiles it to)."""
    a, b = (half.float() for half in torch.chunk(y, 2, -1))
    g, s = g.float(), torch.sigmoid(a)
    return torch.cat((g * s * (1 + a * (1 - s)) * b, g * a * s), -1).to(y.dtype)


@torch.library.custom_op("qwen_data_train::swiglu", mutates_args=())
def swiglu(y: torch.Tensor) -> torch.Tensor:
    """silu(a)·b of y = [a | b] (last dimension), y [..., 2h] contiguous."""
    if not enabled(y):
        return swiglu_reference(y)
    half = y.shape[-1] // 2
    out = y.new_empty(*y.shape[:-1], half)
    rows = y.numel() // (2 * half)
    if rows:
        _triton()["swiglu_fwd"][(rows, triton_cdiv(half, SWIGLU_BLOCK))](y, out, half, BLOCK=SWIGLU_BLOCK,
                                                                         num_warps=4)
    return out


@swiglu.register_fake
def _(y):
    return y.new_empty(*y.shape[:-1], y.shape[-1] // 2)


@torch.library.custom_op("qwen_data_train::swiglu_back", mutates_args=())
def swiglu_back(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of `swiglu` with respect to y, given the output's gradient g."""
    if not enabled(y):
        return swiglu_back_reference(g, y)
    g = g.contiguous()
    half = y.shape[-1] // 2
    dy = torch.empty_like(y)
    rows = y.numel() // (2 * half)
    if rows:
        _triton()["swiglu_bwd"][(rows, triton_cdiv(half, SWIGLU_BLOCK))](g, y, dy, half, BLOCK=SWIGLU_BLOCK,
                                                                        num_warps=4)
    return dy


@swiglu_back.register_fake
def _(g, y):
    return torch.empty_like(y)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return swiglu_back(grad, y)


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- the fused cross-entropy's softmax passes ----------------------------------------------------

# A row's statistics over STATS_PARTS programs (a power of two), joined by a second, small kernel. One
# H200, [4096, 151,936] bf16: one program a row (4096 rows a chunk) read the logits at 2.40 TB/s, 8 parts
# of 2048-column blocks at 3.86 TB/s with 4 warps (2.79 with 8); 4-32 parts, 1024-4096 blocks measured
# (bench/results/gpu/2026-11-30-small-mfu-qkv.md).
STATS_PARTS = 8
STATS_BLOCK = 2048
STATS_WARPS = 4
GRAD_BLOCK = 4096


def softmax_stats(logits: torch.Tensor, at: torch.Tensor, here: torch.Tensor):
    """Per row of [n, v] logits (whole rows): the maximum (float32), Σ exp(logit − maximum) and the
    label's logit − maximum (0 where `here` is False): one read of the logits."""
    n, vocab = logits.shape
    assert logits.is_contiguous()
    peak, sums, target = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    if n:
        parts = 1 << (STATS_PARTS - 1).bit_length()  # tl.arange's lengths are powers of two
        span = triton_cdiv(triton_cdiv(vocab, parts), STATS_BLOCK) * STATS_BLOCK
        part_peak, part_sums = (torch.empty(n, parts, dtype=torch.float32, device=logits.device) for _ in range(2))
        kernels = _triton()
        kernels["softmax_parts"][(n, parts)](logits, part_peak, part_sums, vocab, span, PARTS=parts,
                                             BLOCK=STATS_BLOCK, num_warps=STATS_WARPS)
        rows = max(1, 1024 // parts)
        kernels["softmax_join"][(triton_cdiv(n, rows),)](logits, at.contiguous(), here.contiguous(), part_peak,
                                                        part_sums, peak, sums, target, n, vocab, PARTS=parts,
                                                        ROWS=rows, num_warps=4)
    return peak, sums, target


def logit_grad_(logits: torch.Tensor, peak, sums, at, here, c) -> torch.Tensor:
    """c·(softmax − one-hot of the label) written over `logits` (its dtype), which it returns."""
    n, vocab = logits.shape
    assert logits.is_contiguous()
    if n:
        _triton()["logit_grad"][(n, triton_cdiv(vocab, GRAD_BLOCK))](
            logits, peak.contiguous(), sums.contiguous(), at.contiguous(), here.contiguous(), c.contiguous(), vocab,
            BLOCK=GRAD_BLOCK, num_warps=8)
    return logits


# ---- the fused QKV projection split into query, key and value, RoPE applied ---------------------

ROPE_TOKENS = 64  # tokens a program (of one head)


def rotate_reference(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """megatron-core's rotation (`_apply_rotary_pos_emb_bshd`, not interleaved) by tables of t's dtype."""
    t1, t2 = torch.chunk(t, 2, -1)
    return t * cos + torch.cat((-t2, t1), -1) * sin


def _with_bias(mixed: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return mixed if bias is None else mixed + bias.view(mixed.shape[2], -1)


def qkv_rope_reference(mixed: torch.Tensor, bias: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                       q_heads: int, dtype: torch.dtype):
    """The projection's bias added, megatron-core's split path, then autocast's cast to `dtype`:
    [s, b, groups, (q_heads + 2)·d] → the rotated query [s, b, groups·q_heads, d], the rotated key and
    the value [s, b, groups, d]."""
    d = cos.shape[-1]
    query, key, value = torch.split(_with_bias(mixed, bias), [q_heads * d, d, d], dim=3)
    query = query.reshape(*query.shape[:2], -1, d)
    return (rotate_reference(query, cos, sin).to(dtype), rotate_reference(key, cos, sin).to(dtype),
            value.to(dtype, copy=True))


def qkv_rope_back_reference(dq, dk, dv, cos, sin, dtype: torch.dtype, with_bias: bool):
    """The gradients of `qkv_rope_reference`: mixed's (of `dtype`; the inverse rotation in float32,
    rounded once: inductor's arithmetic) and the bias's (float32; empty without one)."""
    def unrotate(g):
        (g1, g2), (c1, c2), (s1, s2) = (torch.chunk(x.float(), 2, -1) for x in (g, cos, sin))
        return torch.cat((g1 * c1 + g2 * s2, g2 * c2 - g1 * s1), -1)
    s, b, groups = dk.shape[:3]
    grad = torch.cat((unrotate(dq).reshape(s, b, groups, -1), unrotate(dk), dv.float()), -1)
    return grad.to(dtype), grad.sum((0, 1)).flatten() if with_bias else grad.new_empty(0)


def _tables_fit(cos: torch.Tensor, s, dtype: torch.dtype) -> bool:
    d = cos.shape[-1]
    return d >= 2 and d & (d - 1) == 0 and cos.dtype == dtype and tuple(cos.shape) == (s, 1, 1, d)


def qkv_rope_fits(mixed: torch.Tensor, bias: Optional[torch.Tensor], cos: torch.Tensor) -> bool:
    """The kernel's case: CUDA, a head dimension of a power of two, tables [s, 1, 1, d] of the dtype
    of mixed plus its bias (a bias of mixed's last two dimensions)."""
    if bias is not None and (bias.numel() != mixed.shape[2] * mixed.shape[3] or bias.device != mixed.device):
        return False
    dtype = mixed.dtype if bias is None else torch.promote_types(mixed.dtype, bias.dtype)
    return enabled(mixed) and _tables_fit(cos, mixed.shape[0], dtype)


# "_2": batch-major outputs are [b, s, ...] since 2026-12-01 (they were [s, b] views): a name of its own,
# so that inductor's caches of graphs calling the earlier op (keyed on the graph, not the op's fake) miss.
@torch.library.custom_op("qwen_data_train::qkv_rope_2", mutates_args=())
def qkv_rope(mixed: torch.Tensor, bias: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, q_heads: int,
             dtype: torch.dtype, batch_major: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qkv_rope_reference` in one kernel: mixed [s, b, groups, (q_heads + 2)·d] read once, the query,
    key and value written in `dtype`: the bias's add, the split path's kernels and autocast's casts in
    one. Under autocast mixed is the bf16 product and the bias float32, the tables too.

    The outputs are [s, b, heads, d]; `batch_major`: [b, s, heads, d] (contiguous), the row-by-row
    stream Transformer Engine's THD attention takes as it lies (attention.TECoreAttention). Contiguous
    there, they cross a compiled layer's break at TE's call as they lie: handed out as [s, b] views of
    [b, s] memory, their gradients (TE's, in that memory) were copied into [s, b] order at the break
    (AOTAutograd's tangents take an output's memory format, contiguous under dynamic shapes)."""
    if not qkv_rope_fits(mixed, bias, cos):
        return tuple(_in_layout(t, batch_major) for t in qkv_rope_reference(mixed, bias, cos, sin, q_heads, dtype))
    s, b, groups, d = *mixed.shape[:3], cos.shape[-1]
    mixed, cos, sin = mixed.contiguous(), cos.contiguous(), sin.contiguous()
    q, k, v = (_qkv_empty(mixed, heads, d, dtype, batch_major) for heads in (groups * q_heads, groups, groups))
    if s * b:
        _triton()["qkv_rope_fwd"][(triton_cdiv(s * b, ROPE_TOKENS), groups * (q_heads + 2))](
            mixed, mixed if bias is None else bias.contiguous(), cos, sin, q, k, v, s * b, b, s, Q=q_heads,
            GROUPS=groups, HALF=d // 2, BLOCK_T=ROPE_TOKENS, HAS_BIAS=bias is not None, BATCH_MAJOR=batch_major,
            num_warps=4)
    return q, k, v


def _qkv_empty(mixed: torch.Tensor, heads: int, d: int, dtype: torch.dtype, batch_major: bool) -> torch.Tensor:
    """An output of `qkv_rope`: [s, b, heads, d], or [b, s, heads, d] where `batch_major`."""
    s, b = mixed.shape[:2]
    return mixed.new_empty(*((b, s) if batch_major else (s, b)), heads, d, dtype=dtype)


def _in_layout(t: torch.Tensor, batch_major: bool) -> torch.Tensor:
    return t.transpose(0, 1).contiguous() if batch_major else t


@qkv_rope.register_fake
def _(mixed, bias, cos, sin, q_heads, dtype, batch_major=False):
    groups, d = mixed.shape[2], cos.shape[-1]
    return tuple(_qkv_empty(mixed, heads, d, dtype, batch_major) for heads in (groups * q_heads, groups, groups))


@torch.library.custom_op("qwen_data_train::qkv_rope_back", mutates_args=())
def qkv_rope_back(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  dtype: torch.dtype, with_bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of `qkv_rope`: mixed's (of `dtype`) and the bias's (float32, empty without one),
    from the query's, key's and value's (any strides with the head dimension's last and dense)."""
    if not (enabled(dk) and _tables_fit(cos, dk.shape[0], cos.dtype)):
        return qkv_rope_back_reference(dq, dk, dv, cos, sin, dtype, with_bias)
    s, b, groups, d = *dk.shape[:3], cos.shape[-1]
    q_heads, blocks = dq.shape[2] // groups, triton_cdiv(s * b, ROPE_TOKENS)
    dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
    dmixed = dk.new_empty(s, b, groups, (q_heads + 2) * d, dtype=dtype)
    parts = dk.new_empty(blocks if with_bias else 0, groups * (q_heads + 2) * d, dtype=torch.float32)
    if s * b:
        _triton()["qkv_rope_bwd"][(blocks, groups * (q_heads + 2))](
            dq, dk, dv, cos.contiguous(), sin.contiguous(), dmixed, parts, s * b, b, *dq.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], Q=q_heads, GROUPS=groups, HALF=d // 2, BLOCK_T=ROPE_TOKENS,
            HAS_BIAS=with_bias, num_warps=4)
    return dmixed, parts.sum(0) if with_bias else parts.new_empty(0)


@qkv_rope_back.register_fake
def _(dq, dk, dv, cos, sin, dtype, with_bias):
    s, b, groups, d = *dk.shape[:3], cos.shape[-1]
    width = groups * (dq.shape[2] // groups + 2) * d
    return dk.new_empty(s, b, groups, width // groups, dtype=dtype), dk.new_empty(width if with_bias else 0,
                                                                                 dtype=torch.float32)


def _qkv_rope_setup(ctx, inputs, output):
    mixed, bias, cos, sin = inputs[:4]
    ctx.save_for_backward(cos, sin)
    ctx.dtype, ctx.bias_dtype = mixed.dtype, None if bias is None else bias.dtype
    ctx.batch_major = inputs[6] if len(inputs) > 6 else False


def _qkv_rope_backward(ctx, dq, dk, dv):
    cos, sin = ctx.saved_tensors
    if ctx.batch_major:  # [b, s, ...] gradients, read as [s, b] views where they lie
        dq, dk, dv = (g.transpose(0, 1) for g in (dq, dk, dv))
    dmixed, dbias = qkv_rope_back(dq, dk, dv, cos, sin, ctx.dtype, ctx.bias_dtype is not None)
    return dmixed, None if ctx.bias_dtype is None else dbias.to(ctx.bias_dtype), None, None, None, None, None


qkv_rope.register_autograd(_qkv_rope_backward, setup_context=_qkv_rope_setup)


# ---- AdamW over one parameter, in place ----------------------------------------------------------

ADAMW_BLOCK = 2048
ADAMW_WARPS = 8


def split_bits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 → (its bf16 rounding, to nearest, ties to even; the int16 that `join_bits` adds back:
    optimizer.split_float32 says which one case it keeps 1 unit of the last place lower)."""
    bits = x.view(torch.int32)
    high = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    low = (bits - (high << 16)).clamp(max=0x7FFF)
    return high.to(torch.int16).view(torch.bfloat16), low.to(torch.int16)


def join_bits(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return ((high.view(torch.int16).to(torch.int32) << 16) + low.to(torch.int32)).view(torch.float32)


@dataclass(frozen=True)
class AdamWStep:
    """One step's scalars, as torch's fused AdamW takes them (`lr` ... `eps` Python floats, i.e.
    float64) and makes them (the bias corrections from the float64 powers, rounded to float32)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    step: int  # 1 at the first

    @property
    def step_size(self) -> float:
        return _float32(self.lr / _float32(1 - self.beta1 ** self.step))

    @property
    def bc2_sqrt(self) -> float:
        return _float32(math.sqrt(1 - self.beta2 ** self.step))


def _float32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _bits(x: float) -> int:
    return struct.unpack("q", struct.pack("d", x))[0]


def adamw_(weight: torch.Tensor, low: Optional[torch.Tensor], grad: torch.Tensor, exp_avg: torch.Tensor,
           exp_avg_sq: torch.Tensor, coef: torch.Tensor, scalars: AdamWStep, zero_grad: bool) -> None:
    """AdamW of one parameter in place, its gradient × `coef` (a float32 scalar tensor: the clipping's
    factor): `weight` float32, or with `low` its bf16 half and the other 16 bits (`split_bits`). The
    moments float32, `zero_grad`: the gradient zeroed after. `adamw_reference_`'s arithmetic in one
    pass on CUDA, the reference elsewhere."""
    if not enabled(grad):
        return adamw_reference_(weight, low, grad, exp_avg, exp_avg_sq, coef, scalars, zero_grad)
    assert all(t.is_contiguous() for t in (weight, grad, exp_avg, exp_avg_sq) + ((low,) if low is not None else ()))
    n = grad.numel()
    if n:
        s = scalars
        _triton()["adamw"][(triton_cdiv(n, ADAMW_BLOCK),)](
            weight.view(torch.int16) if low is not None else weight, low if low is not None else weight, grad,
            exp_avg, exp_avg_sq, coef, n, _bits(s.lr * s.weight_decay), _bits(s.beta1), _bits(s.beta2), _bits(s.eps),
            s.step_size, s.bc2_sqrt, SPLIT=low is not None, ZERO=zero_grad, BLOCK=ADAMW_BLOCK, num_warps=ADAMW_WARPS)


def adamw_reference_(weight, low, grad, exp_avg, exp_avg_sq, coef, scalars: AdamWStep, zero_grad: bool) -> None:
    """AdamW as torch's fused AdamW (CUDA) steps it, the gradient multiplied by `coef` first (as
    clipping's _foreach_mul_ does), the weight decay's and the moments' products in float64 from the
    float32 values, the rest in float32. (torch 2.11 computes the moments in float32 with fused
    multiply-adds: on H200s, five steps, 91-99.9% of the weights bitwise, the rest within 3.5e-10;
    tests/train/test_train_optimizer.py holds both to a float64 step.)"""
    s, f64 = scalars, torch.float64
    p = join_bits(weight, low) if low is not None else weight.clone()
    g = (grad * coef).to(f64)
    p = (p.to(f64) - (s.lr * s.weight_decay) * p.to(f64)).float()
    exp_avg.copy_(s.beta1 * exp_avg.to(f64) + (1 - s.beta1) * g)
    exp_avg_sq.copy_(s.beta2 * exp_avg_sq.to(f64) + (1 - s.beta2) * g * g)
    denom = ((exp_avg_sq.sqrt() / s.bc2_sqrt).to(f64) + s.eps).float()
    p -= s.step_size * exp_avg / denom
    if low is not None:
        high, rest = split_bits(p)
        weight.copy_(high)
        low.copy_(rest)
    else:
        weight.copy_(p)
    if zero_grad:
        grad.zero_()

