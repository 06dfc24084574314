"""Hugging Face model folders in and out of a megatron-core GPTModel.

    load_hf_weights(model, "Qwen2.5-7B-Instruct", shape)      # every rank: its own slices only
    save_hf(model, export, "out/hf")                          # collective; rank 0 writes

Under pipeline parallelism a stage reads and writes its own layers (global numbers: the stage's
layer offset added), and with tied embeddings the last stage's output layer is read from
model.embed_tokens and never written (the first stage writes it).

Loading streams tensor by tensor from the safetensors files (one file or an index of shards): a
rank reads only the rows or columns it keeps (`hf_weights`), so no rank ever holds a whole state
dict. Saving gathers each parameter over its tensor-parallel group, casts it to the folder's
dtype and writes shards of at most `max_shard_bytes` as transformers names them, then the index,
generation_config.json, the tokenizer files and, last, config.json: a folder without config.json
is not a model to transformers, so an interrupted export never looks complete.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from safetensors import safe_open
from safetensors.torch import save_file

from qwen_data.formats.outputs import atomic_file

from ..marks import is_expert_parallel, layer_offset
from ..shapes import ModelShape
from .config import CONFIG, GENERATION, UnsupportedCheckpoint
from .weights import hf_source

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


class SafetensorsFolder:
    """The tensors of a folder's safetensors files, read by name and slice."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        index = os.path.join(directory, INDEX)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                self.files = json.load(f)["weight_map"]
        elif os.path.isfile(os.path.join(directory, SINGLE)):
            with safe_open(os.path.join(directory, SINGLE), "pt") as f:
                self.files = {name: SINGLE for name in f.keys()}
        else:
            raise UnsupportedCheckpoint(f"{directory}: no {SINGLE} nor {INDEX} (only safetensors are read)")
        self.unread = set(self.files)
        self._open: dict[str, object] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> SafetensorsFolder:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _slice(self, name: str):
        if name not in self.files:
            raise UnsupportedCheckpoint(f"{self.directory}: no tensor {name}")
        file = self.files[name]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(safe_open(os.path.join(self.directory, file), "pt"))
        return self._open[file].get_slice(name)

    def size(self, name: str) -> tuple:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, dim: Optional[int], start: int, stop: int) -> torch.Tensor:
        part = self._slice(name)
        self.unread.discard(name)
        if dim is None:
            return part[:]
        return part[start:stop] if dim == 0 else part[:, start:stop]


def load_hf_weights(model: torch.nn.Module, directory: str, shape: ModelShape) -> None:
    """Copy this rank's slice of every parameter of its pipeline stage from the HF folder into
    `model`; every tensor of the folder must find a place on some stage."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    offset, experts = layer_offset(model), expert_offset(shape)
    with SafetensorsFolder(directory) as folder, torch.no_grad():
        for name, param in model.named_parameters():
            slicing, names = hf_source(name, shape, offset, experts)
            _check_split(name, param, slicing.dim, tp)
            tensor = slicing.read(names, folder.read, folder.size, rank, tp)
            if tensor.shape != param.shape:
                raise UnsupportedCheckpoint(f"{directory}: {', '.join(names)} give {tuple(tensor.shape)} for {name}, "
                                            f"which is {tuple(param.shape)} on this rank")
            param.copy_(tensor)
        unread = folder.unread
        if dist.get_world_size() > 1:  # read by no rank (pipeline stages, expert-parallel ranks read their own)
            read = [None] * dist.get_world_size()
            dist.all_gather_object(read, set(folder.files) - unread)
            unread = set(folder.files).difference(*read)
        # A tied model has no output layer; a folder may still carry lm_head (a copy of the embeddings).
        extra = {n for n in unread if not n.endswith("rotary_emb.inv_freq")}
        if shape.tied_embeddings:
            extra.discard("lm_head.weight")
        if extra:
            raise UnsupportedCheckpoint(f"{directory}: {len(extra)} tensors have no place in the model, "
                                        f"e.g. {sorted(extra)[:3]}")


def expert_offset(shape: ModelShape) -> int:
    """The global number of this expert-parallel rank's first expert."""
    if not shape.moe:
        return 0
    return parallel_state.get_expert_model_parallel_rank() * shape.num_experts // \
        parallel_state.get_expert_model_parallel_world_size()


def _check_split(name: str, param: torch.Tensor, dim: Optional[int], tp: int) -> None:
    """The slicing table (`hf_source`) against megatron's own marks on the parameter (under TP)."""
    if tp == 1:
        return
    split = getattr(param, "tensor_model_parallel", False)
    if split != (dim is not None) or (split and param.partition_dim != dim):
        raise AssertionError(f"{name}: megatron splits it along {param.partition_dim if split else None}, "
                             f"the HF slicing along {dim}")


@dataclass(frozen=True)
class HFExport:
    """What a model folder holds besides the weights."""

    shape: ModelShape
    config: dict  # config.json, as read (--hf-model) or made (hf_config.config_of_shape)
    dtype: torch.dtype  # of the tensors written
    tokenizer_dir: Optional[str]  # its files are copied; None = no tokenizer in the folder
    generation: dict  # generation_config.json


