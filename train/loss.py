"""The language-model loss without a logit tensor in memory.

megatron-core's GPTModel projects every position onto the whole vocabulary and only then takes the
cross-entropy: with Qwen's 151,936 rows that is a [tokens, vocab] tensor in bf16, its float32 copy
and its float32 gradient, 2.5 GB each per 4096 tokens, most of a step's memory at micro batch 2 and
above. `linear_cross_entropy` runs the output projection and the cross-entropy together over chunks
of positions. The gradients (with respect to the hidden states and to the output weight) are
computed in the forward pass while a chunk's logits exist; backward only scales them by the
incoming gradient, so no logits are kept and none are recomputed.

Tensor parallelism: the weight is this rank's slice of the vocabulary (megatron's ColumnParallel
output layer and VocabParallel embedding split it the same way); the softmax's maximum, its sum and
the target's logit are all-reduced over the tensor-parallel group, as megatron-core's
vocab-parallel cross-entropy does, and the hidden states' gradient is summed over the group on the
way back (megatron's copy-to-region).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                    gather_from_sequence_parallel_region)

from . import kernels, marks

# Positions per chunk: 4096 × 151,936 bf16 logits = 1.2 GB at a time, big enough matmuls.
CHUNK_TOKENS = 4096


def _all_reduce(tensor: torch.Tensor, op, group) -> None:
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)


def _sum_exp(logits, peak, at, here):
    """Per row: Σ exp(logit − peak), and the label's logit − peak (0 where the label is on another
    rank's slice). One pass over the logits once compiled."""
    shifted = logits.float() - peak[:, None]
    target = torch.where(here, shifted.gather(1, at[:, None]).squeeze(1), 0.0)
    return shifted.exp().sum(-1), target


def _softmax_stats(logits, at, here):
    """Per row: the maximum logit, Σ exp(logit − maximum), and the label's logit − maximum: one
    read of the bf16 logits once compiled (inductor's online softmax takes the maximum and the sum
    in one pass), where no other rank holds part of the row."""
    peak = logits.amax(-1).float()
    sums, target = _sum_exp(logits, peak, at, here)
    return peak, sums, target


def _logit_grad(logits, peak, sums, at, here, c):
    """d(Σ c·loss)/d logits = c·(softmax − one-hot of the label), in the logits' dtype."""
    scaled = (logits.float() - peak[:, None]).exp() * (c / sums)[:, None]
    label = (torch.arange(logits.shape[1], device=logits.device)[None, :] == at[:, None]) & here[:, None]
    return (scaled - label * c[:, None]).to(logits.dtype)


_compiled = {}


def _accumulate_mm(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, first: bool = False) -> None:
    """out += a @ b (`first`: out = a @ b, whatever `out` held), `out` float32, `a` and `b` in a lower
    precision: on CUDA one matmul that accumulates into `out` in float32 (no product rounded to the
    inputs' dtype, no separate add); elsewhere the product in float32, added. (`first` spares the
    zeros a [vocab, h] gradient would be filled with: 117 us of a 0.5B micro-batch on an H200.)"""
    if out.is_cuda:
        if first:
            torch.mm(a, b, out_dtype=torch.float32, out=out)
        else:
            torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    elif first:
        out.copy_(a @ b)
    else:
        out += (a @ b).float()


