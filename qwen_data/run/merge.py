"""`qwen-data merge`: prefixes joined into one, after checking they were made alike.

The shards of a sharded run (`--shard K/N`, K = 0..N-1) join, in shard order, into exactly the
prefix one run over all the inputs writes: the same .bin/.idx bytes (so the same fingerprint), the
counts and rejects summed, the rejects files concatenated. A sharded `--pack` or `--layout pai` run
leaves its samples as they are (best fit packs over all samples, so it cannot be done in parts) and
the merge packs them and lays them out (`layouts.finish`). Prefixes that are not shards join in the
order given.

Refused, naming the prefix and the field: prefixes of another kind, tokenizer (its files' content
and flavour: not where they lay, nor the backend), eod/pad id, dtype or SFT settings; an incomplete
or repeated set of shards, shards of other inputs or of an input that changed between them (the pins
their manifests record differ: `manifest.input_entry`); already packed data and data in the pai layout.
Refused before anything is written (`formats.claims`): an output that is a file of a part, or an
existing file that is not an earlier merge's or run's output of this kind at this prefix.
Refused, naming the file: a part whose index is malformed or disagrees with its manifest, whose
.bin is not the size its manifest says, or whose .idx no longer hashes as its manifest says. No .bin
byte is read: the output's hash is the parts' recorded hashes joined (`formats.digest`), so a part
changed after it was made gives an output that fails `verify`, never one that vouches for the change.
(Parts made before those hashes are read back once copied and checked against their sha256.) The
counts of the output are the parts' manifests' (trained tokens included).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..certify.checks import join_certificates, refuse_mismatches
from ..formats.digest import bin_hash, join, sha256_of
from ..formats.indexed import (HASH_BLOCK, Index, IndexFormatError, MaskedWriter, check_same_index, join_indexes,
                               read_index)
from ..formats.layouts import UNPACKED, check_offsets, counts_of, finish, index_tokens, layout_of
from ..formats.claims import check as check_outputs
from ..formats.claims import dataset_owner
from ..formats.manifest import Manifest, SFTSection, describe_input, fingerprint, merge_fields, pins_differ
from ..formats.outputs import AtomicOutputs, atomic_file
from ..text.tokenizer import IDS_IDENTITY
from .progress import Progress

# Fields of a manifest that say how data was made: equal in every part of a merge.
SETTINGS = merge_fields(Manifest, "same")
SFT_SETTINGS = merge_fields(SFTSection, "same")
SFT_COUNTS = merge_fields(SFTSection, "sum")
COPY_BYTES = 1 << 30  # asked of copy_file_range at a time
# 16 parts of 530 MB into one file, in the page cache, a 16-core host: 1 thread 2.42-2.94 s, 2 threads 2.44 s,
# 4 threads 2.74 s, 16 threads 3.31 s and 44.6 s of system CPU (bench/results/cpu/2026-12-01g/merge-copy.log).
COPY_THREADS = 2
PARTS_SUFFIX = ".parts"  # beside a Head's file: the parts it holds, a line each (name relative to its folder, size)
# Threads removing a consuming Head's parts once copied. Removing a file waits for whatever of it the kernel is
# writing back at that moment, which it does once the page cache holds more dirty pages than its background
# threshold (8-23 ms a 34 MB part on a 2-core machine's disk, 1.7-2.8 ms otherwise). The copying thread removed
# each part itself, and a 16-core host's 16 GB Ray run left 3.1-4.3 s of copying after its tasks on the disk,
# 0.7 s in memory (tmpfs, nothing written back): bench/results/cpu/2026-12-03g.
REMOVERS = 4


class MergeError(ValueError):
    pass


def merge(prefixes: list[str], output: str, quiet: bool = False, heads: list["Head"] | None = None,
          reads: "PartReads | None" = None) -> Manifest:
    """`heads`: for each channel of the parts (ids; ids and loss mask for SFT), the first parts' .bin files
    already copied into one (`Head`), taken as the start of the output's. `reads`: the parts' small files
    read ahead (`PartReads.prepare`, as a Ray run's parts end)."""
    start = time.monotonic()
    reads = reads or PartReads()
    parts = _ordered([(p, reads.manifest(p)) for p in prefixes])
    first = parts[0][1]
    # (the parts handed to the heads so far: their copies go on while the parts are checked and indexed)
    _check_alike(parts, {name for head in heads or [] for name, _ in head.parts}, reads)
    try:  # a part's recorded mismatch is refused before anything is written
        refuse_mismatches([(p, m.certificate) for p, m in parts])
    except ValueError as exc:
        raise MergeError(str(exc)) from None
    sft = first.sft is not None
    finishes = sft and bool(first.sft.pack_on_merge or first.sft.layout_on_merge)
    files = (MaskedWriter.files(output) + (MaskedWriter.files(output + UNPACKED) if finishes else [])
             if sft else [output + ".bin", output + ".idx"])
    rejects_path = output + ".rejects.jsonl"
    files += [output + ".json", rejects_path]
    check_outputs(files, [path for prefix, m in parts for path in _files(prefix, m)],
                  dataset_owner([output], first.kind), remedy="merge into another prefix")
    with AtomicOutputs(files) as outputs:
        progress = Progress(sum(m.tokens for _, m in parts), enabled=not quiet, label="merge ")
        target = output + (UNPACKED if finishes else "")
        paths = MaskedWriter.files(target) if sft else [target + ".bin", target + ".idx"]
        channels, lengths = _join(parts, [outputs.tmp(p) for p in paths], np.dtype(first.dtype), progress, heads,
                                  reads)
        progress.close()
        manifest = _manifest(parts, channels)
        if finishes:
            counts, manifest.sft = finish(outputs, output, UnpackedSamples(*channels), lengths, manifest.sft,
                                          first.pad_id)
            for name, value in counts.items():
                setattr(manifest, name, value)
        manifest.certificate = join_certificates([(p, m.certificate) for p, m in parts], manifest.fingerprint)
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
    _check_spans(parts)
    base_prefix, base = parts[0]
    for prefix, m in parts[1:]:
        if [i["path"] for i in m.inputs] != [i["path"] for i in base.inputs]:
            raise MergeError(f"{prefix} is a shard of other inputs than {base_prefix}")
        for theirs, mine in zip(base.inputs, m.inputs):
            if pins_differ(theirs, mine):
                raise MergeError(f"{mine['path']} changed between the shards: {base_prefix} read it at "
                                 f"{describe_input(theirs)}, {prefix} at {describe_input(mine)}; joined, records "
                                 "would be repeated or lost: make every shard again from the file as it is now")
    return parts


def _check_spans(parts: list[tuple[str, Manifest]]) -> None:
    """Shards with spans of bytes (`Shard.span`: the Ray executor's parts) must lay them end to end from the
    inputs' first byte to their last: records would be lost or repeated otherwise."""
    spans = [m.shard.get("span") for _, m in parts]
    if not any(spans):
        return
    at = 0
    for (prefix, _), span in zip(parts, spans):
        if span is None or span[0] != at:
            where = "none are named" if span is None else f"they are {span[0]:,}-{span[1]:,}"
            raise MergeError(f"{prefix}: its shard's bytes of the inputs do not start where the shard before it "
                             f"stopped, at {at:,} ({where}): records would be lost or repeated")
        at = span[1]
    sizes = [i.get("bytes") for i in parts[0][1].inputs]
    if None not in sizes and at != sum(sizes):
        raise MergeError(f"{parts[-1][0]}: the shards stop at byte {at:,} of the inputs' {sum(sizes):,}: records "
                         "would be lost")


def _files(prefix: str, m: Manifest) -> list[str]:
    """The files of a part that the merge reads."""
    return [name + ext for name, _ in layout_of(m).channels(prefix, m.dtype) for ext in (".bin", ".idx")] + [
        prefix + ".json", prefix + ".rejects.jsonl"]


def _check_alike(parts: list[tuple[str, Manifest]], held: set[str], reads: "PartReads") -> None:
    """`held`: the parts (NAME of NAME.bin) a head holds, whose .bin may be gone."""
    base_prefix, base = parts[0]
    settings = _settings(base)
    for prefix, m in parts:
        layout = layout_of(m)
        if layout.lays_out_rows:
            raise MergeError(f"{prefix} is {layout.described}, which cannot be joined: run the shards with --shard K/N "
                             "and the same --pack/--layout (they leave their samples for merge to pack and lay out)")
        mine = _settings(m)
        differ = [name for name in settings if mine.get(name) != settings[name]]
        if differ:
            field = differ[0]
            raise MergeError(f"{prefix} and {base_prefix} were made differently: {field} {mine.get(field)!r} vs "
                             f"{settings[field]!r}" + (f" (and {', '.join(differ[1:])})" if differ[1:] else ""))
        _check_files(prefix, m, held, reads)


def _settings(m: Manifest) -> dict:
    """What must be equal in every part, by the name a refusal gives it."""
    found = {name: getattr(m, name) for name in SETTINGS if name != "tokenizer"}
    found |= {f"tokenizer.{name}": m.tokenizer.get(name) for name in IDS_IDENTITY}
    if m.sft:
        found |= {f"sft.{name}": getattr(m.sft, name) for name in SFT_SETTINGS}
    return found


def _check_files(prefix: str, m: Manifest, held: set[str], reads: "PartReads") -> None:
    """The part's files can be copied by its index: each index well formed and holding the manifest's
    counts, each .bin the size the manifest says (their bytes are checked as they are copied)."""
    for name, dtype in layout_of(m).channels(prefix, m.dtype):
        try:
            index = reads.index(name + ".idx")
        except IndexFormatError as exc:
            raise MergeError(f"{exc}; {_remedy(prefix)}") from None
        problems = []
        if (index.documents, index.sequences, index.dtype) != (m.documents, m.sequences, dtype):
            problems.append(f"{index.path} holds {index.documents} documents, {index.sequences} sequences of "
                            f"{index.dtype}; {prefix}.json says {m.documents}, {m.sequences} of {dtype}")
        elif check_offsets(index, problems) and index_tokens(index) != m.tokens:
            problems.append(f"{index.path} describes {index_tokens(index)} tokens; {prefix}.json says {m.tokens}")
        expected = m.tokens * dtype.itemsize
        try:
            size = os.path.getsize(name + ".bin")
        except FileNotFoundError:
            if name not in held:
                raise
            size = expected  # copied into a head and removed (`Head`, consume): its bytes are checked as joined
        if size != expected:
            problems.append(f"{name}.bin: {size} bytes, but {prefix}.json says {m.tokens} tokens of "
                            f"{dtype.itemsize} bytes ({expected} bytes): truncated or extended")
        if problems:
            raise MergeError(f"{problems[0]}; {_remedy(prefix)}")


def _remedy(prefix: str) -> str:
    return (f"{prefix} was changed or damaged after it was made: restore it or make it again "
            f"(`qwen-data verify {prefix}` lists its problems)")


class PartReads:
    """What a merge reads of its parts beside their .bin files (each manifest, each .idx read and hashed), each
    once (every index was read twice): read ahead as a Ray run's parts end (`prepare`), while later parts still
    run, where the merge after the last one read them all (~2 ms a part on a 2-core machine). A file changed since
    it was read (its size, time or inode) is read again."""

    def __init__(self) -> None:
        self.found: dict[tuple[str, str], tuple[tuple, object]] = {}

    def manifest(self, prefix: str) -> Manifest:
        return self._read("manifest", prefix + ".json", lambda _: Manifest.read(prefix))

    def index(self, path: str) -> Index:
        return self._read("index", path, read_index)

    def sha256(self, path: str) -> str:
        return self._read("sha256", path, sha256_of)

    def prepare(self, prefix: str) -> None:
        """Part `prefix`'s files read, as a merge will read them."""
        m = self.manifest(prefix)
        for name, _ in layout_of(m).channels(prefix, m.dtype):
            self.index(name + ".idx")
            self.sha256(name + ".idx")

    def _read(self, kind: str, path: str, read):
        try:
            stat = os.stat(path)
        except OSError:
            return read(path)  # (its own error names it)
        stamp = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        found = self.found.get((kind, path))
        if found is None or found[0] != stamp:
            found = self.found[kind, path] = (stamp, read(path))
        return found[1]


@dataclass
class Channel:
    """One channel (ids, loss mask) of a merge's output: what the manifest and `layouts.finish` read of it."""

    bin_path: str
    dtype: np.dtype
    documents: int
    sequences: int
    tokens: int
    digests: tuple[str, str]  # (.idx, .bin) hashes, as `IndexedDatasetWriter.digests`


class UnpackedSamples(NamedTuple):  # SFT samples gathered for `layouts.finish`, as a MaskedWriter holds them
    ids: Channel
    mask: Channel


def _join(parts: list[tuple[str, Manifest]], paths: list[str], dtype: np.dtype, progress: Progress,
          heads: list["Head"] | None, reads: "PartReads") -> tuple[list[Channel], np.ndarray]:
    """Each channel of the parts joined into `paths` (.bin, .idx per channel): the .bin files copied
    back to back in the kernel (COPY_THREADS at a time), and their hashes joined (`formats.digest.join`)
    from the parts' manifests, never read. A part made before those hashes (a sha256 of each .bin)
    is read back from the output once copied, its sha256 checked and its joinable hash taken. Each
    part's .idx is hashed against its manifest (MergeError where a part's files are not the data its
    manifest says: a .bin changed since is found by `verify` of the output, whose hash is the parts'
    recorded ones joined); → the channels and the sequence lengths."""
    names = [[name for name, _ in layout_of(m).channels(prefix, dtype)] for prefix, m in parts]
    dtypes = [d for _, d in layout_of(parts[0][1]).channels(parts[0][0], dtype)]
    indexes = [[reads.index(name + ".idx") for name in part_names] for part_names in names]
    # Copies in the kernel queue on the output's lock: more threads than COPY_THREADS only spin. Parts made
    # before joinable hashes are also read back and hashed: a thread a part then (the hashes let go of the GIL).
    legacy = any(m.digests is None for _, m in parts)
    with ThreadPoolExecutor(max_workers=min(len(parts), (os.cpu_count() or 1) if legacy else COPY_THREADS)) as pool:
        channels, found = [], [[] for _ in parts]
        for c, channel_dtype in enumerate(dtypes):
            sources = [(part_names[c], part_indexes[c], m.digests[c] if m.digests is not None else None)
                       for part_names, part_indexes, (_, m) in zip(names, indexes, parts)]
            channel, digests = _join_channel(sources, paths[2 * c], paths[2 * c + 1], channel_dtype, pool,
                                             heads[c] if heads else None, reads)
            channels.append(channel)
            for k, digest in enumerate(digests):
                found[k].append(digest)
    for (prefix, manifest), part_names, (index, *others), digests in zip(parts, names, indexes, found):
        if fingerprint(digests) != manifest.fingerprint:
            files = ", ".join(f"{name}.bin/.idx" for name in part_names)
            raise MergeError(f"{files} hash to fingerprint {fingerprint(digests)[:16]}…, but {prefix}.json says "
                             f"{manifest.fingerprint[:16]}…; {_remedy(prefix)}")
        try:  # every channel was joined by its own index: the loss mask's must be the ids' very index
            for other in others:
                check_same_index(index, other)
        except IndexFormatError as exc:
            raise MergeError(f"{exc}; {_remedy(prefix)}") from None
        progress.update(manifest.documents, 0, manifest.tokens, manifest.tokens)
    return channels, np.concatenate([np.asarray(ids.lengths, np.int64) for ids, *_ in indexes])


def _join_channel(sources: list[tuple[str, Index, list | None]], bin_path: str, idx_path: str, dtype: np.dtype,
                  pool, head: "Head | None", reads: "PartReads") -> tuple[Channel, list[tuple[str, str]]]:
    """The parts' `sources` (NAME of NAME.bin/.idx, that index read, the (.idx, .bin) hashes its
    manifest records or None) joined into bin_path/idx_path, after the parts `head` holds, where it holds
    the first ones as they are now; → the channel, and each part's (.idx, .bin) hashes as found (a recorded
    .bin hash taken as it is)."""
    names = [name for name, _, _ in sources]
    sizes = [index_tokens(index) * dtype.itemsize for _, index, _ in sources]  # (each .bin's, `_check_files`)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    idx_digest, counts = join_indexes([index for _, index, _ in sources], idx_path, dtype)  # (while a head copies)
    held = head.take(bin_path, list(zip(names, sizes))) if head is not None else 0
    with open(bin_path, "r+b" if held else "w+b") as out:
        futures = []  # a part's copy; or, for a part held (copied already), None or its read back
        for k, ((name, _, recorded), offset, size) in enumerate(zip(sources, offsets, sizes)):
            if k >= held:  # read back only for a part whose manifest has no joinable hash
                futures.append(pool.submit(_copy_part, name, out.fileno(), offset, size, recorded is None))
            else:
                futures.append(pool.submit(_hash_range, out.fileno(), offset, size) if recorded is None else None)
        wait([f for f in futures if f is not None])
        read = [f.result() if f is not None else None for f in futures]  # a part's own failure is the one said
    joinable = [recorded[1] if recorded is not None else again[1] for (_, _, recorded), again in zip(sources, read)]
    digests = [(reads.sha256(name + ".idx"), recorded[1] if recorded is not None else again[0])
               for (name, _, recorded), again in zip(sources, read)]
    channel = Channel(bin_path, dtype, *counts, digests=(idx_digest, join(joinable)))
    return channel, digests


def _copy_part(source: str, out_fd: int, offset: int, size: int, read_back: bool) -> tuple[str, str] | None:
    """SOURCE.bin copied into the output at `offset` (in the kernel where it can); `read_back`: its
    (sha256, joinable hash) read back from there."""
    with open(source + ".bin", "rb") as f:
        copied = _copy_bytes(f.fileno(), out_fd, size, 0, offset)
    if copied < size:
        raise MergeError(f"{source}.bin ends at byte {copied:,}, {size:,} were expected: {_remedy(source)}")
    return _hash_range(out_fd, offset, size) if read_back else None


def _copy_bytes(src: int, dst: int, size: int, src_offset: int, dst_offset: int) -> int:
    """`size` bytes of `src` from `src_offset` copied to `dst` at `dst_offset`; → how many were (fewer where
    `src` ends first)."""
    copied = 0
    while copied < size:
        n = _copy_range(src, dst, size - copied, src_offset + copied, dst_offset + copied)
        if n == 0:
            break
        copied += n
    return copied


def _copy_range(src: int, dst: int, count: int, src_offset: int, dst_offset: int) -> int:
    try:
        return os.copy_file_range(src, dst, min(count, COPY_BYTES), src_offset, dst_offset)
    except OSError as exc:  # a kernel or file system without it (or across file systems on old kernels)
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    block = os.pread(src, min(count, HASH_BLOCK), src_offset)
    return os.pwrite(dst, block, dst_offset) if block else 0


def _hash_range(fd: int, offset: int, size: int) -> tuple[str, str]:
    """(sha256, joinable hash) of `size` bytes of `fd` from `offset`."""
    sha, joinable, end = bin_hash(False), bin_hash(), offset + size
    while offset < end:
        block = os.pread(fd, min(end - offset, HASH_BLOCK), offset)
        if not block:
            raise MergeError(f"the merged data ends at byte {offset:,}, {end:,} were written")
        sha.update(block)  # (both hashes let go of the GIL)
        joinable.update(block)
        offset += len(block)
    return sha.hexdigest(), joinable.hexdigest()


class Head:
    """The start of a merge's channel made while its later parts are still being made: the first parts'
    .bin files copied back to back into `path` as they are added, in order, by a thread of its own, or (added with
    their size) found there, written by whoever made them (the Ray executor's tasks place each part's bytes
    themselves; it copies in only the parts an earlier run left). `merge(..., heads=)` takes the file for its
    output's start (`take`) and copies only the parts after it.

    `consume`: each part's .bin removed once copied, the part recorded beside the file first (a line added to
    PATH.parts, `held`). Removed while its pages still wait to be written, little of a part reaches the disk (a Ray
    run that kept its shards wrote every byte twice, and removing 8.5 GB of them after the commit waited 3-4 s
    on the disk: bench/results/cpu/2026-12-01h); a run stopped after that puts them back (`restore`). The
    removals run in threads of their own (REMOVERS), never holding up the next copy; `settle` waits for them."""

    def __init__(self, path: str, consume: bool = False) -> None:
        self.path, self.parts, self.size, self.consume = path, [], 0, consume
        # Not truncated: a Ray run's tasks may have made the file and written their parts' bytes in already; the
        # mode that of a file this process makes (the output's, as a local run's: the tasks' umask may differ).
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        os.fchmod(self._fd, 0o666 & ~_umask())
        self._copying = ThreadPoolExecutor(max_workers=1)  # one part after another: one core's work beside the tasks
        self._removing = ThreadPoolExecutor(max_workers=REMOVERS) if consume else None
        self._copies, self._removals = [], []
        # Appended to, never renamed over: a file renamed over another has its pages written at once (ext4), and
        # the one replaced then waits for that write, queued behind the kernel's writeback of GBs (a median 1.1 ms
        # a part on 2 cores, up to ~40 ms; appended, 0.04 ms: bench/results/cpu/2026-12-03g/waits.py).
        self._record = open(path + PARTS_SUFFIX, "w", encoding="utf-8") if consume else None

    def add(self, name: str, size: int | None = None) -> None:
        """NAME.bin (a finished part: its size is final) copied after the parts added before; or, given its `size`,
        the part's bytes already written there (by a Ray task: `run.ray._Placing`), only recorded."""
        placed = size is not None
        size = size if placed else os.path.getsize(name + ".bin")
        self.parts.append((name, size))
        self._copies.append(self._copying.submit(self._copy, name, self.size, size, placed))
        self.size += size

    def _copy(self, name: str, offset: int, size: int, placed: bool) -> None:
        if not placed:
            _copy_part(name, self._fd, offset, size, False)
        if not self.consume:
            return
        # (a part's .bin goes only once it is recorded; one write, so a killed run leaves a line whole or none)
        self._record.write(json.dumps([os.path.relpath(name, os.path.dirname(self.path)), size]) + "\n")
        self._record.flush()
        if not placed:
            self._removals.append(self._removing.submit(_remove, name + ".bin"))

    def take(self, path: str, parts: list[tuple[str, int]]) -> int:
        """How many of `parts` (NAME, size of NAME.bin), from the first, the file holds, once moved to `path`
        (where it consumes its parts: linked there, and left where it is for `restore` until the run's folder
        goes); 0 (its parts put back, and the file removed) where it holds others, or could not be moved."""
        held = self.close()
        # (its size too: bytes written past the parts recorded would end the output)
        if held == parts[:len(held)] and os.path.getsize(self.path) == sum(size for _, size in held):
            for put in ([_link] if self.consume else []) + [os.replace]:
                with contextlib.suppress(OSError):
                    put(self.path, path)
                    return len(held)
        if self.consume:
            self.settle()  # (a removal still to come would take a part put back)
            restore(self.path)
        for name in (self.path, self.path + PARTS_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)
        return 0

    def close(self) -> list[tuple[str, int]]:
        """The copies waited for (the first failure raised); → the parts held."""
        self._copying.shutdown(wait=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._record is not None:
            self._record.close()
        for copy in self._copies:
            copy.result()
        return self.parts

    def settle(self) -> None:
        """The parts copied removed (the first failure raised): `close` leaves their removals running."""
        if self._removing is not None:
            self._removing.shutdown(wait=True)
            for removal in self._removals:
                removal.result()


def _manifest(parts: list[tuple[str, Manifest]], channels: list[Channel]) -> Manifest:
    first = parts[0][1]
    ids, digests = channels[0], [channel.digests for channel in channels]
    by_reason: dict[str, int] = {}
    for _, m in parts:
        for reason, n in m.rejects.get("by_reason", {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    sharded = bool(first.shard)
    inputs = first.inputs if sharded else [i for _, m in parts for i in m.inputs]
    sft = None
    if first.sft is not None:
        sft = first.sft.replace(**{k: sum(getattr(m.sft, k) for _, m in parts) for k in SFT_COUNTS})
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


def _umask() -> int:
    """This process's umask, read without setting it (os.umask sets it, for every thread at once)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # (a failed run's folder removed meanwhile)
        os.remove(path)


def _link(source: str, target: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(target)
    os.link(source, target)


def held(path: str) -> list[tuple[str, int]]:
    """The parts a `Head`'s file at `path` holds, in order, from its record (PATH.parts): (NAME, size of NAME.bin);
    the lines before the first that cannot be read (OSError where there is no record)."""
    folder, parts = os.path.dirname(path), []
    with open(path + PARTS_SUFFIX, encoding="utf-8") as f:
        for line in f:
            try:
                name, size = json.loads(line)
                parts.append((os.path.join(folder, name), int(size)))
            except (ValueError, TypeError):
                break
    return parts


def restore(path: str) -> int:
    """The .bin files of the parts a `Head`'s file at `path` holds (PATH.parts), where they are gone, copied
    back out of it, for a run stopped after they were joined to reuse them as any part left whole (and
    check their bytes against their manifests, as it checks those); → how many. Nothing where the record
    or the file cannot be read, or the file is shorter than its record (those parts are then made again)."""
    offset, restored = 0, 0
    try:
        parts = held(path)
        head = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        for name, size in parts:
            if not os.path.exists(name + ".bin") and os.fstat(head).st_size >= offset + size:
                with atomic_file(name + ".bin", "wb") as out:
                    if _copy_bytes(head, out.fileno(), size, offset, 0) < size:
                        raise OSError(f"{path} ends before its record")
                restored += 1
            offset += size
    except OSError:  # (the parts not put back are made again)
        pass
    finally:
        os.close(head)
    return restored
