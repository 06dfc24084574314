"""The shape of a Qwen model (`ModelShape`), and presets with the real models' shapes.

Every preset is the real model's shape (Qwen's config.json, research/qwen.md §4): RMSNorm (eps 1e-6),
SwiGLU, grouped-query attention, RoPE base 1e6, no linear biases except Qwen2/2.5's QKV bias,
Qwen3's QK-RMSNorm with explicit head_dim 128, tied embeddings for the small sizes, and the padded
embedding rows the checkpoints have (151,936; 152,064 for Qwen2.5-7B). Plain numbers, no torch:
`--help` lists the presets without importing it.

Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): every layer's MLP is `num_experts` SwiGLU experts of
`moe_ffn_hidden_size`, a softmax router picking `moe_topk` of them per token, their weights
renormalised to sum to 1 (`norm_topk_prob`), no shared expert; `ffn_hidden_size` keeps the
config's (unused) dense `intermediate_size`."""

from __future__ import annotations

from dataclasses import dataclass

from qwen_data.qwen import EMBEDDING_ROWS_LARGE, EMBEDDING_ROWS_SMALL


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int  # head_dim
    ffn_hidden_size: int
    vocab_size: int  # padded embedding rows, as in the checkpoint
    tied_embeddings: bool
    qkv_bias: bool  # Qwen2/2.5
    qk_norm: bool  # Qwen3
    max_position_embeddings: int
    rotary_base: float = 1_000_000.0
    norm_epsilon: float = 1e-6
    num_experts: int = 0  # 0: a dense model
    moe_ffn_hidden_size: int = 0
    moe_topk: int = 0
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    def _attention_params(self) -> int:
        q = self.num_attention_heads * self.kv_channels
        kv = self.num_query_groups * self.kv_channels
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size

    def _mlp_params(self, experts: int) -> int:
        """A layer's MLP weights with `experts` experts (a dense layer: its one MLP)."""
        if not self.moe:
            return 3 * self.hidden_size * self.ffn_hidden_size
        return experts * 3 * self.hidden_size * self.moe_ffn_hidden_size + self.num_experts * self.hidden_size

    def matmul_params(self) -> int:
        """Weights that take part in a matrix product per token: the layers (of a MoE layer, the
        router and the `moe_topk` experts a token goes to) and the output layer (the input
        embedding is a lookup)."""
        mlp = self._mlp_params(self.moe_topk)
        return self.num_layers * (self._attention_params() + mlp) + self.vocab_size * self.hidden_size

    def layer_parameters(self, experts_split: int = 1) -> int:
        """One layer's weights, its experts split over `experts_split` ranks (expert parallelism)."""
        q = self.num_attention_heads * self.kv_channels
        kv = self.num_query_groups * self.kv_channels
        return (self._attention_params() + self._mlp_params(self.num_experts // experts_split)
                + 2 * self.hidden_size + (q + 2 * kv if self.qkv_bias else 0)
                + (2 * self.kv_channels if self.qk_norm else 0))

    def parameters(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * self.layer_parameters() + embeddings + self.hidden_size

    def layer_flops_per_token(self, seq_length: int) -> float:
        """One layer's forward + backward FLOPs a token of a full causal row of `seq_length`."""
        products = 6 * (self._attention_params() + self._mlp_params(self.moe_topk))
        return products + self.attention_flops(seq_length ** 2, True) / (self.num_layers * seq_length)

    def output_flops_per_token(self) -> float:
        """The output layer's forward + backward FLOPs a token."""
        return 6 * self.vocab_size * self.hidden_size

    def activation_bytes_per_token(self) -> int:
        """What one layer keeps a token for its backward, bf16 under autocast, nothing recomputed: the
        residual stream (counted at float32's 4 bytes: 0.5B's bf16 stream peaked 0.6 GiB higher, not
        lower, on an H200) and the bf16 inputs and outputs of its products, ~14 × hidden, and
        the MLP's 3 × 2 bytes × its width (a token's `moe_topk` experts' widths). Against the peaks of
        Qwen2.5-7B over two stages on H200s (73.7 GiB at 14 + 14, 78.3 at 15 + 13, 96.1 at micro
        batch 2) it counts 0.7-1.7% over."""
        width = self.moe_topk * self.moe_ffn_hidden_size if self.moe else self.ffn_hidden_size
        return 14 * self.hidden_size + 6 * width

    def matmul_flops_per_token(self) -> float:
        """Forward + backward FLOPs per token of the products with weights (no recompute): 2 per
        weight forward, 4 backward."""
        return 6 * self.matmul_params()

    def attention_flops(self, square_sum: int, causal: bool) -> float:
        """Forward + backward FLOPs of QK^T and of the scores times V over sequences whose lengths'
        squares sum to `square_sum`: each product 2·s²·heads·head_dim forward, twice that backward.
        causal: half of each s × s score matrix (Megatron's count); else all of it (torchtitan's)."""
        full = 12 * self.num_layers * self.num_attention_heads * self.kv_channels * square_sum
        return full / 2 if causal else full

def _qwen2(name, layers, hidden, heads, groups, ffn, vocab=EMBEDDING_ROWS_SMALL, tied=True, head_dim=None, max_pos=32_768):
    return ModelShape(name, layers, hidden, heads, groups, head_dim or hidden // heads, ffn, vocab, tied,
                       qkv_bias=True, qk_norm=False, max_position_embeddings=max_pos)


def _qwen3(name, layers, hidden, heads, groups, ffn, tied=True, max_pos=40_960):
    return ModelShape(name, layers, hidden, heads, groups, 128, ffn, EMBEDDING_ROWS_SMALL, tied,
                       qkv_bias=False, qk_norm=True, max_position_embeddings=max_pos)


def _qwen3_moe(name, layers, hidden, heads, groups, ffn, experts, moe_ffn, topk, head_dim=128, max_pos=40_960):
    return ModelShape(name, layers, hidden, heads, groups, head_dim, ffn, EMBEDDING_ROWS_SMALL, False,
                      qkv_bias=False, qk_norm=True, max_position_embeddings=max_pos, num_experts=experts,
                      moe_ffn_hidden_size=moe_ffn, moe_topk=topk, norm_topk_prob=True, router_aux_loss_coef=0.001)


PRESETS: dict[str, ModelShape] = {p.name: p for p in (
    _qwen2("qwen2.5-0.5b", 24, 896, 14, 2, 4864),
    _qwen2("qwen2.5-1.5b", 28, 1536, 12, 2, 8960),
    _qwen2("qwen2.5-3b", 36, 2048, 16, 2, 11008),
    _qwen2("qwen2.5-7b", 28, 3584, 28, 4, 18944, vocab=EMBEDDING_ROWS_LARGE, tied=False),
    _qwen3("qwen3-0.6b", 28, 1024, 16, 8, 3072),
    _qwen3("qwen3-1.7b", 28, 2048, 16, 8, 6144),
    _qwen3("qwen3-8b", 36, 4096, 32, 8, 12288, tied=False),
    _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, experts=128, moe_ffn=768, topk=8),
    _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, experts=128, moe_ffn=1536, topk=8),
    # Tests and smoke runs: the real vocabulary (data ids go up to 151,668), a toy body.
    _qwen2("tiny", 2, 64, 4, 2, 128, head_dim=16, max_pos=4096),
    ModelShape("tiny-qwen3", 2, 64, 4, 2, 32, 128, EMBEDDING_ROWS_SMALL, True, qkv_bias=False, qk_norm=True,
                max_position_embeddings=4096),
    _qwen3_moe("tiny-qwen3-moe", 2, 64, 4, 2, 128, experts=8, moe_ffn=32, topk=2, head_dim=32, max_pos=4096),
)}
