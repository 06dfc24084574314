"""Train-stage datasets over qwen-data prefixes, built only through megatron-core's
`BlendedMegatronDatasetBuilder` (megatron-core 0.16 to 0.19).

    train, valid, test = build_datasets("out/pretrain_blend.json", seq_length=4096,
                                        train_samples=iters * gbs, valid_samples=..., test_samples=...,
                                        seed=1234, cache_dir="out/cache")

`blend` is a file written by `qwen-data blend` (NAME.json, NAME.txt or NAME.qwen-data.json; the
sidecar, when present, supplies the split), a Megatron blend list (`["0.7", "out/web", "0.3",
"out/code"]` or `["out/web", "out/code"]`, cut by `split`), a single prefix, or a per-split dict
`{"train": [...], "valid": [...] | None, "test": [...] | None}`, read by `qwen_data.blend.read`.

The manifests decide the dataset class (mixing kinds is refused, as are disagreeing tokenizers,
eod/pad ids or templates):
  pretrain → `PretrainDataset`, megatron-core's `GPTDataset` with two extra keys (below).
  sft      → `SFTDataset`, one sample = one document of the prefix (a packed row of several
             sequences, or one conversation padded to `seq_length` with the pad id, loss mask 0).
             A prefix is read through its layout's reader (`DataLayout.open`); one in
             Pai-Megatron-Patch's layout (`qwen_data.formats.pai`) through `PaiRows`, each row
             decoded to the tokens, mask and sequences the default layout stores.

Every sample is a dict of torch tensors over `seq_length` positions:
  tokens, labels (labels[i] = tokens[i+1]), loss_mask (float32), position_ids (int64),
  segment_ids (int32: which sequence each position belongs to; attention must stay inside a
  segment, causally), cu_seqlens (int32 [seq_length + 1]: segment starts then seq_length, padded
  with seq_length, as Megatron's packed-sequence datasets give it) and max_seqlen (int32 scalar).
  BlendedDataset adds dataset_id. GPTDataset's attention_mask is left out unless asked for.
SFT loss: loss_mask[i] = mask[i+1], and 0 where token i+1 starts another sequence or is padding.
Pretraining: segments split after each end-of-document token only with `reset_attention_mask`
(Megatron's meaning of that flag); otherwise the whole sample is one segment.

Index caches (`cache_dir`, Megatron's `path_to_cache`; none: built in memory, never beside the data)
are keyed by Megatron on a description that includes the tokenizer's `unique_identifiers`; ours
carries every manifest's fingerprint, so a prefix rewritten by qwen-data never reuses an index built
for its old contents.
"""

from __future__ import annotations

import errno
import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.megatron_dataset import MegatronDataset
from megatron.core.datasets.utils import Split

from qwen_data.blend.files import SPLITS, BlendError, Source
from qwen_data.blend.read import TrainBlend, read_train_blend
from qwen_data.blend.weights import parse_split
from qwen_data.formats.integrity import check_prefixes
from qwen_data.formats.layouts import StoredDocuments, layout_of
from qwen_data.formats.manifest import Manifest
from qwen_data.formats.outputs import atomic_file

from .patches import megatron_core

OVERLONG_POLICIES = ("error", "truncate")


# ---------------------------------------------------------------------------------------------
# Tokenizer


class ManifestTokenizer:
    """What megatron-core datasets read from a tokenizer, taken from the manifests.

    Duck-typed on purpose: the abstract base moved between megatron-core versions
    (`core.datasets.megatron_tokenizer` ≤0.16, `core.tokenizers` 0.17+) and the datasets check no
    type. `pad` is the manifests' pad id (151654 by default), never the eod id, so GPTDataset's
    "mask labels equal to pad" can never hit a real end of document.
    """

    def __init__(self, sources: list[Source]) -> None:
        first = sources[0].manifest
        self.eod, self.pad = first.eod_id, first.pad_id  # never equal: `load_source` refuses that
        self.certificates = [describe_certificate(s) for s in sources]  # the trainer shows them
        # Rows of several samples (qwen-data sft --pack) from every prefix; the run's log records it
        self.packed = all(s.manifest.sft is not None and s.manifest.sft.packed for s in sources)
        self.vocab_size = first.vocab_size
        self.identity = first.tokenizer  # QwenTokenizer.identity() of the data
        self.unique_identifiers = {
            "class": "qwen_data.ManifestTokenizer",
            "tokenizer_sha256": first.tokenizer.get("sha256"),
            "eod": self.eod,
            "pad": self.pad,
            "vocab_size": self.vocab_size,
            # Megatron keys its index caches on this dict: a rewritten prefix changes its
            # fingerprint, hence the cache key.
            "fingerprints": {s.prefix: s.manifest.fingerprint for s in sorted(sources, key=lambda s: s.prefix)},
        }

    def check_embedding(self, rows: int, model: str) -> None:
        """ValueError unless every id the data feeds a model (its token ids, below the tokenizer's
        vocabulary size, the eod id, and the pad id that fills samples) has a row of its embedding."""
        largest = max(self.vocab_size - 1, self.eod, self.pad)
        if largest >= rows:
            raise ValueError(
                f"the data feeds ids up to {largest} (token ids below its tokenizer's {self.vocab_size}, eod id "
                f"{self.eod}, pad id {self.pad}), but the model {model} has {rows} embedding rows (ids 0..{rows - 1}): "
                "train a model with more rows" + (f", or make the data with a --pad-id below {rows}"
                                                  if self.pad >= rows > max(self.vocab_size - 1, self.eod) else ""))


