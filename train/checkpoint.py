"""Checkpoints as megatron-core `dist_checkpointing` (torch_dist) directories: sharded, and
loadable under any TP/DP layout.

    root/iter_0000200/                      one directory per saved iteration
    root/latest_checkpointed_iteration.txt  the iteration `--load root` resumes from
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state

from .config import CheckpointConfig
from .distributed import is_rank0, log0

LATEST = "latest_checkpointed_iteration.txt"


class Checkpointer:
    """Saves and resumes the model, the AdamW moments and where the run stands.

    `run_info` (model name, sequence length, global batch) is stored beside them; the model name
    must match on load.
    """

    def __init__(self, config: CheckpointConfig, core: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 **run_info) -> None:
        self.config, self.core, self.optimizer, self.run_info = config, core, optimizer, run_info

    def due(self, iteration: int, last: bool) -> bool:
        """Save after this iteration? Every `save_interval`, and after the last one."""
        every = self.config.save_interval
        return bool(self.config.save) and (last or (every > 0 and iteration % every == 0))

    def save(self, iteration: int, consumed_samples: int) -> None:
        if importlib.util.find_spec("psutil") is None:
            # megatron-core ≤0.16 writes from a child process that needs psutil; without it the
            # child dies and the save hangs forever instead of failing.
            raise RuntimeError("checkpointing needs psutil (pip install psutil)")
        root = self.config.save
        path = os.path.join(root, f"iter_{iteration:07d}")
        if is_rank0():
            os.makedirs(path, exist_ok=True)
        dist.barrier()
        state = self._sharded(self.optimizer.state_dict())
        state.update(iteration=iteration, consumed_samples=consumed_samples, **self.run_info)
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
        if not root:
            return 0, 0
        latest = os.path.join(root, LATEST)
        if not os.path.isfile(latest):
            log0(f"no checkpoint in {root}: starting from scratch")
            return 0, 0
        with open(latest) as f:
            path = os.path.join(root, f"iter_{int(f.read().strip()):07d}")
        state = dist_checkpointing.load(self._sharded(self._fresh_optimizer_state()), path)
        if state["model_name"] != self.run_info["model_name"]:
            raise ValueError(f"{path} holds a {state['model_name']} model, not {self.run_info['model_name']}")
        self.core.load_state_dict(state["model"])
        steps = torch.tensor(float(state["iteration"]))  # every parameter is stepped every iteration
        self.optimizer.load_state_dict({
            "state": {i: {**s, "step": steps.clone()} for i, s in state["optimizer"]["state"].items()},
            "param_groups": state["optimizer"]["param_groups"],
        })
        log0(f"resumed from {path} (iteration {state['iteration']}, {state['consumed_samples']} samples consumed)")
        return state["iteration"], state["consumed_samples"]

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _fresh_optimizer_state(self) -> dict:
        """The load template: zero moments (the optimizer has none before its first step)."""
        return {"state": {i: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                          for i, p in enumerate(self._params())},
                "param_groups": self.optimizer.state_dict()["param_groups"]}

    def _sharded(self, optim_state: dict) -> dict:
        """Model and optimizer state as sharded tensors, the moments sharded like their parameters."""
        model_state = self.core.sharded_state_dict()
        optim_state_to_sharding_state(optim_state, get_param_id_to_sharded_param_map(model_state, self._params()),
                                      exclude_keys=("step",))
        return {"model": model_state, "optimizer": optim_state}
