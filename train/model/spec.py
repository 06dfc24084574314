"""The spec of a layer: megatron-core's local spec for the shape, then our converters."""

from __future__ import annotations

import functools

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

from ..shapes import ModelShape
from .converters import (Converter, autocast_dispatch, core_attention, fp8_linears, grouped_experts,
                         grouped_row_parallel, seeded_layers, sequence_parallel_norms)
from .layers import RMSNorm


def local_spec(preset: ModelShape) -> ModuleSpec:
    """megatron-core's local layer for `preset`: RMSNorm, QK norms where Qwen3 has them, its experts."""
    return get_gpt_layer_local_spec(num_experts=preset.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=preset.qk_norm, normalization="RMSNorm")


def layer_converters(preset: ModelShape, attention: str, seed: int = 0, sequence_parallel: bool = False,
                     fp8: bool = False, grouped: bool = True) -> list[Converter]:
    """What changes in the local layer, in order: seeded layers; a mixture of experts' tokens sent in
    autocast's dtype and its experts by grouped GEMM (or one after another); the row-parallel linears
    with their group; our core attention; under `fp8` Transformer Engine's linears; under sequence
    parallelism our norms."""
    return [
        seeded_layers(seed),
        *([autocast_dispatch] if preset.moe else []),
        *([grouped_experts] if preset.moe and grouped else []),
        grouped_row_parallel,
        core_attention(attention),
        *([fp8_linears] if fp8 else []),
        *([sequence_parallel_norms(preset.qk_norm)] if sequence_parallel else []),
    ]


def layer_spec(preset: ModelShape, attention: str, seed: int = 0, sequence_parallel: bool = False,
               fp8: bool = False, grouped_experts: bool = True) -> ModuleSpec:
    """The local layer with `layer_converters` applied."""
    convert = layer_converters(preset, attention, seed, sequence_parallel, fp8, grouped_experts)
    return functools.reduce(lambda spec, converter: converter(spec), convert, local_spec(preset))


def block_spec(preset: ModelShape, attention: str, seed: int, sequence_parallel: bool, fp8: bool = False,
               grouped_experts: bool = True, layers: int = 1):
    """The decoder's spec: this stage's `layers`, and under sequence parallelism our RMSNorm as the
    final norm too (megatron-core would pick its torch wrapper)."""
    spec = layer_spec(preset, attention, seed, sequence_parallel, fp8, grouped_experts)
    if not sequence_parallel:
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * layers, layer_norm=RMSNorm)