def describe_certificate(source: Source) -> str:
    """One line on a prefix's certificate (qwen-data's parity check of its ids, and `verify
    --certify` rechecks of them)."""
    found = source.manifest.certificate
    if not found:
        return f"data {source.prefix}: no certificate (made before qwen-data recorded one)"
    if not found.get("certified"):
        return f"data {source.prefix}: not certified: {found.get('why')}"
    line = (f"data {source.prefix}: certified, {found.get('records_checked', 0):,} records equal to "
            + ", ".join(f"{name} {version}" for name, version in found.get("reference", {}).items()))
    for recheck in found.get("rechecks", []):
        line += (f"; rechecked {recheck['when'][:10]}: {recheck['records_checked']:,} records, "
                 + ("a mismatch" if recheck["mismatches"] else "equal"))
    if found.get("fingerprint") is None:
        line += "; it does not name the data it vouches for (no fingerprint in it)"
    return line


def refuse_mismatches(sources: list[Source]) -> None:
    """ValueError for a prefix whose certificate records ids that differ from the reference's, or
    vouches for other data than its manifest's (a certificate names its data by fingerprint)."""
    for source in sources:
        found = source.manifest.certificate or {}
        recheck = next((r for r in found.get("rechecks", []) if r.get("mismatches")), None)
        if found.get("mismatches") or recheck:
            raise ValueError(f"{source.prefix}: its certificate records ids that differ from the reference's"
                             + (f" ({recheck.get('mismatch')})" if recheck else "")
                             + ": make the data again, or --allow-uncertified to train on it anyway")
        named = found.get("fingerprint")
        if found.get("certified") and named is not None and named != source.manifest.fingerprint:
            raise ValueError(f"{source.prefix}: its certificate vouches for other data (fingerprint "
                             f"{str(named)[:16]}…, the manifest's {source.manifest.fingerprint[:16]}…): make the data "
                             "again, or --allow-uncertified to train on it anyway")


def check_data(sources: list[Source]) -> str:
    """Each prefix's files against its manifest (`formats.integrity`: the fingerprint, ids in the
    vocabulary), whatever its certificate says: ValueError naming the first prefix refused; → the line
    saying what was read, in how long."""
    started = time.perf_counter()
    checked = check_prefixes([(s.prefix, s.manifest) for s in sources])
    refused = [c for c in checked if c.problem]
    if refused:
        raise ValueError(refused[0].problem + (f" (and {len(refused) - 1} more of the {len(checked)} prefixes refused)"
                                               if len(refused) > 1 else ""))
    size = sum(c.bytes for c in checked)
    amount = f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
    several = len(checked) > 1
    return (f"data: {len(checked)} prefix{'es' * several}, {amount} checked against "
            f"{'their manifests' if several else 'its manifest'} in {time.perf_counter() - started:.2f} s")


# ---------------------------------------------------------------------------------------------
# Boundaries shared by both dataset classes


def boundaries(segment_ids: np.ndarray, seq_length: int) -> dict[str, torch.Tensor]:
    """position_ids restarting per segment, padded cu_seqlens and max_seqlen from segment ids."""
    starts = np.flatnonzero(np.diff(segment_ids, prepend=segment_ids[0] - 1))
    ends = np.append(starts[1:], seq_length)
    position_ids = np.arange(seq_length) - np.repeat(starts, ends - starts)
    cu_seqlens = np.full(seq_length + 1, seq_length, dtype=np.int32)
    cu_seqlens[: len(starts)] = starts
    return {
        "position_ids": torch.from_numpy(position_ids.astype(np.int64)),
        "segment_ids": torch.from_numpy(segment_ids.astype(np.int32)),
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "max_seqlen": torch.tensor(int((ends - starts).max()), dtype=torch.int32),
    }