def _kernel(fn, device: torch.device):
    """`fn` compiled on CUDA (the float32 softmax passes fused into one read of the bf16 logits);
    as it is elsewhere (the CPU's tests need no compiler)."""
    if device.type != "cuda":
        return fn
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn)
    return _compiled[fn]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, dtype, group, need_grads):
        """Σ weights × cross-entropy(hidden @ weightᵀ, labels): hidden [n, h], weight [v, h] (this
        rank's vocabulary slice), labels and weights [n]; matmuls in `dtype`, softmax in float32."""
        rows_of_vocab = weight.shape[0]
        first = rows_of_vocab * parallel_state.get_tensor_model_parallel_rank()
        sum_exp, logit_grad = _kernel(_sum_exp, hidden.device), _kernel(_logit_grad, hidden.device)
        softmax_stats = _kernel(_softmax_stats, hidden.device)
        triton = kernels.enabled(hidden)  # train/kernels.py: one read of the logits for the statistics
        w = weight.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        if need_grads:
            grad_hidden = torch.empty(hidden.shape, dtype=dtype, device=hidden.device)
            # the first chunk's product writes it whole (`_accumulate_mm`); zeros where there is none
            grad_weight = (torch.empty if hidden.shape[0] else torch.zeros)(weight.shape, dtype=torch.float32,
                                                                            device=weight.device)
        for start in range(0, hidden.shape[0], CHUNK_TOKENS):
            h = hidden[start:start + CHUNK_TOKENS].to(dtype)
            c = weights[start:start + CHUNK_TOKENS].float()
            local = labels[start:start + CHUNK_TOKENS] - first
            here = (local >= 0) & (local < rows_of_vocab)
            at = local.clamp(0, rows_of_vocab - 1)
            logits = h @ w.t()
            if group is None and triton:
                peak, sums, target = kernels.softmax_stats(logits, at, here)
            elif group is None:
                peak, sums, target = softmax_stats(logits, at, here)
            else:
                peak = logits.amax(-1).float()
                _all_reduce(peak, dist.ReduceOp.MAX, group)
                sums, target = sum_exp(logits, peak, at, here)
                _all_reduce(target, dist.ReduceOp.SUM, group)
                _all_reduce(sums, dist.ReduceOp.SUM, group)
            total += ((sums.log() - target) * c).sum()
            if need_grads:
                if triton:  # over the logits, in place
                    g = kernels.logit_grad_(logits, peak, sums, at, here, c)
                else:
                    g = logit_grad(logits, peak, sums, at, here, c)
                del logits
                torch.mm(g, w, out=grad_hidden[start:start + CHUNK_TOKENS])
                _accumulate_mm(grad_weight, g.t(), h, first=start == 0)
        if need_grads:
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.hidden_dtype = hidden.dtype
        # A bf16 weight split from its float32 master (optimizer.AdamW) takes its float32 gradient
        # here, unrounded, as a float32 weight would.
        ctx.float32_grad = marks.float32_grad(weight)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        # in place (its memory is this step's alone) and by a multi-tensor kernel: a 0-dim CUDA factor
        # sends `*` to torch's unvectorised path (0.5B, [151,936, 896] float32: 400 us on an H200)
        torch._foreach_mul_([grad_weight], grad_total)
        if ctx.float32_grad is not None:
            ctx.float32_grad.add_(grad_weight)
            grad_weight = None
        return (grad_hidden * grad_total).to(ctx.hidden_dtype), grad_weight, None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         weights: torch.Tensor, dtype: torch.dtype, sequence_parallel: bool = False) -> torch.Tensor:
    """Σ weights × cross-entropy of `hidden @ weightᵀ` against `labels`, a float32 scalar.

    hidden: the decoder's output [s, b, h] (megatron's order; [s/tp, b, h] under sequence
    parallelism); weight: the output layer's [vocab / tp, h]; labels and weights: [b, s].
    """
    group = None
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        group = parallel_state.get_tensor_model_parallel_group()
        if sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden)
    flat = hidden.transpose(0, 1).reshape(-1, hidden.shape[-1])  # [b·s, h], the labels' order
    if group is not None and not sequence_parallel:
        # After the reshape: megatron's backward all-reduces a contiguous copy of the gradient and
        # returns the gradient it was given, so that gradient must already be contiguous.
        flat = copy_to_tensor_model_parallel_region(flat)
    need_grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(flat, weight, labels.reshape(-1), weights.reshape(-1), dtype, group,
                                         need_grads)
