"""`qwen-data blend`: weighted prefixes → the blend files Megatron-LM reads unchanged.

    qwen-data blend out/web=0.7 out/code=0.3 -o out/pretrain_blend.json
    qwen-data blend out/chat out/tools --by tokens --valid out/chat_val -o out/sft_blend.json
    qwen-data blend out/web out/code --temperature 2 --split 98,2,0 -o out/blend.json

Outputs, for `-o NAME.json`:
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

Weights. `P=w` gives ratios (`--by ratio`, the default when weights are given); `--by tokens`
(the default without weights) weighs each source by its token count from the manifest, so every
source is consumed at the same rate; `--temperature T` weighs by tokens**(1/T) (T=1 is
`--by tokens`, larger T flattens the mix towards uniform). Ratios mean shares of training *tokens*.
Megatron's weights mean shares of *samples*: for pretraining (every sample is seq-length tokens)
the two are the same; for SFT (one sample = one conversation or packed row) each weight is
divided by the source's mean real tokens per sample, so a 0.7 share of tokens stays 0.7 whatever
the sources' conversation lengths. `--ratio-unit samples` writes ratios as sample weights unchanged.

Prefixes are written as given (relative ones resolve against the training job's working
directory, as in Megatron); `--absolute` writes absolute paths.

Checks, before anything is written: every prefix has `.bin`, `.idx`, `.json` (and
`.lossmask.bin/.idx` for SFT) whose sizes match its manifest; all manifests agree on kind,
tokenizer (sha256), eod id, pad id and chat template; otherwise the refusal names the disagreeing
prefixes.

Budget: `--train-tokens N`, `--train-samples N --seq-length S`, or `--train-iters I
--global-batch-size B --seq-length S` prints how many samples, tokens and epochs of each train
source the run consumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field

from . import __version__
from .indexed import IndexFormatError, read_index
from .outputs import atomic_file, read_manifest

BLEND_FORMAT = "qwen-data/blend/1"
SIDECAR_SUFFIX = ".qwen-data.json"
SPLITS = ("train", "valid", "test")
_ITEMSIZE = {"int32": 4, "uint16": 2, "int64": 8, "uint8": 1}


class BlendError(ValueError):
    """A blend that cannot be written or read; the message says which prefixes and why."""


# ---------------------------------------------------------------------------------------------
# Sources


@dataclass
class Source:
    """One prefix of a blend and its manifest; `ratio` is the user's weight, if any."""

    prefix: str
    manifest: dict
    ratio: float | None = None

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def documents(self) -> int:
        return int(self.manifest["documents"])

    @property
    def real_tokens(self) -> int:
        """Data tokens, packing pad excluded."""
        sft = self.manifest.get("sft") or {}
        return int(self.manifest["tokens"]) - int(sft.get("pad_tokens") or 0)

    @property
    def tokens_per_sample(self) -> float | None:
        """Mean real tokens per sample for SFT (one sample = one document); None for pretraining."""
        return self.real_tokens / self.documents if self.kind == "sft" else None


def parse_spec(text: str) -> tuple[str, float | None]:
    """`PREFIX=W` or `PREFIX` → (prefix, weight or None)."""
    prefix, sep, weight = text.rpartition("=")
    if sep:
        try:
            value = float(weight)
        except ValueError:
            return text, None
        if not (value > 0 and math.isfinite(value)):
            raise BlendError(f"{text}: weights must be positive numbers")
        return prefix, value
    return text, None


