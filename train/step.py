"""What one training step computes: its micro-batches' forward and backward, and the loss.

A micro-batch's forward under bf16 autocast gives the unmasked per-token loss (megatron-core's
GPTModel returns it); the trainer weighs it by the loss mask over the whole global batch.
Validation averages the same masked loss. How the gradients are then reduced across ranks is
distributed.py's; clipping and AdamW are optimizer.py's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from .attention import context_mask, context_positions, document_mask, thd_mask
from .distributed import gradient_group, unwrapped
from .loss import linear_cross_entropy
from . import marks
from .model.experts import weights_shared


@dataclass(frozen=True)
class ForwardSpec:
    """How every micro-batch of a run goes through the model."""

    attention: str  # resolved: te, sdpa or local (plan.resolve_attention)
    device: torch.device  # where the micro-batches go
    autocast: bool  # bf16 autocast
    cross_entropy: str  # config.CROSS_ENTROPY_CHOICES
    seq_length: int  # the samples' length, for the pipeline schedule's activation shapes
    pad: Optional[int] = None  # the data's pad id: positions holding it are no tokens (balance.py leaves them out)
    # autocast's cache of weight casts; a CUDA graph's capture runs without it, as torch asks (graphs.py)
    autocast_cache: bool = True

    def bf16(self):
        """The micro-batch's autocast context: bf16 where the spec autocasts."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast,
                              cache_enabled=self.autocast_cache)


def is_packed(batch: dict) -> bool:
    """Whether a micro-batch's rows hold more than one segment (packed samples, or documents kept
    apart by --reset-attention-mask): they take a document mask; single-segment rows run causal."""
    return bool(batch["segment_ids"].amax() > 0)


def _inputs(batch: dict, spec: ForwardSpec) -> tuple:
    """The model's tokens, position ids and attention mask for `batch`, on the spec's device: no
    mask for rows of one segment (causal), else the core attention's form of the segments."""
    attention, device = spec.attention, spec.device
    packed = is_packed(batch)
    mask = None
    cp = parallel_state.get_context_parallel_world_size()
    if cp > 1:
        mask = context_mask(batch["segment_ids"].to(device), parallel_state.get_context_parallel_rank(), cp)
    elif packed and attention == "te":
        mask = thd_mask(batch, device)
    elif packed and attention == "sdpa":
        mask = document_mask(batch["segment_ids"].to(device))
    elif attention == "local":  # megatron's own attention: a dense [b, 1, s, s] mask, True = masked
        mask = ~document_mask(batch["segment_ids"].to(device)).dense()
    return batch["tokens"].to(device, non_blocking=True), batch["position_ids"].to(device, non_blocking=True), mask


def forward(model, batch: dict, spec: ForwardSpec, inputs: Optional[tuple] = None) -> torch.Tensor:
    """Per-token loss [b, s] (float32, unmasked) of one micro-batch (CPU tensors from the loader),
    by megatron-core's own output layer and cross-entropy.

    Rows that hold several segments (packed SFT, or pretraining with --reset-attention-mask) get a
    document mask (sdpa) or THD packing (te); single-segment rows run plain causal attention.
    """
    labels = batch["labels"].to(spec.device, non_blocking=True)
    with spec.bf16():
        return model(*(inputs or _inputs(batch, spec)), labels=labels)


def masked_loss(model, batch: dict, weights: torch.Tensor, spec: ForwardSpec,
                inputs: Optional[tuple] = None) -> torch.Tensor:
    """Σ per-token loss × `weights` ([b, s], on the spec's device) of one micro-batch: by `forward`
    (cross_entropy "megatron") or by `loss.linear_cross_entropy` on the decoder's output ("fused").
    `inputs`: the model's (tokens, position ids, mask) where the caller made them (`_inputs`)."""
    if spec.cross_entropy == "megatron":
        return (forward(model, batch, spec, inputs) * weights).sum()
    hidden = decoder_output(model, batch, spec, inputs)
    core = unwrapped(model)
    weight = core.shared_embedding_or_output_weight() if core.share_embeddings_and_output_weights \
        else core.output_layer.weight
    return linear_cross_entropy(hidden, weight, batch["labels"].to(spec.device, non_blocking=True), weights,
                                torch.bfloat16 if spec.autocast else weight.dtype,
                                sequence_parallel=core.config.sequence_parallel)


