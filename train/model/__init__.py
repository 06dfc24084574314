"""Qwen-architecture GPTModels in megatron-core: the build of a `ModelShape` (a preset from the real
HF configs, `shapes.PRESETS`, or a Hugging Face folder's).

    preset = PRESETS["qwen2.5-0.5b"]
    model = build_model(RunPlan.for_model(preset, attention="sdpa"))  # after parallel_state.initialize_model_parallel

The package, bottom up (the marks it sets on parameters and the model are train/marks.py's):
  layers       our layers in megatron-core's local spec (seeded layers, RMSNorm, row-parallel linears)
  experts      a mixture of experts' experts as grouped matrix products
  balance      transformers' load-balancing loss over all layers' routing
  converters   functions spec → spec, each swapping some of the local spec's modules for ours
  spec         the layer spec: megatron-core's local spec, then the converters
  transformer  megatron-core's TransformerConfig of a model
  build        the plan → (config, spec) → this rank's GPTModel

What runs (the attention `auto` picks, the FP8 recipe, the compile mode ...) is decided before any of
this, by the run plan (train/plan.py).

Attention, the core of megatron-core's local layer spec (whose other modules torch.compile fuses):
  te     `train.attention.TECoreAttention`: Transformer Engine's fused attention (cuDNN), packed SFT
         rows as THD (PackedSeqParams, padding_causal); `TEPackedCoreAttention` (auto's choice under
         CUDA graphs) takes causal rows through PyTorch's SDPA instead.
  sdpa   `train.attention.SDPACoreAttention`: PyTorch's fused scaled_dot_product_attention for
         causal rows, FlexAttention with a document block mask for packed rows.
  local  megatron-core's own unfused DotProductAttention (a [b, h, s, s] score tensor: slow, memory
         hungry; kept for comparison only).
  auto   `plan.resolve_attention`: the fastest of these that runs here.
"""

from .build import build_model, model_parts

__all__ = ["build_model", "model_parts"]
