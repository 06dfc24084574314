"""The blend contract: what `qwen-data blend` writes, what `train.data` reads back.

Files, for `-o NAME.json`:
  NAME.json            `--per-split-data-args-path`: {"train": [w1, p1, ...], "valid": [...] | null,
                       "test": [...] | null}, weights and prefixes as strings, as Megatron-LM's
                       `get_blend_and_blend_per_split` reads it. Not written with `--split` (see below).
  NAME.txt             `--data-args-path`: the train blend `w1 p1 w2 p2 ...` (whitespace separated).
  NAME.qwen-data.json  our own record, which Megatron never reads: each source's manifest
                       fingerprint, token share and Megatron weight, the kind, tokenizer, eod/pad
                       ids, template, and the Megatron flags to use. `train.data` reads it.

Validation data, two ways, as Megatron-LM itself offers them (they exclude each other there too):
  --valid P[=w] ... / --test P[=w] ...   separate prefixes: NAME.json carries one blend per split;
                                         train with `--per-split-data-args-path NAME.json`.
  --split 98,2,0                         one distribution cut by Megatron (the last sequences of
                                         every prefix go to valid/test): train with
                                         `--data-args-path NAME.txt --split 98,2,0`. Megatron's
                                         per-split file cannot carry a split, so NAME.json is not
                                         written (a stale one is removed).
With neither, NAME.json has no validation data (`"valid": null`).

Prefixes are written as given (relative ones resolve against the training job's working
directory, as in Megatron); `--absolute` writes absolute paths.

Checks, before anything is written: every prefix has `.bin`, `.idx`, `.json` (and
`.lossmask.bin/.idx` for SFT in the mask layout) whose sizes match its manifest; all manifests agree
on kind, tokenizer (sha256), eod id, pad id, chat template and SFT layout (and, in the pai layout,
seq length: Pai's trainer reads rows of exactly 2 x its --seq-length); otherwise the refusal names
the disagreeing prefixes.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

from .. import __version__
from ..formats.indexed import IndexFormatError, check
from ..formats.layouts import layout_of
from ..formats.manifest import Manifest, strip_suffix, train_problems
from ..formats.outputs import atomic_file

BLEND_FORMAT = "qwen-data/blend/1"
SIDECAR_SUFFIX = ".qwen-data.json"
SPLITS = ("train", "valid", "test")

# megatron-core's blend of one split: (prefixes, weights or None for equal weights).
MegatronBlend = tuple[list[str], list[float] | None]


class BlendError(ValueError):
    """A blend that cannot be written or read; the message says which prefixes and why."""


# ---------------------------------------------------------------------------------------------
# Sources


@dataclass
class Source:
    """One prefix of a blend and its manifest; `ratio` is the user's weight, if any."""

    prefix: str
    manifest: Manifest
    ratio: float | None = None

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def documents(self) -> int:
        return self.manifest.documents

    @property
    def real_tokens(self) -> int:
        """Data tokens: padding excluded, and the labels half of pai-layout rows."""
        return self.manifest.sft.sample_tokens if self.manifest.sft else self.manifest.tokens

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss is taken on: the SFT manifest's count of loss-mask 1; every token for pretraining."""
        return self.manifest.sft.trained_tokens if self.manifest.sft else self.real_tokens

    def count(self, unit: str) -> int:
        """The source's size in a ratio unit: trained tokens for "trained-tokens", else real tokens."""
        return self.trained_tokens if unit == "trained-tokens" else self.real_tokens

    @property
    def tokens_per_sample(self) -> float | None:
        """Mean real tokens per sample for SFT (one sample = one document); None for pretraining."""
        return self.per_sample("tokens")

    def per_sample(self, unit: str) -> float | None:
        """Mean tokens of `unit` ("tokens", "trained-tokens") per SFT sample; None for pretraining, whose
        samples all hold seq-length tokens, all trained."""
        return self.count(unit) / self.documents if self.kind == "sft" else None


