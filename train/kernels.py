"""Hand-written Triton kernels for the step's memory-bound pieces, each with the torch path it
replaces (the reference: the CPU, and CUDA when QWEN_TRAIN_KERNELS=torch).

  swiglu             SwiGLU as a custom op (opaque to inductor): forward silu(a)·b, backward both
                     halves of the input's gradient from one load of the gate, the input and the
                     output's gradient (inductor's backward of megatron-core's function loads the
                     input twice, once for each half of the concatenated gradient)
  softmax_stats      the fused cross-entropy's per-row maximum, Σ exp(logit − maximum) and the label's
                     logit in one read of the bf16 logits (online softmax: a running maximum, the sum
                     rescaled when it grows), where inductor read them twice
  logit_grad_        c·(softmax − one-hot) written over the logits in place

Arithmetic in float32, rounded once to the output's dtype, as inductor's fused kernels do; the sums
differ from the compiled path's only in their order. Triton is imported on first use on CUDA: CI
and the CPU never see it.

One H200, Qwen2.5-0.5B pretraining, micro batch 4, seq 4096 (bench/results/gpu/2026-11-30-small-mfu-kernels.md):
SwiGLU backward 16.1 -> 9.3 ms a step (bitwise the compiled path's numbers), the softmax passes 13.3 ->
9.5 ms; the step 277 -> 270 ms, 41.7% -> 42.9% MFU (causal), peak memory 22.5 -> 21.3 GiB.
"""

from __future__ import annotations

import functools
import importlib.util
import os

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

    return _swiglu(triton, tl) | _softmax(triton, tl)


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
    def softmax_stats(logits, at, here, peak, sums, target, vocab, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits + row * vocab
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        label = tl.load(at + row)
        t = tl.load(base + label).to(tl.float32) - m
        tl.store(peak + row, m)
        tl.store(sums + row, s)
        tl.store(target + row, tl.where(tl.load(here + row), t, 0.0))

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

    return dict(softmax_stats=softmax_stats, logit_grad=logit_grad)


# ---- SwiGLU --------------------------------------------------------------------------------------

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

STATS_BLOCK = 4096
GRAD_BLOCK = 4096


def softmax_stats(logits: torch.Tensor, at: torch.Tensor, here: torch.Tensor):
    """Per row of [n, v] logits (whole rows): the maximum (float32), Σ exp(logit − maximum) and the
    label's logit − maximum (0 where `here` is False): one read of the logits."""
    n, vocab = logits.shape
    assert logits.is_contiguous()
    peak, sums, target = (torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    if n:
        _triton()["softmax_stats"][(n,)](logits, at.contiguous(), here.contiguous(), peak, sums, target, vocab,
                                         BLOCK=STATS_BLOCK, num_warps=16)
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
