"""The load-balancing loss of a mixture of experts as transformers adds it in training.

Qwen3MoeForCausalLM (with router logits on) adds coef × E × Σ_e f_e P_e to a batch's mean
cross-entropy, once for the whole model: f_e = C_e / (L T) is the share of all layers' routed slots
that went to expert e and P_e = S_e / (L T) its mean router probability (S: the softmax over all
experts), C_e and S_e summed over the L layers and the T positions of the batch that hold tokens
(its attention mask's; pads are left out). Each position's probabilities in layer l thus get the
gradient coef × E × C_e / (L T)², which needs the counts of every layer, the later ones included.
So each layer records its counts in the forward, and its router's output carries a function that
hands the probabilities that gradient in the backward, which runs once the forward has passed the
last layer.

megatron-core's own form (moe_router_load_balancing_type "aux_loss") adds one loss a layer from
that layer's counts alone; the two agree where the layers route alike. Pipeline stages train with
megatron-core's: an earlier stage's backward cannot wait for a later stage's counts.

A micro-batch's loss is the sum of its trained tokens' losses (transformer.transformer_config), so the
balance loss joins it times the micro-batch's trained tokens: a step of one micro-batch then takes
transformers' gradient of mean cross-entropy + coef × balance loss, and a step of several weighs
each micro-batch by its trained tokens, as it weighs their cross-entropy.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from megatron.core.parallel_state import get_tensor_model_parallel_rank
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from megatron.core.transformer.moe.router import TopKRouter


class BalanceLoss:
    """One micro-batch's routing, layer by layer, and the gradient it gives every router's
    probabilities. Counts are those of the whole micro-batch: ranks that hold parts of its
    sequence (sequence or context parallelism) add theirs up."""

    def __init__(self, coeff: float, num_experts: int, num_layers: int, sequence_parallel: bool,
                 tensor_parallel: int = 1) -> None:
        self.coeff, self.num_experts, self.num_layers = coeff, num_experts, num_layers
        self.sequence_parallel, self.tensor_parallel = sequence_parallel, tensor_parallel
        self.counts: dict[int, torch.Tensor] = {}  # layer number → [tokens routed to each expert..., positions]
        self.trained: Optional[torch.Tensor] = None
        self.real: Optional[torch.Tensor] = None  # [positions the routers see]: not a pad

    def begin(self, trained: torch.Tensor, tokens: Optional[torch.Tensor] = None, pad: Optional[int] = None) -> None:
        """A micro-batch starts; `trained`: its trained tokens (all its ranks' parts); `tokens`: this
        rank's part of its rows [b, s], where positions holding `pad` are left out."""
        self.counts, self.trained, self.real = {}, trained, None
        if tokens is not None and pad is not None:
            real = (tokens != pad).t()  # the routers see positions [s, b] flattened
            if self.sequence_parallel:  # this tensor-parallel rank's chunk of s
                real = real.chunk(self.tensor_parallel)[get_tensor_model_parallel_rank()]
            self.real = real.reshape(-1)

    def record(self, router: TopKRouter, routing_map: torch.Tensor) -> Optional[torch.Tensor]:
        """Layer `router.layer_number`'s counts (again, the same ones, where a recompute runs it twice);
        → which of the routed positions hold tokens (None: all)."""
        real = self.real_positions(routing_map)
        held = real if real is not None else torch.ones(routing_map.shape[0], dtype=torch.bool,
                                                        device=routing_map.device)
        counts = torch.cat([(routing_map & held[:, None]).sum(0, dtype=torch.float32),
                            held.sum(dtype=torch.float32).reshape(1)])
        if router.tp_cp_group.size() > 1:
            dist.all_reduce(counts, group=router.tp_cp_group)
        self.counts[router.layer_number] = counts
        return real

    def real_positions(self, routing_map: torch.Tensor) -> Optional[torch.Tensor]:
        """Which of the positions a router routed (routing_map's rows) hold tokens; None: all."""
        if self.real is None:
            return None
        if self.real.numel() != routing_map.shape[0]:
            raise RuntimeError(f"balance loss: the routers see {routing_map.shape[0]} positions, the micro-batch "
                               f"marks {self.real.numel()}")
        return self.real.to(routing_map.device)

    def gradient(self) -> torch.Tensor:
        """[E]: d(loss)/d(a position's probability of expert e), the same for every position of every
        layer, times the micro-batch's trained tokens and the schedule's loss scale (a model run
        outside step.forward_backward, with no `begin`: times its positions, as megatron-core weighs
        its own balance loss)."""
        if len(self.counts) != self.num_layers:
            raise RuntimeError(f"balance loss: {len(self.counts)} of {self.num_layers} layers routed this micro-batch")
        counts = torch.stack(list(self.counts.values())).sum(0)
        # T: each layer routes every position (a micro-batch of pads alone has none and no gradient)
        routed, positions = counts[:-1], (counts[-1] / self.num_layers).clamp(min=1)
        scale = MoEAuxLossAutoScaler.main_loss_backward_scale
        weight = (self.trained if self.trained is not None else positions) * (scale if scale is not None else 1.0)
        return self.coeff * self.num_experts * routed / (self.num_layers * positions) ** 2 * weight


class _ProbabilityGradient(torch.autograd.Function):
    """Passes the routed probabilities on unchanged; in backward, gives the softmax over all experts
    the balance loss's gradient (computed then: every layer's counts are known)."""

    @staticmethod
    def forward(ctx, probs: torch.Tensor, scores: torch.Tensor, balance: BalanceLoss,
                real: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.balance, ctx.shape, ctx.real = balance, scores.shape, real
        return probs

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        scores = ctx.balance.gradient().to(grad.device).expand(ctx.shape)
        if ctx.real is not None:
            scores = scores * ctx.real[:, None]
        return grad, scores, None, None


class BalancedRouter(TopKRouter):
    """megatron-core's top-k router (its own balance loss off) recording its counts for `balance`."""

    balance: BalanceLoss

    def routing(self, logits: torch.Tensor, *args, **kwargs):
        probs, routing_map = super().routing(logits, *args, **kwargs)
        if self.training:
            real = self.balance.record(self, routing_map)
            if torch.is_grad_enabled():
                scores = torch.softmax(logits.reshape(-1, self.config.num_moe_experts).float(), dim=-1)
                probs = _ProbabilityGradient.apply(probs, scores, self.balance, real)
        return probs, routing_map


def install(model: torch.nn.Module, coeff: float) -> BalanceLoss:
    """Routes `model`'s mixture-of-experts layers through BalancedRouter (parameters unchanged) and
    returns the BalanceLoss they share."""
    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    config = model.config
    balance = BalanceLoss(coeff, config.num_moe_experts, len(routers), config.sequence_parallel,
                          config.tensor_model_parallel_size)
    for router in routers:
        router.__class__, router.balance = BalancedRouter, balance
    return balance
