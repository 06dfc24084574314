"""Checkpoints as megatron-core `dist_checkpointing` (torch_dist) directories: sharded, and
loadable under any TP/DP layout; and Hugging Face folders of the same weights.

    root/iter_0000200/                      one directory per saved iteration
    root/latest_checkpointed_iteration.txt  the iteration `--load root` resumes from

Beside the tensors a checkpoint stores its model (`hf_config`: the config.json it came from or
would be exported with), so `--load root` alone rebuilds the model, the converter exports it, and
loading it into a model of another shape is refused. A checkpoint without optimizer state (made
by `python -m qwen_data_train.convert hf-to-mcore`) starts a run: its weights, fresh AdamW moments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state

from .config import CheckpointConfig
from .distributed import is_rank0, log0
from .hf.checkpoint import HFExport, save_hf
from .shapes import ModelShape
from .optimizer import MOMENTS, AdamW, DistributedAdamW
from .plan import RunPlan

LATEST = "latest_checkpointed_iteration.txt"


def latest(root: Optional[str]) -> Optional[str]:
    """The directory of the latest iteration saved under `root`, or None."""
    marker = os.path.join(root, LATEST) if root else None
    if marker is None or not os.path.isfile(marker):
        return None
    with open(marker) as f:
        return os.path.join(root, f"iter_{int(f.read().strip()):07d}")


def stored(path: str) -> dict:
    """What a checkpoint directory holds besides tensors (iteration, model, tokenizer ...)."""
    return dist_checkpointing.load_common_state_dict(path)


def shape_fields(shape: ModelShape) -> dict:
    """The shape as compared between a run and a checkpoint: everything but its display name."""
    return {k: v for k, v in dataclasses.asdict(shape).items() if k != "name"}


class Checkpointer:
    """Saves and resumes the model, the AdamW moments and where the run stands (`--save`,
    `--load`), and exports Hugging Face folders (`--save-hf`)."""

    def __init__(self, config: CheckpointConfig, plan: RunPlan, core: torch.nn.Module,
                 optimizer: Optional[AdamW | DistributedAdamW], export: HFExport,
                 tokenizer: Optional[dict] = None) -> None:
        """`plan`: the run's, or a conversion's plan of the model alone (no sequence length, no batch)."""
        self.config, self.plan, self.core, self.optimizer, self.export = config, plan, core, optimizer, export
        self.run_info = dict(hf_config=export.config, generation=export.generation,
                             model_shape=shape_fields(plan.shape), tokenizer=tokenizer)
        if plan.max_sequence_length:  # a train run's: what it trains on
            self.run_info.update(seq_length=plan.max_sequence_length, global_batch_size=plan.global_batch)

    def due(self, iteration: int, last: bool) -> bool:
        """Save after this iteration? Every `save_interval`, and after the last one."""
        every = self.config.save_interval
        wanted = bool(self.config.save or self.config.save_hf)
        return wanted and (last or (every > 0 and iteration % every == 0))

    def save(self, iteration: int, consumed_samples: int, last: bool = False) -> None:
        with self._float32_weights():
            if self.config.save:
                self.save_megatron(self.config.save, iteration, consumed_samples)
            if self.config.save_hf:
                out = self.config.save_hf if last else os.path.join(self.config.save_hf, f"iter_{iteration:07d}")
                save_hf(self.core, self.export, out)
                log0(f"saved Hugging Face model {out}")

    def _float32_weights(self) -> contextlib.AbstractContextManager:
        """The model's weights as float32 (the optimizer's masters) while saved or loaded."""
        return self.optimizer.float32_weights() if self.optimizer is not None else contextlib.nullcontext()

    def save_megatron(self, root: str, iteration: int, consumed_samples: int) -> None:
        if importlib.util.find_spec("psutil") is None:
            # megatron-core ≤0.16 writes from a child process that needs psutil; without it the
            # child dies and the save hangs forever instead of failing.
            raise RuntimeError("checkpointing needs psutil (pip install psutil)")
        path = os.path.join(root, f"iter_{iteration:07d}")
        if is_rank0():
            os.makedirs(path, exist_ok=True)
        dist.barrier()
        if self.optimizer is None:
            state = {"model": self.core.sharded_state_dict()}
        else:
            state = self._sharded(self.optimizer.moments())
        state.update(iteration=iteration, consumed_samples=consumed_samples, has_optimizer=self.optimizer is not None,
                     **self.run_info)
        dist_checkpointing.save(state, path)
        dist.barrier()
        if is_rank0():
            with open(os.path.join(root, LATEST), "w") as f:
                f.write(str(iteration))
        log0(f"saved checkpoint {path}")

    def load(self) -> tuple[int, int]:
        """(iteration, consumed samples) of the latest checkpoint under `--load`, or (0, 0) if
        there is none (or no `--load`)."""
        root = self.config.load
        path = latest(root)
        if path is None:
            if root:
                log0(f"no checkpoint in {root}: starting from scratch")
            return 0, 0
        common = stored(path)
        self._check_model(path, common)
        if not common.get("has_optimizer", True) or self.optimizer is None:
            with self._float32_weights():
                state = dist_checkpointing.load({"model": self.core.sharded_state_dict()}, path)
                self.core.load_state_dict(state["model"])
            log0(f"loaded the weights of {path} (iteration {common['iteration']})")
            return common["iteration"], common["consumed_samples"]
        template = [{k: torch.zeros(p.shape) for k in MOMENTS} for p in self.optimizer.params]
        with self._float32_weights():
            state = dist_checkpointing.load(self._sharded(template), path)
            self.core.load_state_dict(state["model"])
        moments = state["optimizer"]["state"]
        # Every parameter is stepped every iteration.
        self.optimizer.load_moments([moments[i] for i in range(len(template))], steps=state["iteration"])
        log0(f"resumed from {path} (iteration {state['iteration']}, {state['consumed_samples']} samples consumed)")
        return state["iteration"], state["consumed_samples"]

    def _check_model(self, path: str, common: dict) -> None:
        ours = self.run_info["model_shape"]
        theirs = common.get("model_shape")
        if theirs is None:  # saved before shapes were stored: by preset name
            if common.get("model_name") != self.plan.shape.name:
                raise ValueError(f"{path} holds a {common.get('model_name')} model, not {self.plan.shape.name}")
            return
        # A field added since the checkpoint was saved has its default there (MoE fields: a dense model).
        defaults = {f.name: f.default for f in dataclasses.fields(ModelShape)}
        theirs = {k: theirs.get(k, defaults.get(k)) for k in ours}
        differ = {k: (theirs[k], v) for k, v in ours.items() if theirs[k] != v}
        if differ:
            shown = ", ".join(f"{k} {a} (checkpoint) vs {b}" for k, (a, b) in differ.items())
            raise ValueError(f"{path} holds another model: {shown}")

    def _sharded(self, moments: list[dict[str, torch.Tensor]]) -> dict:
        """Model and optimizer state as sharded tensors, each parameter's whole moments sharded
        like it (the same under every optimizer and data-parallel size)."""
        model_state = self.core.sharded_state_dict()
        optim_state = {"state": dict(enumerate(moments)), "param_groups": [{"params": list(range(len(moments)))}]}
        optim_state_to_sharding_state(
            optim_state, get_param_id_to_sharded_param_map(model_state, self.optimizer.params))
        return {"model": model_state, "optimizer": optim_state}
