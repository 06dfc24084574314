"""Hugging Face folder ↔ megatron-core dist_checkpointing checkpoint, on its own.

    qwen-data convert hf-to-mcore Qwen2.5-7B-Instruct ckpt/qwen7b          # then: qwen-data train --load ckpt/qwen7b
    qwen-data convert mcore-to-hf ckpt/run1 out/hf [--tokenizer DIR]
    torchrun --nproc-per-node 4 -m qwen_data_train.convert hf-to-mcore DIR CKPT --tp 2 --pp 2

A dist_checkpointing checkpoint is not tied to a parallel layout: converted under any --tp and
--pp (world size tp × pp), it loads under any other. `hf-to-mcore` writes iteration 0 with the weights only (a run
that loads it starts with fresh AdamW moments) and the folder's config.json and
generation_config.json beside them; `mcore-to-hf` exports the latest iteration of a checkpoint
saved by the train stage or by `hf-to-mcore`.

Every --attention runs the same local layer spec (core attention holds no weights), so one
checkpoint serves them all.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import torch
from megatron.core import tensor_parallel

from qwen_data.text.tokenizer import directory_of, folder_identity

from .checkpoint import Checkpointer, latest, stored
from .config import CheckpointConfig, convert_parser
from .distributed import distributed, log0
from .hf.checkpoint import HFExport, load_hf_weights, save_hf
from .hf.config import config_dtype, model_of_folder, shape_from_config
from .model import build_model
from .plan import RunPlan
from .patches import megatron_core


def hf_to_mcore(hf_model: str, root: str, tp: int, pp: int = 1) -> None:
    shape, hf_config, generation = model_of_folder(hf_model)
    plan = RunPlan.for_model(shape, attention="sdpa", tp=tp, pp=pp, initialize=False)
    model = build_model(plan)
    load_hf_weights(model, hf_model, shape)
    has_tokenizer = os.path.isfile(os.path.join(hf_model, "tokenizer.json"))
    tokenizer = folder_identity(hf_model) if has_tokenizer else None
    export = HFExport(shape, hf_config, config_dtype(hf_config), None, generation)
    Checkpointer(CheckpointConfig(save=root, save_interval=0, load=None, save_hf=None), plan, model, None, export,
                 tokenizer=tokenizer).save_megatron(root, 0, 0)


def mcore_to_hf(root: str, out: str, tp: int, pp: int, tokenizer_dir: Optional[str]) -> None:
    path = latest(root)
    if path is None:
        raise FileNotFoundError(f"{root}: no checkpoint (no latest_checkpointed_iteration.txt)")
    common = stored(path)
    if "hf_config" not in common:
        raise ValueError(f"{path}: saved without its model's config (by an older qwen-data): cannot export it")
    hf_config = common["hf_config"]
    shape = shape_from_config(hf_config, path)
    if tokenizer_dir is None and common.get("tokenizer"):
        tokenizer_dir = directory_of(common["tokenizer"])
    if tokenizer_dir is None:
        log0(f"note: {path} names no tokenizer: {out} gets none (give --tokenizer DIR)")
    plan = RunPlan.for_model(shape, attention="sdpa", tp=tp, pp=pp, initialize=False)
    model = build_model(plan)
    export = HFExport(shape, hf_config, config_dtype(hf_config), tokenizer_dir, common["generation"])
    Checkpointer(CheckpointConfig(save=None, save_interval=0, load=root, save_hf=None), plan, model, None, export).load()
    save_hf(model, export, out)


def convert(args: argparse.Namespace) -> int:
    """One conversion, `args` as `config.convert_parser` parses them."""
    with megatron_core(), distributed(args.tp, args.pp) as device, torch.no_grad():
        if device.type == "cuda":  # megatron-core's layers draw their initial weights from its CUDA generators
            tensor_parallel.model_parallel_cuda_manual_seed(0)
        if args.direction == "hf-to-mcore":
            hf_to_mcore(args.hf_model, args.checkpoint, args.tp, args.pp)
            log0(f"wrote {args.checkpoint} (load it with --load {args.checkpoint})")
        else:
            mcore_to_hf(args.checkpoint, args.hf_out, args.tp, args.pp, args.tokenizer)
            log0(f"wrote {args.hf_out}")
    return 0


if __name__ == "__main__":
    sys.exit(convert(convert_parser().parse_args()))