def save_hf(model: torch.nn.Module, export: HFExport, out_dir: str, max_shard_bytes: int = 5 * 2**30) -> None:
    """Write `model` as a transformers folder; every rank calls it (the gathers are collective).

    Rank 0 writes: its own stage's tensors as its tensor-parallel group gathers them, then each
    later pipeline stage's, sent to it tensor by tensor by that stage's first tensor-parallel rank.
    """
    writer = _ShardWriter(out_dir, max_shard_bytes) if dist.get_rank() == 0 else None
    if parallel_state.get_data_parallel_rank() == 0:  # one pipeline of tensor-parallel groups gathers
        # (with its expert-parallel peers, which gather their experts to it)
        tensors = _stage_tensors(model, export)
        pipeline = dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())
        if writer is not None:
            for name, tensor in tensors:
                writer.add(name, tensor.to("cpu"))
            for source in pipeline[1:]:
                for name, tensor in _received(source, next(model.parameters()).device):
                    writer.add(name, tensor.to("cpu"))
        elif parallel_state.get_tensor_model_parallel_rank() == 0 and 0 in pipeline:
            for name, tensor in tensors:
                dist.send_object_list([(name, tuple(tensor.shape), tensor.dtype)], dst=0)
                dist.send(tensor.contiguous(), dst=0)
            dist.send_object_list([None], dst=0)
        else:
            for _ in tensors:  # the gathers need every rank of the group
                pass
    elif parallel_state.get_expert_data_parallel_rank() == 0:  # an expert-parallel peer of that pipeline
        for _ in _stage_tensors(model, export):
            pass
    if writer is not None:
        writer.finish(export)
    dist.barrier()


def _stage_tensors(model: torch.nn.Module, export: HFExport):
    """(HF name, whole tensor in the folder's dtype, on the model's device) of this pipeline
    stage, gathered over its tensor-parallel group, and experts also over the expert-parallel
    group (collective: every rank of those groups iterates)."""
    offset = layer_offset(model)
    for name, param in model.named_parameters():
        if getattr(param, "shared", False):  # the last stage's copy of tied embeddings: the first stage writes them
            continue
        experts = is_expert_parallel(param)
        group = parallel_state.get_expert_tensor_parallel_group() if experts \
            else parallel_state.get_tensor_model_parallel_group()
        slicing, names = hf_source(name, export.shape, offset, expert_offset(export.shape))
        shards, tp = [param.detach()], dist.get_world_size(group)
        if slicing.dim is not None and tp > 1:
            shards = [torch.empty_like(param) for _ in range(tp)]
            dist.all_gather(shards, param.detach().contiguous(), group=group)
        whole = slicing.join(shards, len(names))
        if experts:  # the same local expert of every expert-parallel rank, in rank order
            ep = parallel_state.get_expert_model_parallel_world_size()
            gathered = []
            for tensor in whole:
                parts = [torch.empty_like(tensor) for _ in range(ep)]
                dist.all_gather(parts, tensor.contiguous(), group=parallel_state.get_expert_model_parallel_group())
                gathered.append(parts)
            local = export.shape.num_experts // ep
            for rank in range(ep):
                _, rank_names = hf_source(name, export.shape, offset, rank * local)
                for hf_name, parts in zip(rank_names, gathered):
                    yield hf_name, parts[rank].to(export.dtype)
            continue
        for hf_name, tensor in zip(names, whole):
            yield hf_name, tensor.to(export.dtype)


def _received(source: int, device: torch.device):
    """The (HF name, tensor) pairs `source` sends with `save_hf`, until its end mark."""
    while True:
        message = [None]
        dist.recv_object_list(message, src=source)
        if message[0] is None:
            return
        name, shape, dtype = message[0]
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(tensor, src=source)
        yield name, tensor


class _ShardWriter:
    def __init__(self, out_dir: str, max_bytes: int) -> None:
        self.out_dir, self.max_bytes = out_dir, max_bytes
        os.makedirs(out_dir, exist_ok=True)
        # Whatever a previous export left: config.json first, so the folder stops looking complete.
        for old in [CONFIG] + [os.path.basename(p) for p in glob.glob(os.path.join(out_dir, "model*.safetensors*"))]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, old))
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.written: list[tuple[str, list[str]]] = []  # (temporary file, tensor names)
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        path = os.path.join(self.out_dir, f".shard-{len(self.written):05d}.tmp")
        save_file(self.pending, path, metadata={"format": "pt"})
        self.written.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self, export: HFExport) -> None:
        if self.pending:
            self._flush()
        n = len(self.written)
        names = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for (path, _), name in zip(self.written, names):
            os.replace(path, os.path.join(self.out_dir, name))
        if n > 1:
            weight_map = {t: name for (_, tensors), name in zip(self.written, names) for t in tensors}
            self._json(INDEX, {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map})
        self._json(GENERATION, export.generation)
        if export.tokenizer_dir:
            for file in TOKENIZER_FILES:
                source = os.path.join(export.tokenizer_dir, file)
                if os.path.isfile(source):
                    with atomic_file(os.path.join(self.out_dir, file), "wb") as out, open(source, "rb") as f:
                        shutil.copyfileobj(f, out)
        self._json(CONFIG, export.config)

    def _json(self, name: str, value: dict) -> None:
        with atomic_file(os.path.join(self.out_dir, name), "w") as f:
            json.dump(value, f, indent=2, sort_keys=True)
            f.write("\n")
