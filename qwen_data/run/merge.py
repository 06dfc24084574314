"""`qwen-data merge`: prefixes joined into one, after checking they were made alike.

The shards of a sharded run (`--shard K/N`, K = 0..N-1) join, in shard order, into exactly the
prefix one run over all the inputs writes: the same .bin/.idx bytes (so the same fingerprint), the
counts and rejects summed, the rejects files concatenated. A sharded `--pack` or `--layout pai` run
leaves its samples as they are (best fit packs over all samples, so it cannot be done in parts) and
the merge packs them and lays them out (`layouts.finish`). Prefixes that are not shards join in the
order given.

Refused, naming the prefix and the field: prefixes of another kind, tokenizer, eod/pad id, dtype or
SFT settings; an incomplete or repeated set of shards, or shards of other inputs; already packed
data and data in the pai layout; an index whose counts disagree with its manifest. (`verify` re-hashes the data itself.)
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

from ..formats.indexed import IndexedDatasetWriter, MaskedWriter, bin_tokens, read_index
from ..formats.layouts import UNPACKED, counts_of, finish, layout_of, trained_tokens
from ..formats.manifest import Manifest, SFTSection, merge_fields
from ..formats.outputs import AtomicOutputs
from .progress import Progress

# Fields of a manifest that say how data was made: equal in every part of a merge.
SETTINGS = merge_fields(Manifest, "same")
SFT_SETTINGS = merge_fields(SFTSection, "same")
SFT_COUNTS = merge_fields(SFTSection, "sum")
BLOCK_TOKENS = 1 << 24  # tokens copied at a time


class MergeError(ValueError):
    pass


def merge(prefixes: list[str], output: str, quiet: bool = False) -> Manifest:
    start = time.monotonic()
    parts = _ordered([(p, Manifest.read(p)) for p in prefixes])
    first = parts[0][1]
    _check_alike(parts)
    sft = first.sft is not None
    finishes = sft and bool(first.sft.pack_on_merge or first.sft.layout_on_merge)
    files = (MaskedWriter.files(output) + (MaskedWriter.files(output + UNPACKED) if finishes else [])
             if sft else [output + ".bin", output + ".idx"])
    rejects_path = output + ".rejects.jsonl"
    with AtomicOutputs(files + [output + ".json", rejects_path]) as outputs:
        progress = Progress(sum(m.tokens for _, m in parts), enabled=not quiet, label="merge ")
        dtype = np.dtype(first.dtype)
        if sft:
            data = MaskedWriter([outputs.tmp(f) for f in MaskedWriter.files(output + (UNPACKED if finishes else ""))],
                                dtype, hash_beside=True)
            writers = [data.ids, data.mask]
        else:
            data = IndexedDatasetWriter(outputs.tmp(output + ".bin"), outputs.tmp(output + ".idx"), dtype,
                                        hash_beside=True)
            writers = [data]
        lengths = np.concatenate([_copy(prefix, m, writers, progress) for prefix, m in parts])
        data.finalize()
        progress.close()
        manifest = _manifest(parts, data, lengths)
        if finishes:
            s = manifest.sft
            counts, manifest.sft = finish(outputs, output, data, lengths, s, s.layout_on_merge or s.layout,
                                          (s.packing or "best-fit") if s.pack_on_merge else None, first.pad_id)
            for name, value in counts.items():
                setattr(manifest, name, value)
        rejected = _join_rejects([p for p, _ in parts], outputs.tmp(rejects_path))
        if not rejected:
            outputs.discard(rejects_path)
        manifest.wall_seconds = round(time.monotonic() - start, 3)
        manifest.write(outputs.tmp(output + ".json"))
        outputs.commit(markers=[output + ".json"])
    return manifest


def _ordered(parts: list[tuple[str, Manifest]]) -> list[tuple[str, Manifest]]:
    """Shards in shard order, once checked to be the whole set of one run; other prefixes as given."""
    shards = [m.shard for _, m in parts]
    if not any(shards):
        return parts
    if not all(shards):
        loose = next(p for p, m in parts if not m.shard)
        raise MergeError(f"{loose} is not a shard, the others are: merge the shards of one run together")
    count = shards[0]["count"]
    indices = sorted(s["index"] for s in shards)
    if any(s["count"] != count for s in shards) or indices != list(range(count)):
        given = ", ".join(f"{s['index']}/{s['count']}" for s in shards)
        raise MergeError(f"the shards given are {given}: "
                         f"a merge needs each of 0/{count} .. {count - 1}/{count} exactly once")
    parts = sorted(parts, key=lambda part: part[1].shard["index"])
    for prefix, m in parts[1:]:
        if m.inputs != parts[0][1].inputs:
            raise MergeError(f"{prefix} is a shard of other inputs than {parts[0][0]}")
    return parts


def _check_alike(parts: list[tuple[str, Manifest]]) -> None:
    base_prefix, base = parts[0]
    for prefix, m in parts:
        layout = layout_of(m)
        if layout.staged:
            raise MergeError(f"{prefix} is {layout.described}, which cannot be joined: run the shards with --shard K/N and the "
                             "same --pack/--layout (they leave their samples for merge to pack and lay out)")
        index = read_index(prefix + ".idx")
        if (index.documents, index.sequences) != (m.documents, m.sequences):
            raise MergeError(f"{prefix}.idx holds {index.documents} documents, {index.sequences} sequences; its "
                             f"manifest says {m.documents}, {m.sequences}")
        differ = [f for f in SETTINGS if getattr(m, f) != getattr(base, f)]
        if m.sft and base.sft:
            differ += [f"sft.{f}" for f in SFT_SETTINGS if getattr(m.sft, f) != getattr(base.sft, f)]
        if differ:
            field = differ[0]
            mine, theirs = (_field(x, field) for x in (m, base))
            raise MergeError(f"{prefix} and {base_prefix} were made differently: {field} {mine!r} vs {theirs!r}"
                             + (f" (and {', '.join(differ[1:])})" if differ[1:] else ""))


def _field(m: Manifest, name: str):
    return getattr(m.sft, name[4:]) if name.startswith("sft.") else getattr(m, name)


def _copy(prefix: str, manifest: Manifest, writers: list, progress: Progress) -> np.ndarray:
    """Append every document of `prefix` to the writers (one per channel of its layout); its sequence lengths."""
    channels = [(writer, bin_tokens(name + ".bin", dtype))
                for writer, (name, dtype) in zip(writers, layout_of(manifest).channels(prefix, writers[0].dtype))]
    index = read_index(prefix + ".idx")
    lengths = np.asarray(index.lengths, dtype=np.int64)
    bounds = np.asarray(index.document_indices)  # each document's first sequence, and the end
    starts = np.concatenate([[0], np.cumsum(lengths)])[bounds]  # each document's first token, and the end
    document = 0
    while document < index.documents:  # whole documents, about BLOCK_TOKENS at a time
        last = int(np.searchsorted(starts, starts[document] + BLOCK_TOKENS, side="right")) - 1
        last = min(max(last, document + 1), index.documents)
        low, high = int(starts[document]), int(starts[last])
        for writer, tokens in channels:
            writer.add_batch(tokens[low:high], lengths[bounds[document]:bounds[last]], np.diff(bounds[document:last + 1]))
        progress.update(last - document, 0, high - low, high - low)
        document = last
    return lengths


def _manifest(parts: list[tuple[str, Manifest]], data, lengths: np.ndarray) -> Manifest:
    first = parts[0][1]
    ids = data.ids if isinstance(data, MaskedWriter) else data
    digests = data.digests if isinstance(data, MaskedWriter) else [data.digests]
    by_reason: dict[str, int] = {}
    for _, m in parts:
        for reason, n in m.rejects.get("by_reason", {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    sharded = bool(first.shard)
    inputs = first.inputs if sharded else [i for _, m in parts for i in m.inputs]
    sft = None
    if first.sft is not None:
        sft = first.sft.replace(**{k: sum(getattr(m.sft, k) for _, m in parts) for k in SFT_COUNTS},
                                trained_tokens=trained_tokens(data))
    special = None if first.special_token_records is None else sum(m.special_token_records for _, m in parts)
    return Manifest(
        kind=first.kind, tokenizer=first.tokenizer, eod_id=first.eod_id, eod_token=first.eod_token,
        pad_id=first.pad_id, text_key=first.text_key, special_tokens=first.special_tokens,
        special_token_records=special, **counts_of(ids, digests), sft=sft, inputs=inputs,
        rejects={"count": sum(by_reason.values()), "by_reason": dict(sorted(by_reason.items()))},
    )


def _join_rejects(prefixes: list[str], out_path: str) -> bool:
    """Concatenate the parts' rejects files; whether there were any."""
    found = False
    with open(out_path, "wb") as out:
        for prefix in prefixes:
            path = prefix + ".rejects.jsonl"
            if os.path.exists(path):
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
                found = True
    return found
