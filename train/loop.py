"""The trainer: megatron-core model and parallel state, plain PyTorch around it.

    torchrun --nproc-per-node 8 -m qwen_data_train --data out/pretrain_blend.json --model qwen2.5-1.5b --tp 2 \
        --seq-length 4096 --micro-batch-size 4 --global-batch-size 64 --train-iters 2000 --save ckpt
    qwen-data train --data out/sft_blend.json --model tiny --train-iters 50       # one GPU, or the CPU

One step: fetch the step's micro-batches (timed: the data-loading share), count the step's trained
tokens over data parallelism, then per micro-batch forward and backward with
loss = Σ(loss × loss_mask) / Σ loss_mask over the whole global batch (step.py); the gradients
reduced across ranks (distributed.py); clip, AdamW (optimizer.py).
The output layer and loss run fused by chunks (loss.py: no logits in memory, so micro batches of 4
fit), and on CUDA each transformer layer is torch.compile'd (`--compile`).

Parallelism: tensor and pipeline parallelism from megatron-core (`parallel_state`, the model's own
TP layers, its pipeline schedules: 1F1B over `--pp` stages, each building only its layers), data
parallelism with torch DDP over megatron-core's data-parallel group, or megatron-core's DDP and
DistributedOptimizer (`--distributed-optimizer`), and a mixture of experts' experts split over
data-parallel ranks (`--ep`).
Weights are float32 master weights, run in bf16 by autocast.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from qwen_data.text.tokenizer import directory_of

from .checkpoint import Checkpointer, latest, stored
from .config import TrainConfig
from .distributed import data_parallel, distributed, log0, reduce_grads, unwrapped, whole_parameters
from .graphs import MicroBatchGraphs
from .hf.checkpoint import HFExport, load_hf_weights
from .hf.config import config_dtype, config_of_shape, generation_config, model_of_folder, shape_from_config
from .loader import build_splits, check_inputs, make_loader
from .metrics import ExpertLoad, Metrics, StepStats, Summary, document_squares
from .model import build_model
from .optimizer import AdamW, DistributedAdamW, Schedule
from .plan import Environment, RunPlan
from .patches import megatron_core
from .shapes import PRESETS, ModelShape
from .step import ForwardSpec, evaluate, forward_backward


class Trainer:
    """One run of `config` on this rank's `device` (process groups already made): the set-up
    here, the loop in `run`."""

    def __init__(self, config: TrainConfig, device: torch.device, plan: Optional[RunPlan] = None) -> None:
        """`plan`: resolved by `train` before the process group exists; a caller that made its own
        group may leave it to the trainer."""
        self.config, self.device = config, device
        self.shape, hf_config, generation = model_of(config)
        self.plan = plan = plan or RunPlan.resolve(config, self.shape, Environment.current())
        weights = "bf16 weights split from their float32 masters" if plan.bf16_weights else "float32 weights"
        residual = ("bf16 residual stream" if plan.residual_bf16 else
                    "float32 residual stream" + (" (--fp32-residual-connection)" if plan.fp32_residual else ""))
        graphs = "micro-batches replayed as CUDA graphs" if plan.cuda_graphs else "no CUDA graphs"
        log0(f"attention {plan.attention} ({plan.attention_why}), compile {plan.compile}, "
             f"{weights} ({plan.bf16_weights_why}), {residual}, {graphs} ({plan.cuda_graphs_why})"
             + (", validation and the optimizer step eager" if plan.cuda_graphs else "")
             + (f", FP8 {plan.fp8} (Transformer Engine's linear layers)" if plan.fp8 else ""))
        self.train_ds, self.valid_ds = build_splits(config, plan.global_batch)
        tokenizer = self.train_ds.config.tokenizer
        for line in tokenizer.certificates:
            log0(line)
        tokenizer.check_embedding(self.shape.vocab_size, plan.weights_from or self.shape.name)
        self.pad = tokenizer.pad
        self.spec = ForwardSpec(plan.attention, device, autocast=plan.autocast, cross_entropy=plan.cross_entropy,
                                seq_length=config.seq_length, pad=self.pad)
        self.core = self._build_model()
        # AdamW splits its bf16 weights before torch's DDP wraps the model, which leaves them to the
        # SplitGradReduction data_parallel installs.
        whole = None if plan.data_parallel == "megatron" else AdamW(self.core, config.optim,
                                                                     bf16_weights=plan.bf16_weights,
                                                                     in_place=plan.cuda_graphs)
        self.model = data_parallel(self.core, plan, device)
        self.optimizer = whole if whole is not None else DistributedAdamW(self.model, config.optim)
        self.schedule = Schedule.of(config.optim, config.train_iters)
        export = HFExport(self.shape, hf_config, config_dtype(hf_config),
                          directory_of(tokenizer.identity) if config.checkpoint.save_hf else None, generation)
        self.checkpointer = Checkpointer(config.checkpoint, plan, self.core, self.optimizer, export,
                                         tokenizer=tokenizer.identity)
        self.iteration, self.consumed = self.checkpointer.load()
        self.graphs = MicroBatchGraphs(self.model, unwrapped(self.model), self.spec) if plan.cuda_graphs else None
        self.batches = self._loader(self.train_ds, self.consumed)
        self.metrics = Metrics(config.log, device, plan, config.train_iters,
                               run_config=dataclasses.asdict(config),
                               expert_load=ExpertLoad(self.core, self.shape.num_experts, device) if self.shape.moe
                               else None,
                               run={"model": self.shape.name, "gpus": plan.world, "fp8": plan.fp8,
                                    "packed": tokenizer.packed, "ep": plan.ep, "bf16_weights": plan.bf16_weights})
        self._announce()

    def run(self) -> Summary:
        config = self.config
        self.metrics.restart_clock()
        while self.iteration < config.train_iters:
            self.metrics.add(self.metrics.measure(self.iteration + 1, self.train_step))
            self.iteration += 1
            self.consumed += self.plan.global_batch
            if self.metrics.due(self.iteration):
                self.metrics.log(self.iteration, self.consumed)
            if self._evaluation_due():
                with self.metrics.paused():
                    self.evaluate()
            stop = config.exit_after is not None and self.iteration >= config.exit_after
            if self.checkpointer.due(self.iteration, last=stop or self.iteration == config.train_iters):
                with self.metrics.paused(), whole_parameters(self.model):
                    self.checkpointer.save(self.iteration, self.consumed, last=self.iteration == config.train_iters)
            if stop:
                break
        return self.metrics.summary(self.iteration)

    def train_step(self) -> StepStats:
        # Fetch the whole step first: the trained-token count normalises every micro-batch's loss.
        started = time.perf_counter()
        micro = [next(self.batches) for _ in range(self.plan.accumulation)]
        data_seconds = time.perf_counter() - started
        loss = self._forward_backward(micro)
        lr = self.schedule(self.iteration)
        grad_norm = self.optimizer.step(lr)
        # The rows' shapes and documents, counted from the loader's CPU tensors: no device sync
        return StepStats(loss=loss, tokens=sum(mb["tokens"].numel() for mb in micro),
                         real_tokens=sum(int((mb["tokens"] != self.pad).sum()) for mb in micro),
                         data_seconds=data_seconds, lr=lr, grad_norm=grad_norm,
                         document_squares=sum(document_squares(mb, self.pad) for mb in micro),
                         row_squares=sum(mb["tokens"].numel() * mb["tokens"].shape[1] for mb in micro))

    def _forward_backward(self, micro: list[dict]) -> torch.Tensor:
        """Gradients of the global batch's mean masked loss; → [Σ loss × mask, Σ mask] here."""
        masks = [mb["loss_mask"].to(self.device, non_blocking=True) for mb in micro]
        if self.plan.data_parallel == "megatron":
            # megatron-core's DDP sums over DP, and its finalize_model_grads (which the schedule
            # calls) divides by the step's trained tokens, summed over every rank.
            self.model.zero_grad_buffer()
            return forward_backward(self.model, micro, masks, torch.ones((), device=self.device), self.spec)
        trained = torch.stack([m.sum() for m in masks]).sum()
        dist.all_reduce(trained, group=parallel_state.get_data_parallel_group())
        # DDP averages over DP × CP: undo that, divide by the global count
        scale = self.plan.gradient_ranks / trained.clamp(min=1)
        if self.graphs is not None:  # one GPU: nothing to reduce
            return torch.stack([self.graphs.run(mb, mask, scale) for mb, mask in zip(micro, masks)]).sum(0)
        # Gradients are all-reduced over DP × CP once per step, with the last micro-batch's backward
        # (the schedule holds DDP's no_sync until then: `distributed.data_parallel`).
        total = forward_backward(self.model, micro, masks, scale, self.spec)
        reduce_grads(self.model, self.optimizer.params)
        return total

    def evaluate(self) -> Optional[float]:
        """Validation loss on the next `eval_iters` global batches of the validation split (each
        evaluation reads its own)."""
        evals, global_batch = self.config.eval, self.plan.global_batch
        skip = (self.iteration // evals.eval_interval - 1) * evals.eval_iters * global_batch
        loss = evaluate(self.model, self._loader(self.valid_ds, skip), evals.eval_iters * self.plan.accumulation,
                        self.spec)
        self.metrics.validation(self.iteration, loss)
        return loss

    def _evaluation_due(self) -> bool:
        every = self.config.eval.eval_interval
        return self.valid_ds is not None and every > 0 and self.iteration % every == 0

    def _build_model(self) -> torch.nn.Module:
        plan = self.plan
        torch.manual_seed(plan.seed)  # the same weights on every rank and under every TP layout
        if self.device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(plan.seed)
        core = build_model(plan)
        if plan.weights_from:
            load_hf_weights(core, plan.weights_from, self.shape)
        return core.to(self.device)

    def _loader(self, dataset, consumed: int):
        return make_loader(dataset, consumed, self.plan, self.config.data.num_workers, self.device)

    def _announce(self) -> None:
        c, p, spec, cuda = self.config, self.plan, self.spec, self.device.type == "cuda"
        stages = " + ".join(map(str, p.stage_layers))
        log0(f"model {self.shape.name}: {self.shape.parameters() / 1e6:.1f}M parameters, "
             f"cross-entropy {p.cross_entropy}, "
             f"TP {p.tp}{' (sequence parallel)' if p.sequence_parallel else ''} × PP {p.pp}"
             f"{f' × CP {p.cp}' if p.cp > 1 else ''} × DP {p.dp}"
             f"{f' (experts over EP {p.ep})' if p.ep > 1 else ''}, "
             f"{f'stages of {stages} layers ({p.stages_why}), ' if p.pp > 1 else ''}"
             + (f"experts {'grouped' if p.grouped_experts else 'sequential'}, balance loss {p.balance}, "
                if self.shape.moe else "")
             + f"micro batch {p.micro_batch_size} × {p.accumulation} accumulation, "
             f"global batch {p.global_batch} × seq {c.seq_length}, {len(self.train_ds)} train samples, "
             f"device {torch.cuda.get_device_name(self.device) if cuda else 'cpu'}, "
             f"{'bf16 autocast' if spec.autocast else 'float32'}")
        optimizer = "distributed over DP" if p.data_parallel == "megatron" else "whole on each DP rank"
        log0(f"optimizer AdamW, {optimizer}: {self.optimizer.state_bytes() / 2**30:.3f} GiB of state a GPU"
             + (f", recompute {p.recompute}" + (f" ({','.join(p.recompute_modules)})"
                                                if p.recompute == "selective" else "")
                if p.recompute else ""))


def model_of(config: TrainConfig) -> tuple[ModelShape, dict, dict]:
    """The run's model (as `model_of_folder`): from --hf-model, else from the --load checkpoint,
    else the --model preset (default tiny)."""
    if config.model.hf_model:
        return model_of_folder(config.model.hf_model)
    checkpoint = latest(config.checkpoint.load)
    if checkpoint and config.model.name is None:
        common = stored(checkpoint)
        if "hf_config" in common:
            return shape_from_config(common["hf_config"], config.checkpoint.load), common["hf_config"], common["generation"]
    shape = PRESETS[config.model.name or "tiny"]
    if config.model.num_layers is not None:
        layers = config.model.num_layers
        shape = dataclasses.replace(shape, name=f"{shape.name} ({layers} of {shape.num_layers} layers)",
                                    num_layers=layers)
    return shape, config_of_shape(shape, torch.bfloat16), generation_config()


def train(config: TrainConfig) -> int:
    # Every refusal before a process group exists (torchrun's WORLD_SIZE tells the ranks).
    plan = RunPlan.resolve(config, model_of(config)[0], Environment.current())
    check_inputs(config.data)
    with megatron_core(), distributed(plan.tp, plan.pp, plan.ep, plan.cp) as device:
        Trainer(config, device, plan).run()
    return 0