def decoder_output(model, batch: dict, spec: ForwardSpec, inputs: Optional[tuple] = None) -> torch.Tensor:
    """The decoder's output [s, b, h] for `batch`: the model run without its output layer."""
    with spec.bf16(), decoder_output_only(unwrapped(model)):
        return model(*(inputs or _inputs(batch, spec)))


def stage_output(model, batch: dict, weights: torch.Tensor, spec: ForwardSpec) -> torch.Tensor:
    """What this pipeline stage hands on for one micro-batch: the last stage, the masked loss sum
    (`masked_loss`); the others, their hidden states (the first from the tokens, the rest from
    the activations megatron-core's schedule has set as the model's input)."""
    if parallel_state.is_pipeline_last_stage():
        return masked_loss(model, batch, weights, spec)
    return decoder_output(model, batch, spec)


def context_part(batch: dict, weights: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """This context-parallel rank's part of a micro-batch and of its loss weights: its positions of
    each row (`attention.context_positions`). The segment ids stay whole: the keys the attention
    gathers from the other ranks are masked by them too."""
    s = batch["tokens"].shape[1]
    where = context_positions(s, parallel_state.get_context_parallel_rank(),
                              parallel_state.get_context_parallel_world_size())
    part = {**batch, **{k: batch[k][:, where] for k in ("tokens", "labels", "loss_mask", "position_ids")}}
    return part, weights[:, where.to(weights.device)]


def forward_backward(model, micro: list[dict], masks: list[torch.Tensor], scale: torch.Tensor, spec: ForwardSpec,
                     forward_only: bool = False) -> torch.Tensor:
    """One step's micro-batches through megatron-core's schedule for this layout (1F1B across
    pipeline stages; one after another without pipelining): forward, and unless `forward_only`
    backward of each micro-batch's Σ loss × mask × `scale`. → [Σ loss × mask, Σ mask] on every
    rank of the pipeline (of this rank's part of the rows, under context parallelism)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    core = unwrapped(model)
    balance = marks.balance_loss(core)  # balance.py's, weighed by the whole micro-batch's trained tokens
    trained = [mask.sum() for mask in masks]
    if parallel_state.get_context_parallel_world_size() > 1:
        micro, masks = map(list, zip(*(context_part(batch, mask) for batch, mask in zip(micro, masks))))

    def forward_step(data_iterator, stage):
        batch, mask, whole = next(data_iterator)
        if balance is not None:
            balance.begin(whole, batch["tokens"].to(spec.device, non_blocking=True), spec.pad)
        output = stage_output(stage, batch, mask, spec)
        count = mask.sum()
        return output, lambda loss_sum: (loss_sum, count.int(), {"sum": loss_sum.detach(), "count": count})

    # `scale` goes through megatron-core's own hook: the schedule multiplies each micro-batch's loss
    # by it before backward, and MoE layers scale their load-balancing loss by it too.
    # Transformer Engine's FP8 linears cast their weights once a step and reuse the casts for the
    # step's other micro-batches; the schedule starts a step's casting only on a model that has
    # set_is_first_microbatch, which torch's DDP wrapper hides: without this, data-parallel FP8
    # runs would compute with the first step's weights ever after.
    core.set_is_first_microbatch()
    config = core.config
    config.grad_scale_func = lambda loss: loss * scale
    try:
        with weights_shared(core):  # the step's micro-batches share its experts' stacked weights
            results = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=zip(micro, masks, trained), model=[model],
                num_microbatches=len(micro), seq_length=spec.seq_length,
                micro_batch_size=micro[0]["tokens"].shape[0], forward_only=forward_only)
    finally:
        config.grad_scale_func = None
    total = torch.zeros(2, device=spec.device)
    for r in results:
        total += torch.stack([r["sum"].float(), r["count"].float()])
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:  # the last stage's sums to every stage
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return total


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


@torch.no_grad()
def evaluate(model, batches: Iterator[dict], iters: int, spec: ForwardSpec) -> Optional[float]:
    """Mean masked loss over up to `iters` micro-batches of every data-parallel rank."""
    model.eval()
    total = torch.zeros(2, device=spec.device)
    one = torch.ones((), device=spec.device)
    for _ in range(iters):
        batch = next(batches, None)
        if batch is None:
            break
        total += forward_backward(model, [batch], [batch["loss_mask"].to(spec.device)], one, spec, forward_only=True)
    model.train()
    dist.all_reduce(total, group=gradient_group())
    return (total[0] / total[1]).item() if total[1] > 0 else None
