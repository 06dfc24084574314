"""A Hugging Face Qwen `config.json` ↔ the `ModelShape` megatron-core builds.

Dense Qwen2 / Qwen2.5 (`model_type` "qwen2": QKV bias), Qwen3 ("qwen3": QK-RMSNorm, explicit
head_dim) and Qwen3-MoE ("qwen3_moe": every layer's MLP a mixture of experts) are supported at any
size. What the megatron-core model here cannot compute the same way is refused, naming the field:
other mixtures of experts (Qwen2-MoE's shared expert, dense layers among the MoE ones),
sliding-window layers, rope scaling other than the default, activations other than SiLU, Qwen3's
optional attention bias.

`model_of_folder` reads a folder's config.json and generation_config.json together.

Both spellings of RoPE are read: `rope_theta` / `rope_scaling` (the released checkpoints) and
transformers 5's `rope_parameters`.
"""

from __future__ import annotations

import json
import os

import torch

from qwen_data.qwen import EOD_ID, IM_END_ID

from ..shapes import ModelShape

CONFIG = "config.json"
GENERATION = "generation_config.json"
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UnsupportedCheckpoint(ValueError):
    pass


def read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        raise UnsupportedCheckpoint(f"{directory}: no {CONFIG}: not a Hugging Face model folder")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rope(config: dict, where: str) -> float:
    """The RoPE base; refuses scaled RoPE (YaRN, dynamic NTK, linear ...), which the model here
    does not implement."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for field, kind in (("rope_parameters.rope_type", params.get("rope_type")),
                        ("rope_scaling", scaling.get("rope_type") or scaling.get("type"))):
        if kind not in (None, "default"):
            raise UnsupportedCheckpoint(f"{where}: {field} is {kind!r}: only the default (unscaled) RoPE is supported")
    theta = params.get("rope_theta", config.get("rope_theta"))
    if theta is None:
        raise UnsupportedCheckpoint(f"{where}: no rope_theta (nor rope_parameters.rope_theta)")
    return float(theta)


def _experts(config: dict, where: str) -> dict:
    """The ModelShape fields of a qwen3_moe config: MoE in every layer, as megatron-core builds it."""
    if config.get("mlp_only_layers"):
        raise UnsupportedCheckpoint(f"{where}: mlp_only_layers is {config['mlp_only_layers']}: dense layers among "
                                    "the mixture-of-experts ones are not supported")
    if config.get("decoder_sparse_step", 1) != 1:
        raise UnsupportedCheckpoint(f"{where}: decoder_sparse_step is {config['decoder_sparse_step']}: only a "
                                    "mixture of experts in every layer (1) is supported")
    # The released configs say num_experts; transformers 5 writes num_local_experts.
    return dict(num_experts=config.get("num_experts") or config["num_local_experts"],
                moe_ffn_hidden_size=config["moe_intermediate_size"], moe_topk=config["num_experts_per_tok"], norm_topk_prob=bool(config.get("norm_topk_prob", False)),
                router_aux_loss_coef=float(config.get("router_aux_loss_coef", 0.001)))


def shape_from_config(config: dict, where: str = CONFIG) -> ModelShape:
    """The model shape of a Qwen2 / Qwen3 dense or Qwen3-MoE `config.json`; UnsupportedCheckpoint otherwise."""
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        moe = " (of mixtures of experts, only qwen3_moe)" if "moe" in str(model_type) else ""
        raise UnsupportedCheckpoint(f"{where}: model_type is {model_type!r}: only qwen2 (Qwen2, Qwen2.5), qwen3 "
                                    f"and qwen3_moe checkpoints are supported{moe}")
    if model_type != "qwen3_moe":
        for field in ("num_experts", "num_local_experts", "moe_intermediate_size"):
            if config.get(field):
                raise UnsupportedCheckpoint(f"{where}: {field} is set in a {model_type} config: of mixtures of "
                                            "experts, only qwen3_moe is supported")
    if config.get("use_sliding_window"):
        raise UnsupportedCheckpoint(f"{where}: use_sliding_window is true: sliding-window attention is not supported")
    sliding = [i for i, kind in enumerate(config.get("layer_types") or []) if kind != "full_attention"]
    if sliding:
        raise UnsupportedCheckpoint(f"{where}: layer_types has non-full attention at layers {sliding[:8]}: "
                                    "sliding-window attention is not supported")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpoint(f"{where}: hidden_act is {config['hidden_act']!r}: only silu is supported")
    if model_type.startswith("qwen3") and config.get("attention_bias"):
        raise UnsupportedCheckpoint(f"{where}: attention_bias is true: Qwen3 with attention biases is not supported")
    try:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        return ModelShape(
            name=os.path.basename(os.path.normpath(where)) if where != CONFIG else model_type,
            num_layers=config["num_hidden_layers"],
            hidden_size=hidden,
            num_attention_heads=heads,
            num_query_groups=config.get("num_key_value_heads") or heads,
            kv_channels=config.get("head_dim") or hidden // heads,
            ffn_hidden_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            # Qwen2Config and Qwen3Config both default to untied.
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type.startswith("qwen3"),
            max_position_embeddings=config["max_position_embeddings"],
            rotary_base=rope(config, where),
            norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
            **(_experts(config, where) if model_type == "qwen3_moe" else {}),
        )
    except KeyError as missing:
        raise UnsupportedCheckpoint(f"{where}: no {missing.args[0]}") from None


def config_dtype(config: dict) -> torch.dtype:
    """The dtype the checkpoint's tensors are stored in (`dtype`, formerly `torch_dtype`)."""
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise UnsupportedCheckpoint(f"{CONFIG}: dtype {name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]


def config_of_shape(shape: ModelShape, dtype: torch.dtype) -> dict:
    """A config.json for a model that did not come from one (a `--model` preset)."""
    model_type = "qwen3_moe" if shape.moe else "qwen3" if shape.qk_norm else "qwen2"
    config = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_query_groups,
        "head_dim": shape.kv_channels,
        "intermediate_size": shape.ffn_hidden_size,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tied_embeddings,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rotary_base,
        "rope_scaling": None,
        "rms_norm_eps": shape.norm_epsilon,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "bos_token_id": EOD_ID,
        "eos_token_id": EOD_ID,
        "torch_dtype": next(name for name, d in DTYPES.items() if d == dtype),
    }
    if shape.qk_norm:
        config["attention_bias"] = False
    if shape.moe:
        config.update(num_experts=shape.num_experts, num_experts_per_tok=shape.moe_topk,
                      moe_intermediate_size=shape.moe_ffn_hidden_size, norm_topk_prob=shape.norm_topk_prob,
                      router_aux_loss_coef=shape.router_aux_loss_coef, decoder_sparse_step=1, mlp_only_layers=[],
                      output_router_logits=False)
    return config


def generation_config() -> dict:
    """generation_config.json for a model without one: stop at the end of a turn or of a text."""
    return {"bos_token_id": EOD_ID, "eos_token_id": [IM_END_ID, EOD_ID],
            "pad_token_id": EOD_ID, "do_sample": False}


def model_of_folder(hf_model: str) -> tuple[ModelShape, dict, dict]:
    """(shape, config.json, generation_config.json) of a Hugging Face model folder."""
    hf_config = read_config(hf_model)
    generation = generation_config()
    if os.path.isfile(os.path.join(hf_model, GENERATION)):
        with open(os.path.join(hf_model, GENERATION), encoding="utf-8") as f:
            generation = json.load(f)
    return shape_from_config(hf_config, hf_model), hf_config, generation
