"""Where each megatron-core GPTModel parameter comes from in a Hugging Face Qwen checkpoint, and
how a tensor-parallel rank's slice of it is cut and joined again.

Per layer (h attention heads, g query groups, d head_dim; TP size t, rank r):
  linear_qkv   q_proj, k_proj, v_proj rows regrouped: for each query group its h/g query heads,
               then its key head, then its value head; rank r holds groups r·g/t … (r+1)·g/t.
               The QKV bias (Qwen2) alike.
  linear_proj  o_proj, columns split over ranks.
  linear_fc1   gate_proj and up_proj: rank r holds [its gate rows; its up rows].
  linear_fc2   down_proj, columns split.
  norms        input_layernorm, post_attention_layernorm (megatron's pre_mlp_layernorm, or the
               norm Transformer Engine fuses into linear_qkv / linear_fc1), Qwen3's q_norm and
               k_norm: whole on every rank.
Qwen3-MoE layers, for linear_fc1 / linear_fc2:
  router       mlp.gate: whole on every rank.
  experts      local expert j of an expert-parallel rank is expert `expert_offset` + j:
               mlp.experts.{e}.gate_proj / up_proj / down_proj, split over TP like the dense MLP.
Outside the layers: embed_tokens and lm_head rows (the vocabulary) split over ranks, model.norm
whole. With tied embeddings there is no output_layer (nor, in the HF folder, an lm_head).

A `TensorSlicing` reads a rank's slice through `read(name, dim, start, stop)` (so a rank never
loads more of a tensor than it keeps) and joins all ranks' slices back into the HF tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..shapes import ModelShape

# read(hf_name, dim, start, stop) -> the tensor's [start:stop] along dim (dim None: all of it)
Reader = Callable[[str, Optional[int], int, int], torch.Tensor]
# size(hf_name) -> the tensor's full shape
Sizer = Callable[[str], tuple]


class TensorSlicing:
    """How one megatron parameter is cut from (and joined into) its HF tensors."""

    dim: Optional[int] = None  # the dimension TP splits, None = replicated

    def read(self, names: list[str], read: Reader, size: Sizer, rank: int, tp: int) -> torch.Tensor:
        raise NotImplementedError

    def join(self, shards: list[torch.Tensor], count: int) -> list[torch.Tensor]:
        """All ranks' slices (in rank order) → the `count` HF tensors."""
        raise NotImplementedError


def _range(n: int, rank: int, tp: int, name: str, dim: int) -> tuple[int, int]:
    if n % tp:
        raise ValueError(f"{name}: {n} along dimension {dim} does not split over {tp} tensor-parallel ranks")
    return rank * n // tp, (rank + 1) * n // tp


class Whole(TensorSlicing):
    def read(self, names, read, size, rank, tp):
        return read(names[0], None, 0, 0)

    def join(self, shards, count):
        return [shards[0]]


@dataclass
class Split(TensorSlicing):
    """One HF tensor, split along `dim` (0: rows, column-parallel; 1: columns, row-parallel)."""

    dim: int

    def read(self, names, read, size, rank, tp):
        return read(names[0], self.dim, *_range(size(names[0])[self.dim], rank, tp, names[0], self.dim))

    def join(self, shards, count):
        return [torch.cat(shards, self.dim)]


class Stacked(TensorSlicing):
    """Several HF tensors whose rows each rank holds its slice of, one after another (gate; up)."""

    dim = 0

    def read(self, names, read, size, rank, tp):
        return torch.cat([read(n, 0, *_range(size(n)[0], rank, tp, n, 0)) for n in names])

    def join(self, shards, count):
        pieces = [s.chunk(count) for s in shards]
        return [torch.cat([p[i] for p in pieces]) for i in range(count)]


@dataclass
class GroupedQKV(TensorSlicing):
    """q, k, v rows (or biases) regrouped by query group, megatron's GQA layout."""

    heads: int
    groups: int
    head_dim: int
    dim = 0

    def _rows(self) -> list[int]:
        return [self.heads // self.groups * self.head_dim, self.head_dim, self.head_dim]

    def read(self, names, read, size, rank, tp):
        if self.groups % tp:
            raise ValueError(f"{self.groups} query groups do not split over {tp} tensor-parallel ranks")
        local = self.groups // tp
        parts = [read(n, 0, rank * local * rows, (rank + 1) * local * rows)
                 for n, rows in zip(names, self._rows())]
        rest = parts[0].shape[1:]
        return torch.cat([p.reshape(local, -1, *rest) for p in parts], 1).reshape(-1, *rest)

    def join(self, shards, count):
        full = torch.cat(shards)
        rest = full.shape[1:]
        grouped = full.reshape(self.groups, -1, *rest)
        return [p.reshape(-1, *rest) for p in grouped.split(self._rows(), 1)]


ROWS, COLUMNS, WHOLE, STACKED = Split(0), Split(1), Whole(), Stacked()

_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight")
_OUTSIDE = {
    "embedding.word_embeddings.weight": (ROWS, ["model.embed_tokens.weight"]),
    "decoder.final_layernorm.weight": (WHOLE, ["model.norm.weight"]),
    "output_layer.weight": (ROWS, ["lm_head.weight"]),
}
_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",  # Transformer Engine
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",  # Transformer Engine
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def hf_source(name: str, shape: ModelShape, layer_offset: int = 0,
              expert_offset: int = 0) -> tuple[TensorSlicing, list[str]]:
    """(slicing, HF tensor names) of the megatron parameter `name` of a pipeline stage whose first
    layer is global layer `layer_offset` (and, of a MoE model, of an expert-parallel rank whose
    first expert is `expert_offset`). With tied embeddings split over stages, the last stage's
    output layer is its copy of the embeddings."""
    if name == "output_layer.weight" and shape.tied_embeddings:
        return _OUTSIDE["embedding.word_embeddings.weight"]
    if name in _OUTSIDE:
        return _OUTSIDE[name]
    match = _LAYER.fullmatch(name)
    if match is None:
        raise KeyError(f"megatron parameter {name} has no Hugging Face counterpart")
    prefix, rest = f"model.layers.{int(match[1]) + layer_offset}.", match[2]
    if rest in _NORMS:
        return WHOLE, [prefix + _NORMS[rest]]
    if rest == "mlp.router.weight":
        return WHOLE, [prefix + "mlp.gate.weight"]
    expert = _EXPERT.fullmatch(rest)
    if expert:
        experts = f"{prefix}mlp.experts.{int(expert[1]) + expert_offset}."
        if expert[2] == "linear_fc1":
            return STACKED, [experts + "gate_proj.weight", experts + "up_proj.weight"]
        return COLUMNS, [experts + "down_proj.weight"]
    qkv = GroupedQKV(shape.num_attention_heads, shape.num_query_groups, shape.kv_channels)
    slicings = {
        "self_attention.linear_qkv.weight": (qkv, [f"self_attn.{p}_proj.weight" for p in "qkv"]),
        "self_attention.linear_qkv.bias": (qkv, [f"self_attn.{p}_proj.bias" for p in "qkv"]),
        "self_attention.linear_proj.weight": (COLUMNS, ["self_attn.o_proj.weight"]),
        "mlp.linear_fc1.weight": (STACKED, ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
        "mlp.linear_fc2.weight": (COLUMNS, ["mlp.down_proj.weight"]),
    }
    if rest not in slicings:
        raise KeyError(f"megatron parameter {name} has no Hugging Face counterpart")
    slicing, names = slicings[rest]
    return slicing, [prefix + n for n in names]