def load_source(prefix: str, ratio: float | None = None) -> Source:
    """Read a prefix's manifest and check its files are there and match it."""
    if not prefix or any(c.isspace() for c in prefix):
        raise BlendError(f"{prefix!r}: prefixes must be non-empty and free of whitespace "
                         "(Megatron splits blend files on whitespace)")
    try:
        manifest = Manifest.read(prefix)
    except FileNotFoundError as exc:
        raise BlendError(str(exc)) from None
    except (ValueError, OSError) as exc:
        raise BlendError(f"{prefix}: unreadable manifest: {exc}") from None
    source = Source(prefix, manifest, ratio)
    if source.documents <= 0 or source.real_tokens <= 0:
        raise BlendError(f"{prefix}: the manifest counts no documents or tokens: nothing to train on")
    for problem in train_problems(prefix, manifest.kind, manifest.eod_id, manifest.pad_id):
        raise BlendError(problem)
    for channel, dtype in layout_of(manifest).channels(prefix, manifest.dtype):
        _check_channel(prefix, channel, dtype.itemsize, manifest)
    return source


def _check_channel(prefix: str, channel: str, itemsize: int, manifest: Manifest) -> None:
    """The files exist, their sizes/counts are the manifest's, and the index is whole (`indexed.check`:
    one pass over the .idx, not the .bin)."""
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(channel + suffix):
            raise BlendError(f"{prefix}: missing {channel + suffix}")
    bin_bytes = os.path.getsize(channel + ".bin")
    if bin_bytes != manifest.tokens * itemsize:
        raise BlendError(
            f"{prefix}: {channel}.bin holds {bin_bytes} bytes, the manifest says {manifest.tokens} "
            f"tokens of {itemsize} bytes: the data was changed after {prefix}.json was written"
        )
    try:
        index = check(channel + ".idx", channel + ".bin")
    except IndexFormatError as exc:
        raise BlendError(f"{prefix}: {exc}") from None
    sequences, documents = index.sequences, index.documents
    if sequences != manifest.sequences or documents != manifest.documents:
        raise BlendError(
            f"{prefix}: {channel}.idx counts {sequences} sequences / {documents} documents, the "
            f"manifest {manifest.sequences} / {manifest.documents}: data and manifest disagree"
        )


def resolve(name: str) -> tuple[str, str]:
    """What a PREFIX|BLEND argument names, the same for every command: ("prefix", PREFIX) when the
    prefix's files are there (a data file's or manifest's name stands for its prefix: out/web.json,
    out/web.bin), whatever a same-named directory beside them holds (megatron-core once kept its index
    cache in out/web/); else ("blend", name) for a blend file: NAME.json, NAME.txt or
    NAME.qwen-data.json, NAME.json also when only its sidecar is there (`--split` blends write none).
    ValueError for a directory or another file; a name that is nothing yet is a prefix, for the
    reader to say what is missing."""
    prefix = strip_suffix(name)
    if any(os.path.isfile(prefix + suffix) for suffix in (".idx", ".bin")):
        return "prefix", prefix
    if name.endswith((".json", ".txt")):
        if os.path.isfile(name) or os.path.isfile(output_paths(name).sidecar):
            return "blend", name
        if not os.path.exists(name):
            raise BlendError(f"{name}: no such blend file, nor a prefix {prefix} (its .bin/.idx)")
    if os.path.isdir(name):
        raise ValueError(f"{name}: a directory, not a prefix (PREFIX.bin/.idx/.json) nor a blend file: name one of "
                         "the outputs in it, DIR/NAME for DIR/NAME.bin")
    if os.path.exists(name):
        raise ValueError(f"{name}: neither a prefix (PREFIX.bin/.idx/.json) nor a blend file (NAME.json, NAME.txt): "
                         "give the -o of a pretrain, sft or merge run, or a blend `qwen-data blend` wrote")
    return "prefix", prefix


# What every source of a blend must share, as (label, getter).
AGREEMENT = (
    ("kind", lambda m: m.kind),
    ("tokenizer sha256", lambda m: m.tokenizer.get("sha256")),
    # Same files, other flavour: a literal <think> is one id to qwen3 and several to qwen2.5.
    ("tokenizer flavour", lambda m: m.tokenizer.get("flavour")),
    ("eod id", lambda m: m.eod_id),
    ("pad id", lambda m: m.pad_id),
    ("chat template", lambda m: m.sft and m.sft.template),
    ("SFT layout", lambda m: m.sft and m.sft.layout),
    ("pai-layout seq length", lambda m: layout_of(m).seq_length if layout_of(m).width_in_format else None),
)


