"""What one training step computes, apart from the loop around it.

A micro-batch's forward under bf16 autocast gives the unmasked per-token loss (megatron-core's
GPTModel returns it); the trainer weighs it by the loss mask over the whole global batch. Then
the global gradient norm is clipped (tensor-parallel shards counted once) and AdamW steps with a
warmup + cosine learning rate. Validation averages the same masked loss.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from .attention import document_mask
from .config import OptimConfig
from .loss import linear_cross_entropy


def thd_params(batch: dict) -> tuple[dict, PackedSeqParams]:
    """Transformer Engine's packed form: the micro-batch as one [1, b·s] row of variable-length
    sequences, cu_seqlens over all of them (padding positions are a sequence of their own)."""
    b, s = batch["tokens"].shape
    starts = []
    for row in range(b):
        cu = batch["cu_seqlens"][row]
        starts.append(cu[cu < s] + row * s)
    cu = torch.cat(starts + [torch.tensor([b * s], dtype=torch.int32)]).to(torch.int32)
    longest = int(batch["max_seqlen"].max())
    flat = {k: batch[k].reshape(1, b * s) for k in ("tokens", "labels", "loss_mask", "position_ids")}
    return flat, PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=longest, max_seqlen_kv=longest)


def _inputs(batch: dict, attention: str, device: torch.device) -> tuple[dict, tuple, Optional[PackedSeqParams]]:
    """(the batch, reshaped for THD if packed under te; the model's tokens, position ids and
    attention mask, on `device`; TE's packed-sequence parameters or None)."""
    packed = bool(batch["segment_ids"].amax() > 0)
    packed_seq_params = None
    if packed and attention == "te":
        batch, packed_seq_params = thd_params(batch)
        packed_seq_params = PackedSeqParams(**{k: (v.to(device) if torch.is_tensor(v) else v)
                                               for k, v in vars(packed_seq_params).items()})
    mask = None
    if packed and attention == "sdpa":
        mask = document_mask(batch["segment_ids"].to(device))
    elif attention == "local":  # megatron's own attention: a dense [b, 1, s, s] mask, True = masked
        mask = ~document_mask(batch["segment_ids"].to(device)).dense()
    inputs = (batch["tokens"].to(device, non_blocking=True), batch["position_ids"].to(device, non_blocking=True), mask)
    return batch, inputs, packed_seq_params


def forward(model, batch: dict, attention: str, device: torch.device, autocast: bool) -> torch.Tensor:
    """Per-token loss [b, s] (float32, unmasked) of one micro-batch (CPU tensors from the loader),
    by megatron-core's own output layer and cross-entropy.

    Rows that hold several segments (packed SFT, or pretraining with --reset-attention-mask) get a
    document mask (sdpa) or THD packing (te); single-segment rows run plain causal attention.
    """
    batch, inputs, packed_seq_params = _inputs(batch, attention, device)
    labels = batch["labels"].to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        return model(*inputs, labels=labels, packed_seq_params=packed_seq_params)


def masked_loss(model, batch: dict, weights: torch.Tensor, attention: str, device: torch.device, autocast: bool,
                cross_entropy: str) -> torch.Tensor:
    """Σ per-token loss × `weights` ([b, s], on `device`) of one micro-batch: by `forward`
    (cross_entropy "megatron") or by `loss.linear_cross_entropy` on the decoder's output ("fused")."""
    if cross_entropy == "megatron":
        return (forward(model, batch, attention, device, autocast) * weights).sum()
    batch, hidden = decoder_output(model, batch, attention, device, autocast)
    core = _core(model)
    weight = core.shared_embedding_or_output_weight() if core.share_embeddings_and_output_weights \
        else core.output_layer.weight
    return linear_cross_entropy(hidden, weight, batch["labels"].to(device, non_blocking=True), weights,
                                torch.bfloat16 if autocast else weight.dtype,
                                sequence_parallel=core.config.sequence_parallel)


def decoder_output(model, batch: dict, attention: str, device: torch.device, autocast: bool) -> tuple[dict, torch.Tensor]:
    """(the batch as `_inputs` leaves it, the decoder's output [s, b, h] for it): the model run
    without its output layer."""
    batch, inputs, packed_seq_params = _inputs(batch, attention, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast), decoder_output_only(_core(model)):
        return batch, model(*inputs, packed_seq_params=packed_seq_params)


def _core(model):
    return model.module if isinstance(model, DistributedDataParallel) else model


def stage_output(model, batch: dict, weights: torch.Tensor, attention: str, device: torch.device, autocast: bool,
                 cross_entropy: str) -> torch.Tensor:
    """What this pipeline stage hands on for one micro-batch: the last stage, the masked loss sum
    (`masked_loss`); the others, their hidden states (the first from the tokens, the rest from
    the activations megatron-core's schedule has set as the model's input)."""
    if parallel_state.is_pipeline_last_stage():
        return masked_loss(model, batch, weights, attention, device, autocast, cross_entropy)
    return decoder_output(model, batch, attention, device, autocast)[1]


def forward_backward(model, micro: list[dict], masks: list[torch.Tensor], scale: torch.Tensor, attention: str,
                     device: torch.device, autocast: bool, cross_entropy: str, seq_length: int,
                     forward_only: bool = False) -> torch.Tensor:
    """One step's micro-batches through megatron-core's schedule for this layout (1F1B across
    pipeline stages; one after another without pipelining): forward, and unless `forward_only`
    backward of each micro-batch's Σ loss × mask × `scale`. → [Σ loss × mask, Σ mask] on every
    rank of the pipeline."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def forward_step(data_iterator, stage):
        batch, mask = next(data_iterator)
        output = stage_output(stage, batch, mask, attention, device, autocast, cross_entropy)
        count = mask.sum()
        return output, lambda loss_sum: (loss_sum * scale, count.int(), {"sum": loss_sum.detach(), "count": count})

    results = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=zip(micro, masks), model=[model],
        num_microbatches=len(micro), seq_length=seq_length, micro_batch_size=micro[0]["tokens"].shape[0],
        forward_only=forward_only)
    total = torch.zeros(2, device=device)
    for r in results:
        total += torch.stack([r["sum"].float(), r["count"].float()])
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:  # the last stage's sums to every stage
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return total


BUCKET_ELEMENTS = 1 << 25  # gradient elements all-reduced at a time (128 MB of float32)


def all_reduce_grads(grads: list[torch.Tensor], group, divide_by: int = 1) -> None:
    """Sum `grads` over `group` (then divide), in place, as flat buckets of BUCKET_ELEMENTS."""
    bucket: list[torch.Tensor] = []
    elements = 0
    for grad in grads + [None]:  # None: the end, which sends the last bucket
        if bucket and (grad is None or elements + grad.numel() > BUCKET_ELEMENTS):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=group)
            if divide_by > 1:
                flat /= divide_by
            for g, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                g.copy_(reduced)
            bucket, elements = [], 0
        if grad is not None:
            bucket.append(grad)
            elements += grad.numel()


def average_data_parallel_grads(params: list[torch.nn.Parameter]) -> None:
    """Gradients averaged over the data-parallel group: what torch DDP does during backward, done
    after a pipeline schedule instead. (DDP prepares its reduction in forward, and 1F1B runs the
    last micro-batches' forwards before it lets gradients sync, so under DDP those would never be
    reduced.)"""
    size = parallel_state.get_data_parallel_world_size()
    if size > 1:
        all_reduce_grads([p.grad for p in params if p.grad is not None], parallel_state.get_data_parallel_group(),
                         divide_by=size)


def sum_partial_grads(core) -> None:
    """Gradients of parameters every tensor-parallel rank holds whole but sees only part of the
    work of, summed over the TP group (as megatron-core's finalize_model_grads does): Qwen3's QK
    norms (a rank normalises only its own heads) and, under sequence parallelism, the layer norms
    (a rank sees only its part of the sequence). Left alone, those copies would drift apart."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    sequence_parallel = core.config.sequence_parallel
    all_reduce_grads([p.grad for name, p in core.named_parameters()
                      if p.grad is not None and ("q_layernorm" in name or "k_layernorm" in name
                                                 or (sequence_parallel and getattr(p, "sequence_parallel", False)))],
                     parallel_state.get_tensor_model_parallel_group())


def sync_tied_embedding_grads(core) -> None:
    """With tied embeddings split over pipeline stages, the first stage's embedding and the last
    stage's output layer are two copies of one weight: their gradients are summed, so both take
    the same step."""
    if (parallel_state.get_pipeline_model_parallel_world_size() > 1 and core.share_embeddings_and_output_weights
            and parallel_state.is_rank_in_embedding_group()):
        weight = core.shared_embedding_or_output_weight()
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        dist.all_reduce(weight.grad, group=parallel_state.get_embedding_group())


@contextlib.contextmanager
def decoder_output_only(core) -> Iterator[None]:
    """GPTModel returns the decoder's (final-normed) hidden states instead of logits or losses: it
    skips its output layer when it is not the last pipeline stage, and that is the one switch
    megatron-core 0.16 to 0.19 all honour."""
    was, core.post_process = core.post_process, False
    try:
        yield
    finally:
        core.post_process = was


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients over the model-parallel group (TP × PP; a TP-replicated
    parameter, and the last stage's copy of tied embeddings, counted once), scaled down to
    `max_norm` if above (0 = measure only)."""
    grads = [p.grad for p in params if p.grad is not None]
    unique = [p.grad for p in params
              if p.grad is not None and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]
    norms = torch._foreach_norm(unique) if unique else [torch.zeros((), device=params[0].device)]
    norm_sq = torch.stack(norms).float().square().sum()
    if parallel_state.get_tensor_model_parallel_world_size() * parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(norm_sq, group=parallel_state.get_model_parallel_group())
    norm = norm_sq.sqrt()
    if max_norm > 0:
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


@dataclass(frozen=True)
class Schedule:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at `total` iterations."""

    lr: float
    min_lr: float
    warmup: int
    total: int

    def __call__(self, it: int) -> float:
        if it < self.warmup:
            return self.lr * (it + 1) / self.warmup
        progress = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases and norm weights (the 1-D parameters), as Megatron."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_eps, fused=next(model.parameters()).is_cuda)


@torch.no_grad()
def evaluate(model, batches: Iterator[dict], iters: int, attention: str, device, autocast: bool,
             cross_entropy: str, seq_length: int) -> Optional[float]:
    """Mean masked loss over up to `iters` micro-batches of every data-parallel rank."""
    model.eval()
    total = torch.zeros(2, device=device)
    one = torch.ones((), device=device)
    for _ in range(iters):
        batch = next(batches, None)
        if batch is None:
            break
        total += forward_backward(model, [batch], [batch["loss_mask"].to(device)], one, attention, device, autocast,
                                  cross_entropy, seq_length, forward_only=True)
    model.train()
    dist.all_reduce(total, group=parallel_state.get_data_parallel_group())
    return (total[0] / total[1]).item() if total[1] > 0 else None
