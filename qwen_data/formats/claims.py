"""Which files a run may write: never one it reads, never one that is not its own earlier output.

Every command that writes (pretrain, sft, merge, blend) calls `check` before it writes anything,
with every file it would create or replace and every file it reads:

  - no output is an input: compared by resolved path (links and `..` followed) and, for files
    that exist, by device and inode (a hard link is the same file under another name). A run's
    scratch files (`FILE.tmp`, `FILE.lock` of `outputs.AtomicOutputs`) count as outputs here.
  - an output that exists already is replaced only when `own` accepts it as this command's earlier
    output. For datasets (`dataset_owner`): no other qwen-data prefix claims the file (a prefix
    claims the files its kind writes beside its manifest: `PREFIX.lossmask.bin` is the SFT
    prefix PREFIX's, whatever else would write that name), and the run's prefix it belongs to is
    there already, of the run's kind. For blends (`blend_owner`): no prefix claims it and the
    blend's own record is there. Anything else, a user's file included, is foreign: refused.

Refusals name both paths and say what to do; nothing has been written when they come.
"""

from __future__ import annotations

import json
import os
from typing import Callable

from .indexed import MaskedWriter
from .layouts import UNPACKED
from .manifest import FORMAT
from .outputs import LOCK_SUFFIX, TMP_SUFFIX

REJECTS_SUFFIX = ".rejects.jsonl"
# The files a prefix of each kind may have beside PREFIX.json, as suffixes of the prefix; an SFT
# prefix's include its loss-mask channel whatever its layout, as an SFT run declares them.
KIND_SUFFIXES = {
    "pretrain": [".bin", ".idx", ".json", REJECTS_SUFFIX],
    "sft": MaskedWriter.files("") + MaskedWriter.files(UNPACKED) + [".json", REJECTS_SUFFIX],
}
SUFFIXES = sorted({s for suffixes in KIND_SUFFIXES.values() for s in suffixes}, key=len, reverse=True)

# Why an existing output may not be replaced, as a sentence; None when it may.
Owner = Callable[[str], "str | None"]


class OutputClash(ValueError):
    """A run would write over one of its inputs or over a file that is not its own earlier output."""


def check(outputs: list[str], inputs: list[str], own: Owner, remedy: str = "choose another -o") -> None:
    """OutputClash unless every output may be written (see the module's docstring)."""
    by_path, by_inode = {}, {}
    for path in inputs:
        real, inode = _identity(path)
        by_path.setdefault(real, path)
        if inode is not None:
            by_inode.setdefault(inode, path)
    for output in outputs:
        for written in (output, output + TMP_SUFFIX, output + LOCK_SUFFIX):
            real, inode = _identity(written)
            path = by_path.get(real) or by_inode.get(inode)
            if path is not None:
                link = "" if written == path else " (the same file, through a link or another name)"
                raise OutputClash(f"{written} would be written over the input {path}{link}: {remedy}")
    for output in outputs:
        if os.path.lexists(output):
            refusal = own(output)
            if refusal:
                raise OutputClash(f"{refusal}: {remedy}, or remove it if it is not needed")


def dataset_owner(prefixes: list[str], kind: str | None) -> Owner:
    """Datasets: an existing file is the run's own when no other prefix claims it and the run's
    prefix it belongs to (any of them, for a file of the whole run such as a several-key pretrain
    run's rejects) is there already, of `kind` (None: of any kind)."""
    ours = {_norm(p) for p in prefixes}

    def refusal(path: str) -> str | None:
        for prefix, other in claimants(path):
            if _norm(prefix) not in ours:
                return f"{_of_prefix(path, prefix, other)}, another dataset than this run's"
            if kind is not None and other != kind:
                return f"{_of_prefix(path, prefix, other)}, not an earlier {kind} run's output"
        homes = [p for p in prefixes if path.startswith(p) and path[len(p):] in SUFFIXES] or prefixes
        found = {p: _manifest_kind(p) for p in homes}
        if any(k is not None and (kind is None or k == kind) for k in found.values()):
            return None
        home = homes[0]
        if found[home] is not None:
            return f"{path} is a file of the {found[home]} prefix {home} ({home}.json), not an earlier {kind} run's output"
        return (f"{path} exists and is not an earlier output of this command "
                f"(no qwen-data manifest {home}.json claims it)")

    return refusal


def blend_owner(sidecar: str, blend_format: str) -> Owner:
    """Blends: an existing file is the blend's own when no prefix claims it and `sidecar`, the
    blend's record, is there already (a blend of the same name was written here)."""

    def refusal(path: str) -> str | None:
        for prefix, kind in claimants(path):
            return f"{_of_prefix(path, prefix, kind)}, not a blend's file"
        if _read_json(sidecar).get("format") == blend_format:
            return None
        return f"{path} exists and is not an earlier blend's file (no blend record {sidecar} beside it)"

    return refusal


def claimants(path: str) -> list[tuple[str, str]]:
    """(prefix, kind) of every qwen-data prefix that has `path` among its files."""
    found = []
    for suffix in SUFFIXES:
        if path.endswith(suffix) and len(path) > len(suffix):
            prefix = path[: -len(suffix)]
            kind = _manifest_kind(prefix)
            if kind is not None and suffix in KIND_SUFFIXES.get(kind, [".json"]):
                found.append((prefix, kind))
    return found


def _of_prefix(path: str, prefix: str, kind: str) -> str:
    if path == prefix + ".json":
        return f"{path} is the manifest of the {kind} prefix {prefix}"
    return f"{path} is a file of the {kind} prefix {prefix} ({prefix}.json)"


def _manifest_kind(prefix: str) -> str | None:
    """The kind in PREFIX.json when it is a qwen-data manifest (any kind a later version may add)."""
    data = _read_json(prefix + ".json")
    return str(data.get("kind")) if data.get("format") == FORMAT else None


def _read_json(path: str) -> dict:
    """The file's JSON object, or {} for anything else (no such file, not JSON, not an object)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _norm(path: str) -> str:
    return os.path.realpath(path)


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    """Resolved path and, for an existing file, (device, inode)."""
    try:
        status = os.stat(path)
        inode = (status.st_dev, status.st_ino)
    except OSError:
        inode = None
    return _norm(path), inode