def check_agreement(sources: list[Source]) -> None:
    """Refuse sources whose manifests disagree on kind, tokenizer, eod, pad or template."""
    problems = []
    for label, get in AGREEMENT:
        groups: dict = {}
        for source in sources:
            groups.setdefault(json.dumps(get(source.manifest)), []).append(source.prefix)
        if len(groups) > 1:
            parts = [f"{json.loads(value)!r} ({', '.join(dict.fromkeys(prefixes))})"
                     for value, prefixes in groups.items()]
            problems.append(f"{label}: " + " vs ".join(parts))
    if problems:
        raise BlendError("manifests disagree, these prefixes cannot be trained together:\n  "
                         + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# A weighed blend


# What a blend's ratios are shares of (`--ratio-unit`): data tokens, trained tokens (loss mask 1), or samples.
RATIO_UNITS = ("tokens", "trained-tokens", "samples")


@dataclass
class Entry:
    """A source in one split of the blend: its share in the blend's ratio unit and its Megatron (sample) weight."""

    source: Source
    share: float
    weight: float


@dataclass
class Blend:
    splits: dict[str, list[Entry]]  # "train" always; "valid"/"test" when given
    by: str
    temperature: float | None
    ratio_unit: str
    split: str | None = None
    sources: list[Source] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.sources[0].kind

    def drawn_shares(self, split: str, unit: str) -> list[float]:
        """Each source's share of `unit` that the split's Megatron weights draw (`drawn_shares`)."""
        entries = self.splits[split]
        return drawn_shares([e.source for e in entries], [e.weight for e in entries], unit)

    def megatron_list(self, split: str) -> list[str] | None:
        """`[w1, p1, w2, p2, ...]` (a lone prefix goes unweighted), or None for an absent split."""
        entries = self.splits.get(split)
        if not entries:
            return None
        if len(entries) == 1:
            return [entries[0].source.prefix]
        return [item for e in entries for item in (repr(e.weight), e.source.prefix)]


def drawn_shares(sources: list[Source], weights: list[float], unit: str) -> list[float]:
    """Each source's share of `unit` (one of RATIO_UNITS) over an epoch of a blend drawing samples by
    Megatron's `weights`: samples in proportion to the weights, each SFT sample carrying its source's
    mean tokens of `unit`; pretraining samples all hold seq-length tokens, all trained."""
    if unit == "samples" or sources[0].kind == "pretrain":
        raw = list(weights)
    else:
        raw = [w * s.per_sample(unit) for s, w in zip(sources, weights)]
    total = sum(raw)
    return [r / total if total else 0.0 for r in raw]


# ---------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class BlendPaths:
    """The three files of a blend named NAME.json, NAME.txt or NAME.qwen-data.json."""

    per_split: str
    data_args: str
    sidecar: str


def output_paths(output: str) -> BlendPaths:
    stem = output
    for suffix in (SIDECAR_SUFFIX, ".json", ".txt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return BlendPaths(per_split=stem + ".json", data_args=stem + ".txt", sidecar=stem + SIDECAR_SUFFIX)


def megatron_flags(blend: Blend, paths: BlendPaths) -> list[str]:
    if blend.split is not None:
        return ["--data-args-path", paths.data_args, "--split", blend.split]
    return ["--per-split-data-args-path", paths.per_split]


def sidecar(blend: Blend, paths: BlendPaths) -> dict:
    first = blend.sources[0].manifest
    return {
        "format": BLEND_FORMAT,
        "qwen_data_version": __version__,
        "kind": blend.kind,
        "tokenizer": first.tokenizer,
        "eod_id": first.eod_id,
        "pad_id": first.pad_id,
        "template": first.sft and first.sft.template,
        "layout": first.sft and first.sft.layout,
        "weighting": {"by": blend.by, "temperature": blend.temperature, "ratio_unit": blend.ratio_unit},
        "split": blend.split,
        "splits": {name: _sidecar_entries(blend, name) if name in blend.splits else None for name in SPLITS},
        "megatron_args": megatron_flags(blend, paths),
        "files": {"per_split_data_args": None if blend.split is not None else paths.per_split,
                  "data_args": paths.data_args},
        "command": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _sidecar_entries(blend: Blend, split: str) -> list[dict]:
    """Each source's weight and the shares of tokens and of trained tokens it draws (the share asked is the
    one of `weighting.ratio_unit`)."""
    tokens, trained = blend.drawn_shares(split, "tokens"), blend.drawn_shares(split, "trained-tokens")
    return [{
        "prefix": e.source.prefix,
        "weight": e.weight,
        "token_share": token_share,
        "trained_share": trained_share,
        "fingerprint": e.source.manifest.fingerprint,
        "tokens": e.source.real_tokens,
        "trained_tokens": e.source.trained_tokens,
        "documents": e.source.documents,
        "sequences": e.source.manifest.sequences,
    } for e, token_share, trained_share in zip(blend.splits[split], tokens, trained)]


def write_blend(blend: Blend, output: str) -> BlendPaths:
    """Write the Megatron files and our sidecar (sidecar last: its presence means complete)."""
    paths = output_paths(output)
    ours = {os.path.abspath(p) for p in (paths.per_split, paths.data_args, paths.sidecar)}
    for source in blend.sources:
        if os.path.abspath(source.prefix + ".json") in ours:
            raise BlendError(f"-o {output} would overwrite {source.prefix}.json, the manifest of a source: "
                             "give the blend another name")
    os.makedirs(os.path.dirname(os.path.abspath(paths.sidecar)), exist_ok=True)
    if os.path.exists(paths.sidecar):
        os.remove(paths.sidecar)
    with atomic_file(paths.data_args) as f:
        f.write(" ".join(blend.megatron_list("train")) + "\n")
    if blend.split is None:
        with atomic_file(paths.per_split) as f:
            f.write(json.dumps({name: blend.megatron_list(name) for name in SPLITS}, indent=2) + "\n")
    elif os.path.exists(paths.per_split):
        os.remove(paths.per_split)  # a stale per-split file would silently drop the split
    with atomic_file(paths.sidecar) as f:
        f.write(json.dumps(sidecar(blend, paths), indent=2, ensure_ascii=False) + "\n")
    return paths


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class BlendRecord:
    """A blend as a trainer takes it.

    `splits` holds every name of SPLITS: megatron-core's (prefixes, weights) or None. With
    `per_split` each split is its own blend (NAME.json); without, "train" is one distribution that
    `split` (None: the trainer's choice) cuts. From our sidecar, when there is one: `fingerprints`,
    the sources' manifest fingerprints when the blend was made, by prefix; `ratio_unit`, what the
    blend's ratios were shares of, and `asked`, each train prefix's share of that unit.
    """

    splits: dict[str, MegatronBlend | None]
    per_split: bool
    split: str | None = None
    fingerprints: dict[str, str] = field(default_factory=dict)
    ratio_unit: str | None = None
    asked: dict[str, float] = field(default_factory=dict)


def read_blend(path: str) -> BlendRecord:
    """Read a blend: one of the files `qwen-data blend` writes, or a Megatron blend file.

    The file named decides the meaning, as for Megatron: NAME.json is a per-split blend, NAME.txt
    one distribution (to be cut by a split), NAME.qwen-data.json whatever the blend was written as
    (also used when NAME.json was not written because of --split).
    """
    paths = output_paths(path)
    record = _read_sidecar(paths.sidecar)
    if record is not None and (path.endswith(SIDECAR_SUFFIX) or not os.path.isfile(path)):
        return _from_sidecar(record, paths.sidecar)
    if not os.path.isfile(path):
        raise BlendError(f"{path}: no such blend file (nor {paths.sidecar})")
    made = _as_made(record) if record is not None else {}
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BlendError(f"{path}: not a per-split blend (JSON): {exc}") from None
        return BlendRecord(_per_split_lists(path, data), True, None, **made)
    # Megatron takes the split of a NAME.txt blend from the command line; ours recorded it.
    splits = {"train": blend_from_list(text.split(), path), "valid": None, "test": None}
    return BlendRecord(splits, False, record.get("split") if record else None, **made)


def _read_sidecar(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    if record.get("format") != BLEND_FORMAT:
        raise BlendError(f"{path}: not a {BLEND_FORMAT} record")
    return record


# The sidecar entry's key holding the share asked, by ratio unit ("samples": the weights themselves).
ASKED_KEY = {"tokens": "token_share", "trained-tokens": "trained_share", "samples": "weight"}


def _as_made(record: dict) -> dict:
    """What a sidecar says of the blend when it was made: BlendRecord's fingerprints, ratio_unit, asked."""
    fingerprints = {e["prefix"]: e["fingerprint"] for entries in record["splits"].values() for e in entries or ()}
    unit = (record.get("weighting") or {}).get("ratio_unit")
    train = record["splits"].get("train") or []
    asked = [e.get(ASKED_KEY.get(unit)) for e in train]
    if None in asked or not train:  # a record older than its unit's key
        return {"fingerprints": fingerprints}
    return {"fingerprints": fingerprints, "ratio_unit": unit,
            "asked": {e["prefix"]: a / sum(asked) for e, a in zip(train, asked)}}


def _from_sidecar(record: dict, path: str) -> BlendRecord:
    splits = {}
    for name in SPLITS:
        entries = record["splits"].get(name)
        splits[name] = None if not entries else (
            [e["prefix"] for e in entries], [e["weight"] for e in entries] if len(entries) > 1 else None)
        if splits[name] and splits[name][1]:
            _check_weights(splits[name][0], splits[name][1], path)
    return BlendRecord(splits, record.get("split") is None, record.get("split"), **_as_made(record))


def _per_split_lists(path: str, data: dict) -> dict[str, MegatronBlend | None]:
    missing = [name for name in SPLITS if name not in data]
    if missing:
        raise BlendError(f"{path}: a per-split blend needs keys train, valid, test (missing {missing})")
    return {name: blend_from_list(data[name].split() if isinstance(data[name], str) else data[name],
                                  f"{path} ({name})")
            for name in SPLITS}


def blend_from_list(items, origin: str = "the blend") -> MegatronBlend | None:
    """Megatron's reading of `[w1, p1, ...]` or `[p1, p2, ...]`; weights checked (`origin`: where the
    list comes from, for the refusal)."""
    if not items:
        return None
    items = [str(i) for i in items]
    if len(items) % 2 == 0:
        try:
            weights = [float(w) for w in items[0::2]]
        except ValueError:
            pass
        else:
            prefixes = [p.strip() for p in items[1::2]]
            _check_weights(prefixes, weights, origin)
            return prefixes, weights
    _check_unpaired(items, origin)
    return [p.strip() for p in items], None


def _check_unpaired(items: list[str], origin: str) -> None:
    """A list Megatron would read as prefixes alone, since it does not pair as `weight prefix`,
    yet holding a number that names no prefix: a weight whose prefix is missing or out of place
    (otherwise the refusal would be that the weight has no manifest)."""
    def stray(item: str) -> bool:  # a prefix named like a number is still one
        return _is_number(item) and not os.path.isfile(item + ".json")

    if not any(map(stray, items)):
        return
    shown = " ".join(items) if len(items) <= 8 else " ".join(items[:8]) + " ..."
    if len(items) % 2:
        why = "a weight without its prefix"
    else:  # the first pair that is not a number and then a prefix
        weight, prefix = next((w, p) for w, p in zip(items[0::2], items[1::2]) if stray(p) or not _is_number(w))
        why = f"'{weight} {prefix}' is no such pair"
    raise BlendError(f"{origin}: {len(items)} fields ({shown}) do not pair as `weight prefix`: {why}")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_weights(prefixes: list[str], weights: list, origin: str) -> None:
    """Megatron draws from each prefix in proportion to its weight (and asserts weights > 0): a weight
    that is not a finite number above 0 is refused, naming the prefix."""
    for prefix, weight in zip(prefixes, weights):
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
            raise BlendError(f"{origin}: weight {weight!r} of {prefix}: a blend weight must be a finite number above 0")
