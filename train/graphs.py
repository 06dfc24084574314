"""Each micro-batch's forward and backward as one CUDA graph: captured once, replayed after.

A step of a small model launches thousands of short kernels; where they are short enough, the
host's launching, not the GPU, sets the pace. A replayed graph is one launch: on an H200,
Qwen2.5-0.5B at micro batch 1 trained 1.12x as fast graphed; at micro batch 4, where its kernels
already keep the GPU 96% busy, 1.00x (docs/performance.md, "CUDA graphs"). What a replay needs to
be the micro-batch it stands for:

- its inputs where the capture read them: tokens, positions, labels, loss weights and the
  gradient's scale are copied into the graph's own tensors before each replay, and packed rows'
  segment ids and FlexAttention block mask too (`attention.refill`), or under `--attention te`
  their THD cu_seqlens, in a form of a fixed sample count (`attention.refill_thd`, thd.py);
- the weights and gradients where the capture found them: `AdamW(in_place=True)` writes the split
  weights back into their bf16 memory and zeroes gradients instead of dropping them, and each
  capture follows an eager micro-batch of the same step, so every gradient exists and the graph
  adds to it (a gradient that did not exist would be written where no parameter looks);
- FP8's weight casts made inside the graph: captured as a step's first micro-batch, each replay
  casts the weights again (Transformer Engine otherwise reuses a step's first casts);
- nothing the host decides inside a micro-batch (`plan.cuda_graphs_unbuilt` lists what does).

Rows of one segment (causal attention) and packed rows (a document mask) are two graphs sharing
one memory pool; under `--attention te` packed rows are a graph for each THD sample count
(`thd.fixed_count`: 64 for 4 rows, a larger one only for a micro-batch of more samples), captured
with Transformer Engine's flag that a graph is being captured (its fused attention then reads no
sample count back to the host). The first micro-batch of each kind runs eagerly (in a run's first step it compiles
the layers), then is captured: a capture records kernels without running them, so that micro-batch
counts once. Validation runs eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch

from .attention import document_mask, fixed_thd_mask, refill, refill_thd, thd_samples
from .step import ForwardSpec, is_packed, masked_loss
from .thd import fixed_count

INPUTS = ("tokens", "position_ids", "labels")  # what a micro-batch brings, copied in


def kind(batch: dict, spec: ForwardSpec) -> tuple[bool, Optional[int]]:
    """The graph a micro-batch replays: (packed, the THD form's sample count under te, else None)."""
    packed = is_packed(batch)
    if not (packed and spec.attention == "te"):
        return packed, None
    return packed, fixed_count(thd_samples(batch), *batch["segment_ids"].shape)


@contextlib.contextmanager
def te_capturing(on: bool):
    """Transformer Engine told that a graph is being captured (`on`): its fused THD attention then
    takes cu_seqlens as they are, where eagerly it reads the sample count back to the host."""
    if not on:
        yield
        return
    import transformer_engine.pytorch.graph as te_graph
    te_graph.set_capture_start()
    try:
        yield
    finally:
        te_graph.set_capture_end()


class _Graph:
    """One kind of micro-batch (`kind`) captured: its input tensors, its loss's."""

    def __init__(self, model, core, spec: ForwardSpec, batch: dict, packed: bool, count: Optional[int]) -> None:
        self.model, self.core, self.spec = model, core, spec
        self.inputs = {k: torch.empty_like(batch[k], device=spec.device) for k in INPUTS}
        self.weights = torch.empty_like(batch["loss_mask"], device=spec.device)
        self.scale = torch.empty((), device=spec.device)
        # the graph's own segment ids, which its block mask reads (`refill` rewrites both), or its
        # own cu_seqlens (`refill_thd`)
        self.mask = (fixed_thd_mask(batch, spec.device, count) if count is not None
                     else document_mask(batch["segment_ids"].to(spec.device, copy=True)) if packed else None)
        self.thd = count is not None
        self.graph = torch.cuda.CUDAGraph()
        self.loss = None

    def _fill(self, batch: dict, mask: torch.Tensor, scale: torch.Tensor) -> None:
        for k in INPUTS:
            self.inputs[k].copy_(batch[k], non_blocking=True)
        self.weights.copy_(mask)
        self.scale.copy_(scale)
        if self.thd:
            refill_thd(self.mask, batch)
        elif self.mask is not None:
            refill(self.mask, batch["segment_ids"])

    def _micro_batch(self) -> torch.Tensor:
        x = self.inputs
        loss = masked_loss(self.model, x, self.weights, self.spec, (x["tokens"], x["position_ids"], self.mask))
        (loss * self.scale).backward()
        return loss.detach()

    def capture(self, batch: dict, mask: torch.Tensor, scale: torch.Tensor, pool) -> torch.Tensor:
        """This micro-batch run eagerly (on a side stream, as torch asks of the work before a
        capture), then captured: a capture records kernels without running them. Under te both
        with TE's capture flag: cuDNN's graph for the captured form is built by the eager run."""
        self._fill(batch, mask, scale)
        side, here = torch.cuda.Stream(self.spec.device), torch.cuda.current_stream(self.spec.device)
        side.wait_stream(here)
        with te_capturing(self.spec.attention == "te"):
            with torch.cuda.stream(side):
                loss = self._micro_batch()
            here.wait_stream(side)
            # Transformer Engine's FP8 linears cast their weights on a step's first micro-batch and reuse
            # the casts after: captured as a first micro-batch, every replay casts the weights AdamW wrote.
            self.core.set_is_first_microbatch()
            with torch.cuda.graph(self.graph, pool=pool):
                self.loss = self._micro_batch()
        # The eager micro-batch's activations, cached by the allocator beside the graph's own pool:
        # given back, so that graphs cost a run about one micro-batch's activations, not two.
        torch.cuda.empty_cache()
        return loss

    def replay(self, batch: dict, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self._fill(batch, mask, scale)
        self.graph.replay()
        return self.loss.clone()


class MicroBatchGraphs:
    """A model's training micro-batches through CUDA graphs (see the module's docstring)."""

    def __init__(self, model, core, spec: ForwardSpec) -> None:
        """`core`: the megatron-core model inside `model`'s wrapper."""
        self.model, self.core, self.spec = model, core, dataclasses.replace(spec, autocast_cache=False)
        self.graphs: dict[tuple[bool, Optional[int]], _Graph] = {}
        self.pool = None

    def run(self, batch: dict, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """[Σ loss × mask, Σ mask] of one micro-batch (the loader's CPU tensors; `mask` and `scale`
        on the GPU), its gradients × `scale` added to the parameters'."""
        key = kind(batch, self.spec)
        graph = self.graphs.get(key)
        if graph is None:
            self.graphs[key] = graph = _Graph(self.model, self.core, self.spec, batch, *key)
            loss = graph.capture(batch, mask, scale, self.pool)
            self.pool = graph.graph.pool()
        else:
            loss = graph.replay(batch, mask, scale)
        return torch.stack([loss.float(), mask.sum().float()])