def segment_ids_from_eod(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """Segment of every position: a new one starts after each end-of-document token (any batch shape)."""
    ends = (tokens == eod).to(torch.int32)
    return torch.cumsum(ends, dim=-1) - ends


def samples_of_row(row: dict):
    """(start, end, sample) for each segment of a one-row batch: the sample as a batch of its own,
    positions as packed; a packed row must compute what its samples compute one by one."""
    segments = row["segment_ids"][0]
    for segment in segments.unique():
        where = (segments == segment).nonzero().flatten()
        start, end = int(where[0]), int(where[-1]) + 1
        sample = {k: row[k][:, start:end] for k in ("tokens", "labels", "position_ids")}
        sample["segment_ids"] = torch.zeros(1, end - start, dtype=torch.int32)
        yield start, end, sample


# ---------------------------------------------------------------------------------------------
# Pretraining


class PretrainDataset(GPTDataset):
    """megatron-core's GPTDataset, plus segment_ids/cu_seqlens/max_seqlen like SFT samples.

    Position ids, loss mask and padding are GPTDataset's own (reset_position_ids, eod_mask_loss);
    segments follow reset_attention_mask.
    """

    def _get_num_epochs(self, num_tokens_per_epoch: int) -> int:
        """megatron-core's count of epochs for the samples asked (the fewest, at least 1, that hold them),
        computed: its own adds an epoch at a time, and with no tokens in an epoch it never ends."""
        if self.num_samples is None:
            return 1
        requested = self.num_samples * self.config.sequence_length + self.config.add_extra_token_to_sequence
        if num_tokens_per_epoch <= 0:
            raise ValueError(f"{self.dataset_path} ({self.index_split.name}): its {self.index_split.name} part holds "
                             f"{num_tokens_per_epoch} tokens, but {self.num_samples:,} samples are asked of it")
        return max(1, -(-requested // num_tokens_per_epoch))

    def __getitem__(self, idx: Optional[int]) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(idx)
        s = self.config.sequence_length
        if self.config.reset_attention_mask:
            segment_ids = segment_ids_from_eod(sample["tokens"], self.config.tokenizer.eod).numpy()
        else:
            segment_ids = np.zeros(s, dtype=np.int32)
        extra = boundaries(segment_ids, s)
        extra.pop("position_ids")  # GPTDataset's (reset_position_ids decides)
        sample.update(extra)
        return sample


# ---------------------------------------------------------------------------------------------
# SFT


@dataclass
class SFTDatasetConfig(BlendedMegatronDatasetConfig):
    """Config of `SFTDataset`; `tokenizer` (a ManifestTokenizer) gives the pad id."""

    overlong: str = "error"
    """A document longer than seq_length + 1 tokens: "error" refuses the split at build time,
    "truncate" cuts it (its last targets, often `<|im_end|>`, are then never trained)."""

    shuffle: bool = True
    """Shuffle documents within each epoch (each epoch is a fresh permutation)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.tokenizer is not None, "SFTDatasetConfig needs a tokenizer (for the pad id)"
        assert self.overlong in OVERLONG_POLICIES, f"overlong must be one of {OVERLONG_POLICIES}"


class SFTDataset(MegatronDataset):
    """One sample = one document of a qwen-data SFT prefix (see the module docstring)."""

    def __init__(self, dataset: StoredDocuments, dataset_path: Optional[str], indices: np.ndarray,
                 num_samples: Optional[int], index_split: Split, config: SFTDatasetConfig) -> None:
        super().__init__(dataset, dataset_path, indices, num_samples, index_split, config)
        self._check_lengths()
        self.sample_index = self._build_sample_index()

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: StoredDocuments) -> int:
        # Split by document: a packed row never straddles train and valid.
        return len(low_level_dataset)

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: SFTDatasetConfig) -> StoredDocuments:
        # The mask layouts' P.bin/.idx tokens and P.lossmask.bin/.idx, one index; a pai-layout row decoded.
        return layout_of(Manifest.read(dataset_path)).open(dataset_path, mmap=config.mmap_bin_files)

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return MegatronDataset._key_config_attributes() + ["overlong", "shuffle"]

    def __len__(self) -> int:
        return len(self.sample_index)

    def _check_lengths(self) -> None:
        lengths = self.dataset.document_lengths[self.indices]
        over = lengths > self.config.sequence_length + 1
        if over.any():
            message = (f"{self.dataset_path} ({self.index_split.name}): {int(over.sum())} of {len(lengths)} "
                       f"documents exceed seq_length {self.config.sequence_length} (+1 label-only token), "
                       f"longest {int(lengths.max())}")
            if self.config.overlong == "error":
                raise ValueError(message + f": train with --seq-length {int(lengths.max()) - 1} or more, or make the "
                                 f"data with `qwen-data sft --seq-length {self.config.sequence_length}` (--overlong: "
                                 "drop or truncate longer samples; here overlong='truncate' cuts them, and cut "
                                 "samples lose their final targets)")
            warnings.warn(message + ": truncated")

    def _build_sample_index(self) -> np.ndarray:
        """Document ids in sample order: whole epochs, each its own permutation; cached by description."""
        path = None
        if self.config.path_to_cache:
            base = f"{self.unique_description_hash}-{type(self).__name__}-{self.index_split.name}"
            path = os.path.join(self.config.path_to_cache, base + "-sample_index.npy")
            if os.path.isfile(path):
                return np.load(path, mmap_mode="r")
        n = len(self.indices)
        epochs = 1 if not self.num_samples or n == 0 else math.ceil(self.num_samples / n)
        rng = np.random.RandomState(self.config.random_seed)
        order = []
        for _ in range(epochs):
            epoch = np.array(self.indices, dtype=np.int64)
            if self.config.shuffle:
                rng.shuffle(epoch)
            order.append(epoch)
        sample_index = np.concatenate(order) if order else np.zeros(0, np.int64)
        if path is not None:
            os.makedirs(self.config.path_to_cache, exist_ok=True)
            with open(path[: -len("-sample_index.npy")] + "-description.txt", "w") as f:
                f.write(self.unique_description)
            with atomic_file(path, "wb") as f:  # other ranks never see a half-written index
                np.save(f, sample_index)
        return sample_index

    def __getitem__(self, idx: Optional[int]) -> dict[str, torch.Tensor]:
        s = self.config.sequence_length
        pad = self.config.tokenizer.pad
        doc = int(self.sample_index[0 if idx is None else idx])
        tokens, mask, sequence_lengths = self.dataset.document(doc)
        segments = np.repeat(np.arange(len(sequence_lengths)), sequence_lengths)
        window = s + 1  # inputs are window[:-1], labels window[1:]
        tokens, mask, segments = tokens[:window], mask[:window], segments[:window]
        fill = window - len(tokens)
        if fill:
            tokens = np.concatenate([tokens, np.full(fill, pad, dtype=tokens.dtype)])
            mask = np.concatenate([mask, np.zeros(fill, dtype=mask.dtype)])
            # Padding is a segment of its own: it attends to nothing real.
            segments = np.concatenate([segments, np.full(fill, len(sequence_lengths), dtype=segments.dtype)])
        is_pad = np.zeros(window, dtype=bool)
        is_pad[window - fill:] = True
        loss_mask = (mask[1:] != 0) & (segments[1:] == segments[:-1]) & ~is_pad[1:] & (tokens[1:] != pad)
        if idx is None:  # batch padding, as GPTDataset
            loss_mask[:] = False
        sample = {
            "tokens": torch.from_numpy(tokens[:-1].astype(np.int64)),
            "labels": torch.from_numpy(tokens[1:].astype(np.int64)),
            "loss_mask": torch.from_numpy(loss_mask.astype(np.float32)),
        }
        sample.update(boundaries(segments[:-1], s))
        return sample


# ---------------------------------------------------------------------------------------------
# Building


# megatron-core's own default: how many more samples a blend's datasets build than their share asks,
# so that rounding never leaves the blend short.
MID_LEVEL_SURPLUS = 0.005


def build_datasets(
    blend,
    seq_length: int,
    train_samples: Optional[int],
    valid_samples: Optional[int] = None,
    test_samples: Optional[int] = None,
    seed: int = 1234,
    cache_dir: Optional[str] = None,
    *,
    split: Optional[str] = None,
    reset_position_ids: bool = False,
    reset_attention_mask: bool = False,
    eod_mask_loss: bool = False,
    overlong: str = "error",
    shuffle_sft: bool = True,
    allow_uncertified: bool = False,
):
    """(train, valid, test) datasets, each a megatron-core BlendedDataset, a single dataset or None.

    Sizes are minimum sample counts, as Megatron-LM computes them (train = iters × global batch).
    Pretraining options are GPTDataset's: `reset_position_ids`, `reset_attention_mask` (also
    splits segment_ids at each end of document) and `eod_mask_loss`.
    """
    named = read_train_blend(blend, split)
    sources = named.sources
    if not allow_uncertified:
        refuse_mismatches(sources)
    sizes = _sizes([train_samples, valid_samples, test_samples], named)
    common = dict(random_seed=seed, sequence_length=seq_length, blend=named.blend, blend_per_split=named.per_split,
                  split=named.split, path_to_cache=cache_path(cache_dir, blend, sources),
                  tokenizer=ManifestTokenizer(sources), mid_level_dataset_surplus=MID_LEVEL_SURPLUS)
    if sources[0].kind == "pretrain":
        cls, config = PretrainDataset, GPTDatasetConfig(
            **common, reset_position_ids=reset_position_ids, reset_attention_mask=reset_attention_mask,
            eod_mask_loss=eod_mask_loss, create_attention_mask=False)  # (the model masks causally itself)
    else:
        cls, config = SFTDataset, SFTDatasetConfig(**common, overlong=overlong, shuffle=shuffle_sft)
    if named.blend is not None:
        config.split_matrix = _requested_split_matrix(config.split_matrix, sizes, sources)
    with megatron_core():
        datasets = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()  # (on every rank)
    return tuple(datasets)


def cache_path(cache_dir: Optional[str], blend, sources: list[Source]) -> str:
    """megatron-core's `path_to_cache`, for every dataset class: `cache_dir`, made here and checked to be
    none of the run's inputs; or "" for none. Not None: GPTDataset turns None into a folder named after
    the prefix, beside the data (`<prefix>/cache/`), which may be read-only and shadows the prefix's
    name; an empty path is "no cache" to every test megatron-core makes of it (`if path_to_cache:`), so
    the indices are built in memory."""
    if cache_dir is None:
        return ""
    inputs = [os.fspath(blend)] if isinstance(blend, (str, os.PathLike)) else []
    for s in sources:
        inputs += [s.prefix + ".json"] + [channel + suffix for channel, _ in layout_of(s.manifest).channels(
            s.prefix, s.manifest.dtype) for suffix in (".bin", ".idx")]
    for path in inputs:
        if os.path.exists(path) and os.path.exists(cache_dir) and os.path.samefile(path, cache_dir):
            raise ValueError(f"--data-cache {cache_dir} is {path}, an input of this run: give the cache a directory "
                             "of its own")
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise ValueError(f"--data-cache {cache_dir}: a file, not a directory")
    os.makedirs(cache_dir, exist_ok=True)  # here, where an OSError is told in one line
    if not os.access(cache_dir, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "permission denied", cache_dir)
    return cache_dir


def _sizes(sizes: list, named: TrainBlend) -> list:
    """Sample counts per split; a weighted part nobody asked samples of gets 0 (megatron-core
    wants a size beside weights) where it is an empty part of the split, else an error."""
    sizes = list(sizes)
    for i, name in enumerate(SPLITS):
        b = named.per_split[i] if named.per_split else named.blend
        if b is None or b[1] is None or sizes[i] is not None:
            continue
        if named.per_split or parse_split(named.split)[i] > 0:
            raise BlendError(f"a weighted {name} blend needs {name}_samples")
        sizes[i] = 0
    return sizes


def _requested_split_matrix(matrix, sizes, sources):
    """megatron-core's split matrix, without the parts no sample is asked from.

    GPTDataset loops forever when a part holds no documents (0 tokens an epoch never reach the
    one extra token even 0 samples need): an unrequested part is left unbuilt (the others keep
    their exact document ranges), and a requested one with no documents is refused here.
    """
    matrix = list(matrix)
    for i, name in enumerate(("train", "valid", "test")):
        if matrix[i] is None:
            continue
        if sizes[i] == 0:
            matrix[i] = None
            continue
        begin, end = matrix[i]
        for s in sources:
            if round(begin * s.documents) == round(end * s.documents):
                raise BlendError(f"{s.prefix}: its {name} part ({begin:.3g} to {end:.3g} of {s.documents} "
                                 f"documents) is empty, but {name} samples are asked for: give a --split with "
                                 f"a larger {name} share, or separate {name} prefixes (`qwen-data blend "
                                 f"--{name} PREFIX`)" + (", or train without evaluation (--eval-interval 0)"
                                                         if name == "valid" else ""))
    return matrix