def strip_suffix(path: str) -> str:
    """Accept a data file's name for its prefix (`out/web.bin` → `out/web`)."""
    for suffix in (".lossmask.bin", ".lossmask.idx", ".bin", ".idx", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def load_source(prefix: str, ratio: float | None = None) -> Source:
    """Read a prefix's manifest and check its files are there and match it."""
    if not prefix or any(c.isspace() for c in prefix):
        raise BlendError(f"{prefix!r}: prefixes must be non-empty and free of whitespace "
                         "(Megatron splits blend files on whitespace)")
    try:
        manifest = read_manifest(prefix)
    except FileNotFoundError as exc:
        raise BlendError(str(exc)) from None
    except (ValueError, OSError) as exc:
        raise BlendError(f"{prefix}: unreadable manifest: {exc}") from None
    source = Source(prefix, manifest, ratio)
    if source.kind not in ("pretrain", "sft"):
        raise BlendError(f"{prefix}: unknown kind {source.kind!r} in {prefix}.json")
    if source.documents <= 0 or source.real_tokens <= 0:
        raise BlendError(f"{prefix}: the manifest counts no documents or tokens: nothing to train on")
    itemsize = _ITEMSIZE.get(manifest.get("dtype", "int32"))
    if itemsize is None:
        raise BlendError(f"{prefix}: unknown dtype {manifest.get('dtype')!r}")
    channels = [(prefix, itemsize)]
    if source.kind == "sft":
        channels.append((prefix + ".lossmask", 1))
    for channel, size in channels:
        _check_channel(prefix, channel, size, manifest)
    return source


def _check_channel(prefix: str, channel: str, itemsize: int, manifest: dict) -> None:
    """The files exist and their sizes/counts are the manifest's (cheap: headers and sizes only)."""
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(channel + suffix):
            raise BlendError(f"{prefix}: missing {channel + suffix}")
    bin_bytes = os.path.getsize(channel + ".bin")
    if bin_bytes != int(manifest["tokens"]) * itemsize:
        raise BlendError(
            f"{prefix}: {channel}.bin holds {bin_bytes} bytes, the manifest says {manifest['tokens']} "
            f"tokens of {itemsize} bytes: the data was changed after {prefix}.json was written"
        )
    try:
        index = read_index(channel + ".idx")
    except IndexFormatError as exc:
        raise BlendError(f"{prefix}: {exc}") from None
    sequences, documents = index.sequences, index.documents
    if sequences != int(manifest["sequences"]) or documents != int(manifest["documents"]):
        raise BlendError(
            f"{prefix}: {channel}.idx counts {sequences} sequences / {documents} documents, the "
            f"manifest {manifest['sequences']} / {manifest['documents']}: data and manifest disagree"
        )


# What every source of a blend must share, as (label, getter).
AGREEMENT = (
    ("kind", lambda m: m["kind"]),
    ("tokenizer sha256", lambda m: (m.get("tokenizer") or {}).get("sha256")),
    # Same files, other flavour: a literal <think> is one id to qwen3 and several to qwen2.5.
    ("tokenizer flavour", lambda m: (m.get("tokenizer") or {}).get("flavour")),
    ("eod id", lambda m: m.get("eod_id")),
    ("pad id", lambda m: m.get("pad_id")),
    ("chat template", lambda m: (m.get("sft") or {}).get("template")),
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
# Weights


def token_shares(sources: list[Source], by: str, temperature: float | None) -> list[float]:
    """Each source's share of training tokens (sums to 1)."""
    if by == "ratio":
        raw = [s.ratio for s in sources]
    else:
        exponent = 1.0 / (temperature or 1.0)
        raw = [float(s.real_tokens) ** exponent for s in sources]
    total = sum(raw)
    return [r / total for r in raw]


def megatron_weights(sources: list[Source], shares: list[float], ratio_unit: str = "tokens") -> list[float]:
    """Sample weights (what Megatron's blend weights mean) for token shares, normalised."""
    if ratio_unit == "samples" or sources[0].kind == "pretrain":
        raw = list(shares)  # pretraining samples are all seq-length tokens: tokens ∝ samples
    else:
        raw = [share / s.tokens_per_sample for s, share in zip(sources, shares)]
    total = sum(raw)
    # 12 digits: what the blend files carry, so our record and Megatron's reading agree exactly.
    return [float(f"{r / total:.12g}") for r in raw]


def parse_split(split: str) -> list[float]:
    """Megatron's `--split` reading: the numbers in the string, padded to 3, normalised."""
    values = [float(v) for v in re.findall(r"[.0-9]+", split)]
    if not values or len(values) > 3:
        raise BlendError(f"--split {split!r}: expected up to 3 numbers like 98,2,0")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    if total <= 0 or values[0] <= 0:
        raise BlendError(f"--split {split!r}: the train part must be positive")
    return [v / total for v in values]


@dataclass
class Entry:
    """A source in one split of the blend: its token share and its Megatron (sample) weight."""

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

    def megatron_list(self, split: str) -> list[str] | None:
        """`[w1, p1, w2, p2, ...]` (a lone prefix goes unweighted), or None for an absent split."""
        entries = self.splits.get(split)
        if not entries:
            return None
        if len(entries) == 1:
            return [entries[0].source.prefix]
        return [item for e in entries for item in (repr(e.weight), e.source.prefix)]


def plan_blend(
    train: list[str],
    valid: list[str] = (),
    test: list[str] = (),
    *,
    by: str | None = None,
    temperature: float | None = None,
    ratio_unit: str = "tokens",
    split: str | None = None,
    absolute: bool = False,
) -> Blend:
    """Read and check every source, then weigh each split."""
    if not train:
        raise BlendError("no train prefixes given")
    if split is not None and (valid or test):
        raise BlendError("--split and --valid/--test exclude each other (as in Megatron-LM): "
                         "either cut every prefix by --split, or name separate validation prefixes")
    if split is not None:
        parse_split(split)
    if temperature is not None:
        if not temperature > 0:
            raise BlendError("--temperature must be positive")
        if by == "ratio":
            raise BlendError("--temperature weighs by token counts; it cannot be used with --by ratio")
        by = "tokens"
    specs = {name: [parse_spec(text) for text in texts]
             for name, texts in zip(SPLITS, (train, valid, test))}
    chosen: dict[str, tuple[str, list[Source]]] = {}
    for name, items in specs.items():
        if not items:
            continue
        given = [w is not None for _, w in items]
        if len(items) == 1:  # a lone prefix takes the whole split, whatever the weighting
            split_by, items = "tokens", [(items[0][0], None)]
        else:
            if any(given) and by == "tokens":
                raise BlendError(f"{name}: weights (PREFIX=W) and --by tokens/--temperature exclude each other")
            # Validation/test prefixes without weights mirror their natural (token) mix.
            split_by = "ratio" if any(given) or (by == "ratio" and name == "train") else "tokens"
            if split_by == "ratio" and not all(given):
                missing = [p for p, w in items if w is None]
                raise BlendError(f"{name}: --by ratio needs a weight for every prefix (PREFIX=W); "
                                 f"none for {', '.join(missing)}")
        sources = []
        for prefix, ratio in items:
            prefix = strip_suffix(prefix)
            source = load_source(prefix, ratio)
            if absolute:
                source.prefix = os.path.abspath(prefix)
            sources.append(source)
        seen = [s.prefix for s in sources]
        duplicates = sorted({p for p in seen if seen.count(p) > 1})
        if duplicates:
            raise BlendError(f"{name}: prefix given twice: {', '.join(duplicates)}")
        chosen[name] = (split_by, sources)
    everything = [s for _, sources in chosen.values() for s in sources]
    check_agreement(everything)  # before weighing: SFT and pretraining weights differ in meaning
    splits: dict[str, list[Entry]] = {}
    for name, (split_by, sources) in chosen.items():
        shares = token_shares(sources, split_by, temperature)
        weights = megatron_weights(sources, shares, ratio_unit)
        splits[name] = [Entry(s, sh, w) for s, sh, w in zip(sources, shares, weights)]
    train_by = by or ("ratio" if any(w is not None for _, w in specs["train"]) else "tokens")
    return Blend(splits, train_by, temperature, ratio_unit, split, everything)


# ---------------------------------------------------------------------------------------------
# Outputs


def output_paths(output: str) -> dict[str, str]:
    """NAME.json → the per-split JSON, the data-args text file and our sidecar."""
    stem = output
    for suffix in (SIDECAR_SUFFIX, ".json", ".txt"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return {"per_split": stem + ".json", "data_args": stem + ".txt", "sidecar": stem + SIDECAR_SUFFIX}


def megatron_flags(blend: Blend, paths: dict[str, str]) -> list[str]:
    if blend.split is not None:
        return ["--data-args-path", paths["data_args"], "--split", blend.split]
    return ["--per-split-data-args-path", paths["per_split"]]


def sidecar(blend: Blend, paths: dict[str, str]) -> dict:
    first = blend.sources[0].manifest
    return {
        "format": BLEND_FORMAT,
        "qwen_data_version": __version__,
        "kind": blend.kind,
        "tokenizer": first.get("tokenizer"),
        "eod_id": first.get("eod_id"),
        "pad_id": first.get("pad_id"),
        "template": (first.get("sft") or {}).get("template"),
        "weighting": {"by": blend.by, "temperature": blend.temperature, "ratio_unit": blend.ratio_unit},
        "split": blend.split,
        "splits": {
            name: [
                {
                    "prefix": e.source.prefix,
                    "weight": e.weight,
                    "token_share": e.share,
                    "fingerprint": e.source.manifest.get("fingerprint"),
                    "tokens": e.source.real_tokens,
                    "documents": e.source.documents,
                    "sequences": int(e.source.manifest["sequences"]),
                }
                for e in blend.splits[name]
            ] if name in blend.splits else None
            for name in SPLITS
        },
        "megatron_args": megatron_flags(blend, paths),
        "files": {"per_split_data_args": None if blend.split is not None else paths["per_split"],
                  "data_args": paths["data_args"]},
        "command": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _write_atomic(path: str, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def write_blend(blend: Blend, output: str) -> dict[str, str]:
    """Write the Megatron files and our sidecar (sidecar last: its presence means complete)."""
    paths = output_paths(output)
    directory = os.path.dirname(os.path.abspath(paths["sidecar"]))
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(paths["sidecar"]):
        os.remove(paths["sidecar"])
    _write_atomic(paths["data_args"], " ".join(blend.megatron_list("train")) + "\n")
    if blend.split is None:
        per_split = {name: blend.megatron_list(name) for name in SPLITS}
        _write_atomic(paths["per_split"], json.dumps(per_split, indent=2) + "\n")
    elif os.path.exists(paths["per_split"]):
        os.remove(paths["per_split"])  # a stale per-split file would silently drop the split
    _write_atomic(paths["sidecar"], json.dumps(sidecar(blend, paths), indent=2, ensure_ascii=False) + "\n")
    return paths


def read_blend(path: str) -> dict:
    """Read a blend: one of the files `qwen-data blend` writes, or a Megatron blend file.

    The file named decides the meaning, as for Megatron: NAME.json is a per-split blend, NAME.txt
    one distribution (to be cut by a split), NAME.qwen-data.json whatever the blend was written as
    (also used when NAME.json was not written because of --split). Returns {"splits": {"train":
    ([prefixes], [weights] | None), "valid": ... | None, "test": ... | None}, "per_split": bool,
    "split": str | None, "fingerprints": {prefix: fingerprint} (empty without our record)}.
    """
    paths = output_paths(path)
    record = None
    if os.path.isfile(paths["sidecar"]):
        with open(paths["sidecar"], encoding="utf-8") as f:
            record = json.load(f)
        if record.get("format") != BLEND_FORMAT:
            raise BlendError(f"{paths['sidecar']}: not a {BLEND_FORMAT} record")
    fingerprints = {}
    if record is not None:
        for entries in record["splits"].values():
            fingerprints.update({e["prefix"]: e["fingerprint"] for e in entries or ()})
    if record is not None and (path.endswith(SIDECAR_SUFFIX) or not os.path.isfile(path)):
        splits = {}
        for name in SPLITS:
            entries = record["splits"].get(name)
            splits[name] = None if not entries else (
                [e["prefix"] for e in entries], [e["weight"] for e in entries] if len(entries) > 1 else None)
        return {"splits": splits, "per_split": record.get("split") is None, "split": record.get("split"),
                "fingerprints": fingerprints}
    if not os.path.isfile(path):
        raise BlendError(f"{path}: no such blend file (nor {paths['sidecar']})")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        data = json.loads(text)
        missing = [name for name in SPLITS if name not in data]
        if missing:
            raise BlendError(f"{path}: a per-split blend needs keys train, valid, test (missing {missing})")
        splits = {name: blend_from_list(data[name].split() if isinstance(data[name], str) else data[name])
                  for name in SPLITS}
        return {"splits": splits, "per_split": True, "split": None, "fingerprints": fingerprints}
    # Megatron takes the split of a NAME.txt blend from the command line; ours recorded it.
    return {"splits": {"train": blend_from_list(text.split()), "valid": None, "test": None},
            "per_split": False, "split": record.get("split") if record else None, "fingerprints": fingerprints}


def blend_from_list(items) -> tuple[list[str], list[float] | None] | None:
    """Megatron's reading of `[w1, p1, ...]` or `[p1, p2, ...]`."""
    if not items:
        return None
    items = [str(i) for i in items]
    if len(items) % 2 == 0:
        try:
            weights = [float(w) for w in items[0::2]]
            return [p.strip() for p in items[1::2]], weights
        except ValueError:
            pass
    return [p.strip() for p in items], None


# ---------------------------------------------------------------------------------------------
# Budget


@dataclass
class Budget:
    """What the run consumes: either data tokens in total, or samples (× seq length)."""

    tokens: int | None = None
    samples: int | None = None
    seq_length: int | None = None


def budget_rows(blend: Blend, budget: Budget) -> list[dict]:
    """Per train source: samples and tokens the run takes, and how many epochs that is."""
    fraction = parse_split(blend.split)[0] if blend.split else 1.0
    rows = []
    for e in blend.splits["train"]:
        s = e.source
        available_tokens = s.real_tokens * fraction
        available_samples = s.documents * fraction
        if budget.tokens is not None:
            tokens = budget.tokens * e.share
            per_sample = s.tokens_per_sample or budget.seq_length
            samples = tokens / per_sample if per_sample else None
        else:
            samples = budget.samples * e.weight
            tokens = samples * (s.tokens_per_sample or budget.seq_length)
        if s.kind == "sft":
            epochs = samples / available_samples
        else:
            epochs = tokens / available_tokens
        rows.append({"prefix": s.prefix, "weight": e.weight, "share": e.share,
                     "available_tokens": available_tokens, "samples": samples,
                     "tokens": tokens, "epochs": epochs})
    return rows


def format_budget(rows: list[dict], approximate: bool) -> list[str]:
    columns = [("source", "<", lambda r: r["prefix"]),
               ("weight", ">", lambda r: f"{r['weight']:.4f}"),
               ("tokens%", ">", lambda r: f"{100 * r['share']:.2f}%"),
               ("tokens avail" + (" (≈)" if approximate else ""), ">", lambda r: f"{r['available_tokens']:,.0f}"),
               ("samples", ">", lambda r: "-" if r["samples"] is None else f"{r['samples']:,.0f}"),
               ("tokens used", ">", lambda r: f"{r['tokens']:,.0f}"),
               ("epochs", ">", lambda r: f"{r['epochs']:.3f}")]
    cells = [[title for title, _, _ in columns]] + [[get(r) for _, _, get in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(f"{cell:{align}{w}}" for cell, (_, align, _), w in zip(row, columns, widths)).rstrip()
             for row in cells]
    lines += [f"note: {r['prefix']} is repeated {r['epochs']:.2f} times" for r in rows if r["epochs"] > 1]
    return lines


# ---------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("train", nargs="+", metavar="PREFIX[=W]",
                        help="train prefixes, each optionally with a weight (out/web=0.7)")
    parser.add_argument("-o", "--output", default="out/blend.json",
                        help="NAME.json: writes NAME.json (--per-split-data-args-path), NAME.txt "
                             "(--data-args-path) and NAME.qwen-data.json (our record); default out/blend.json")
    parser.add_argument("--by", choices=["ratio", "tokens"], default=None,
                        help="weights from the PREFIX=W ratios (default when given) or from the "
                             "manifests' token counts (default otherwise)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="weigh by tokens**(1/T): 1 = by tokens, larger flattens towards uniform")
    parser.add_argument("--ratio-unit", choices=["tokens", "samples"], default="tokens",
                        help="what ratios are shares of: training tokens (default; converted to "
                             "Megatron's per-sample weights for SFT) or samples (written unchanged)")
    parser.add_argument("--valid", nargs="+", default=[], metavar="PREFIX[=W]",
                        help="separate validation prefixes (per-split blend)")
    parser.add_argument("--test", nargs="+", default=[], metavar="PREFIX[=W]",
                        help="separate test prefixes (per-split blend)")
    parser.add_argument("--split", default=None,
                        help="cut every prefix like Megatron's --split (e.g. 98,2,0); writes no per-split JSON")
    parser.add_argument("--absolute", action="store_true", help="write absolute prefix paths")
    parser.add_argument("--train-tokens", type=int, default=None, help="budget: data tokens the run trains on")
    parser.add_argument("--train-samples", type=int, default=None, help="budget: samples (with --seq-length)")
    parser.add_argument("--train-iters", type=int, default=None, help="budget: iterations (with --global-batch-size)")
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--seq-length", type=int, default=None)


def budget_from_args(args) -> Budget | None:
    if args.train_iters is not None or args.global_batch_size is not None:
        if args.train_iters is None or args.global_batch_size is None:
            raise BlendError("--train-iters and --global-batch-size go together")
        if args.train_samples is not None or args.train_tokens is not None:
            raise BlendError("give one budget: --train-tokens, --train-samples or --train-iters")
        samples = args.train_iters * args.global_batch_size
    elif args.train_samples is not None:
        if args.train_tokens is not None:
            raise BlendError("give one budget: --train-tokens, --train-samples or --train-iters")
        samples = args.train_samples
    elif args.train_tokens is not None:
        return Budget(tokens=args.train_tokens, seq_length=args.seq_length)
    else:
        return None
    return Budget(samples=samples, seq_length=args.seq_length)


def run(args) -> int:
    budget = budget_from_args(args)
    blend = plan_blend(args.train, args.valid, args.test, by=args.by, temperature=args.temperature,
                       ratio_unit=args.ratio_unit, split=args.split, absolute=args.absolute)
    if budget is not None and budget.samples is not None and blend.kind == "pretrain" and not budget.seq_length:
        raise BlendError("a budget in samples or iterations needs --seq-length for pretraining data")
    paths = write_blend(blend, args.output)
    print(f"{blend.kind} blend of {len(blend.splits['train'])} train source(s), weights by {blend.by}"
          + (f" (temperature {blend.temperature:g})" if blend.temperature else ""))
    for name in SPLITS:
        for e in blend.splits.get(name) or ():
            print(f"  {name:<5}  {e.source.prefix}  weight {e.weight:.4f}  tokens {100 * e.share:.2f}%  "
                  f"({e.source.real_tokens:,} tokens, {e.source.documents:,} documents)")
    written = [paths["data_args"], paths["sidecar"]] + ([paths["per_split"]] if blend.split is None else [])
    print("wrote " + ", ".join(sorted(written)))
    print("Megatron-LM flags: " + " ".join(megatron_flags(blend, paths)))
    if blend.split is None and "valid" not in blend.splits:
        print("note: no validation data (give --valid PREFIX ... or --split 98,2,0)")
    train = {e.source.prefix for e in blend.splits["train"]}
    for name in ("valid", "test"):
        shared = [e.source.prefix for e in blend.splits.get(name) or () if e.source.prefix in train]
        if shared:
            print(f"warning: {name} prefixes also trained on: {', '.join(shared)}")
    if budget is not None:
        for line in format_budget(budget_rows(blend, budget), approximate=blend.split is not None):
            print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen-data blend", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"qwen-data blend: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
