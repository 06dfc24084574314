"""Helpers the tests share (test modules never import each other)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path, records) -> str:
    """Records (dicts, or raw lines as strings) one per line; gzip when the name ends in .gz."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return str(path)
