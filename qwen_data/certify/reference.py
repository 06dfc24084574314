"""The parity certificate: a sample of a run's records encoded a second time by the reference
libraries and compared with our ids (and loss mask).

Pretrain's reference is HF `tokenizers` on the run's tokenizer.json; SFT's is the template's own
Jinja (the tokenizer folder's chat template, or the file `--reference-template` names; either only
when its sha256 is the template's) rendered by jinja2 as transformers' `apply_chat_template` renders
it (`certify.render`), its text encoded by the same HF tokenizer, and the trained spans found by
rendering the conversation up to each trained assistant turn with and without the generation
prompt (never by our masking code).

Workers pick the records (`certify.sample`) and hand over what they made of them; the checks run
in `run.certifier`. The reference libraries load once per process (`loaded`): ~0.7 s for HF's
tokenizer; jinja2 compiles a template in milliseconds. A mismatch stops the run (`CertificateError`, naming the record
and both id sequences); the manifest's `certificate` records what was checked and by which
libraries (docs/outputs.md).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Iterator
from importlib import metadata

import numpy as np

from ..qwen import CONTENT_TOKENS, FIRST_ADDED_ID, FLAVOUR_ADDED_TOKENS
from . import trimmed
from .messages import NotMappable, RecordReading, read_record
from .render import ChatJinja, named_tokens
from .sample import LONG_RENDER, window
from .spelling import normalized

SHOWN = 6  # ids shown either side of the first difference


class NotCertified(ValueError):
    """The reference cannot run here (why): the data is not certified."""


def versions(*libraries: str) -> dict:
    return {name: metadata.version(name) for name in libraries}


def difference(ours, theirs, what: str = "ids") -> str:
    """What differs, both sequences shortened around their first difference (the caller names the
    record before it)."""
    ours, theirs = list(map(int, ours)), list(map(int, theirs))
    first = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    low = max(0, first - SHOWN)

    def shown(values: list[int]) -> str:
        inner = " ".join(map(str, values[low:first + SHOWN]))
        return ("… " if low else "") + inner + (" …" if first + SHOWN < len(values) else "")

    return (f"our {what} differ from the reference's at position {first} "
            f"(ours {len(ours)}, reference {len(theirs)}): ours [{shown(ours)}], reference [{shown(theirs)}]")


class TextReference:
    """HF `tokenizers` on tokenizer.json, under a special-token policy.

    HF itself turns every literal of an added token into its id (policy parse). For the tokens the
    run keeps as plain text (all under text; structural ones under safe and reject; those beyond the
    run's flavour always), the text is cut at the literals kept as ids, as HF cuts at added tokens,
    and the pieces are encoded by HF's own model, normalizer and pre-tokenizer with no added tokens.
    HF's tokenizer loads when the first record is checked (`_hf_tokenizer`). `trim`: a run of few
    records, whose checks each take HF's tokenizer cut down to the batch's texts (`certify.trimmed`,
    ~5 ms) where this process does not hold the whole one (~0.4 s to load).
    """

    def __init__(self, directory: str, flavour: str, policy: str, trim: bool = False) -> None:
        self.path = os.path.join(directory, "tokenizer.json")
        self.last_id = FIRST_ADDED_ID + FLAVOUR_ADDED_TOKENS[flavour] - 1
        self.policy = policy
        self.trim = trim

    def load(self) -> None:
        if not self._trims:
            _hf_tokenizer(self.path)

    @property
    def _trims(self) -> bool:
        return self.trim and not holds(self.path) and trimmed.tables(self.path) is not None

    @property
    def _full(self):
        return _hf_tokenizer(self.path)

    @functools.cached_property
    def _plain(self):
        return _plain(self._full)

    @functools.cached_property
    def _literals(self) -> tuple[dict[str, int], set[str], set[str]]:
        """(every added token's literal → its id, the flavour's literals, those this policy keeps as ids)."""
        base = trimmed.tables(self.path).base if self._trims else self._full  # HF's reading of the added tokens
        added = {t.content: i for i, t in base.get_added_tokens_decoder().items()}
        flavour = {c for c, i in added.items() if i <= self.last_id}
        return added, flavour, {"parse": flavour, "text": set()}.get(self.policy, flavour & CONTENT_TOKENS)

    @functools.cached_property
    def _patterns(self) -> tuple[re.Pattern, re.Pattern]:
        """(every added token's literal, the literals this policy and flavour keep as ids)."""
        added, _, kept = self._literals
        self.ids_of = {c: added[c] for c in kept}
        return _pattern(added), _pattern(kept)

    @functools.cached_property
    def as_text(self) -> re.Pattern:
        """The flavour's literals this policy encodes as plain text (none under parse)."""
        _, flavour, kept = self._literals
        return _pattern(flavour - kept)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, as `encode` gives them, one text after another: HF's batch encoder
        runs a thread per core, which on a run's busy host spun for as much CPU as it encoded."""
        if self._trims:
            cut = trimmed.tables(self.path).tokenizer(piece for text in texts for piece in self.pieces(text))
            models = cut, _plain(cut)
            return [self.encode(text, models=models)[0] for text in texts]
        return [self.ids(text) for text in texts]

    def ids(self, text: str, unmark: dict | None = None) -> list[int]:
        """`encode`'s ids alone: where HF's whole tokenizer encodes the text as it is, its offsets are
        never made (into Python tuples, they were ~12% of a pretraining checker's encoding)."""
        if self._hf_splits(text, unmark):
            return self._full.encode(text, add_special_tokens=False).ids
        return self.encode(text, unmark)[0]

    def pieces(self, text: str) -> list[str]:
        """The pieces of `text` HF's model encodes (`encode`): between the added tokens' literals
        where HF splits them out, else between those this policy keeps as ids."""
        every, kept = self._patterns
        return (every if self._hf_splits(text) else kept).split(text)[::2]

    def _hf_splits(self, text: str, unmark: dict | None = None) -> bool:
        """Whether HF's whole tokenizer encodes `text` as the policy asks, splitting out every literal
        it holds (each one the policy keeps as an id, or none there)."""
        every, kept = self._patterns
        return not unmark and (every.pattern == kept.pattern or not every.search(text))

    def spelled(self, text: str, unmark: dict | None = None) -> str:
        """What `text`'s ids spell: its placeholders put back, normalized as HF normalizes it."""
        return normalized(text.translate(unmark) if unmark else text)

    def encode(self, text: str, unmark: dict | None = None, models: tuple | None = None
               ) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, each id's character span in `text`). `unmark`: a `str.translate` table of the
        placeholders `text` holds (`ChatReference`), each one character standing for another: the
        text between the literals kept as ids is encoded with them put back. `models`: HF's
        tokenizer and its model alone (`_plain`) to encode with (default: the whole ones)."""
        full, plain = models or (self._full, self._plain)
        if self._hf_splits(text, unmark):
            encoding = full.encode(text, add_special_tokens=False)
            return encoding.ids, encoding.offsets
        ids, offsets, position = [], [], 0
        for k, piece in enumerate(self._patterns[1].split(text)):  # text, literal, text, ...: literals at odd places
            if k % 2:
                ids.append(self.ids_of[piece])
                offsets.append((position, position + len(piece)))
            elif piece:
                encoding = plain.encode(piece.translate(unmark) if unmark else piece, add_special_tokens=False)
                ids += encoding.ids
                offsets += [(position + a, position + b) for a, b in encoding.offsets]
            position += len(piece)
        return ids, offsets


def _plain(tokenizer):
    """HF's model of `tokenizer` with its normalizer and pre-tokenizer, and no added tokens."""
    from tokenizers import Tokenizer

    plain = Tokenizer(tokenizer.model)
    plain.normalizer, plain.pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    return plain


def _pattern(contents) -> re.Pattern:
    # longest first (leftmost longest, as HF matches added tokens); one group, so `split` keeps them
    alternatives = "|".join(re.escape(c) for c in sorted(contents, key=len, reverse=True))
    return re.compile(f"({alternatives or '(?!)'})")


# Where each built-in template's official Jinja is published: its instruct model's tokenizer_config.json.
OFFICIAL = {"qwen2": "Qwen/Qwen2-7B-Instruct", "qwen2p5": "Qwen/Qwen2.5-7B-Instruct", "qwen3": "Qwen/Qwen3-8B"}


def template_jinja(template, tokenizer_dir: str, given: str | None) -> str | None:
    """The Jinja text whose sha256 is the template's: the file `given` (--reference-template: the
    Jinja itself, or a tokenizer_config.json holding it), else the tokenizer folder's own
    chat_template, else that of a Qwen model's tokenizer_config.json in the local Hugging Face cache;
    None when none is. A file given that is not the template's official Jinja is a ValueError naming
    it: the user asked for a check that cannot be made."""
    if given:
        text = _given_jinja(given)
        found = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if found != template.sha256:
            raise ValueError(f"{given}: --reference-template is not the official Jinja of the template "
                             f"{template.name} (its sha256 {found[:16]}…, the template's {template.sha256[:16]}…)")
        return text
    cached = glob.glob(os.path.join(_hub_cache(), "models--Qwen--*", "snapshots", "*", "tokenizer_config.json"))
    for config in [os.path.join(tokenizer_dir, "tokenizer_config.json"), *sorted(cached)]:
        own = _chat_template(config)
        if own is not None and hashlib.sha256(own.encode("utf-8")).hexdigest() == template.sha256:
            return own
    return None


def _given_jinja(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: --reference-template is not UTF-8 text ({exc.reason} at byte {exc.start:,}): "
                         "give the template's official Jinja, or the tokenizer_config.json holding it") from None
    own = _chat_template(path) if path.endswith(".json") else None
    return text if own is None else own


def _chat_template(config: str) -> str | None:
    try:
        with open(config, encoding="utf-8") as f:
            own = json.load(f).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return own if isinstance(own, str) else None


def _hub_cache() -> str:
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")


def reference_jinja(template, tokenizer_dir: str, given: str | None) -> str:
    """SFT's reference Jinja (`template_jinja`); NotCertified where jinja2 or the Jinja is missing."""
    if importlib.util.find_spec("jinja2") is None:
        raise NotCertified("jinja2 is not installed: it renders the template's official Jinja")
    jinja = template_jinja(template, tokenizer_dir, given)
    if jinja is None:
        source = OFFICIAL.get(template.name)
        where = (f": pass --reference-template with {source}'s tokenizer_config.json (`huggingface-cli download "
                 f"{source} tokenizer_config.json`), which holds it" if source else "")
        raise NotCertified(f"no official Jinja of the template {template.name} (sha256 {template.sha256[:16]}…) "
                           f"in the tokenizer folder, the local Hugging Face cache or --reference-template{where}")
    return jinja


def reference_samples(messages: list[dict], history: str) -> list[tuple[list, list[int]]]:
    """(messages rendered, indices of the assistant messages trained) of each sample a conversation
    makes under the run's rendered history (`SFTConfig.rendered_history`), in order."""
    turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
    if history == "split":
        return [(messages[:i + 1], [i]) for i in turns]
    return [(messages, turns if history == "rendered" else turns[-1:])]


_LOADED: dict[tuple[str, str], object] = {}  # (library, tokenizer.json): this process's reference


# A path's real path, kept: the reference asks for its tokenizer once a record, and realpath's
# lstat of each component took ~0.1 ms of the SFT reference's ~0.9 ms a record.
_real = functools.lru_cache(maxsize=64)(os.path.realpath)


def _hf_tokenizer(path: str):
    key = ("tokenizers", _real(path))  # one file however its path is spelled
    if key not in _LOADED:
        from tokenizers import Tokenizer

        _LOADED[key] = Tokenizer.from_file(path)
    return _LOADED[key]


class ChatReference:
    """The template's Jinja rendered by jinja2 as transformers renders it (`render.ChatJinja`); ids by
    `TextReference` (the rendered text, every literal of the flavour's added tokens an id, as
    transformers encodes it); the loss mask from renders of the conversation up to each trained turn.

    `span` and `mask` are the run's --assistant-span and --mask; the trained characters of turn k
    (message index i) run from the end of the render of messages[:i] with the generation prompt to
    the end of the render of messages[:i+1], both prefixes of the sample's render: im_end_nl takes
    them all; im_end leaves out the newline after <|im_end|>; trl adds the newline before (the
    generation prompt's last character); turn starts at the render of messages[:i] without it.
    A turn whose render is not a prefix of the sample's (Qwen3 strips earlier reasoning) leaves
    the sample's mask unchecked (counted apart).

    Literals in the record that the run's --special-tokens policy keeps as text (`policy`) are
    rendered as placeholders (`placeholders`), so neither the template nor the encoder takes them
    for the template's own tokens: the render's literals are then the template's and the ones the
    policy keeps, all ids, and the placeholders are encoded as the literals' plain text.
    """

    def __init__(self, directory: str, flavour: str, jinja: str, span: str, mask: str, enable_thinking,
                 reading: RecordReading, history: str, policy: str) -> None:
        """`reading`: how the run reads a record; `history`: its rendered history; `policy`: its
        --special-tokens."""
        self.directory, self.jinja = directory, jinja
        self.text = TextReference(directory, flavour, "parse")
        self.content = TextReference(directory, flavour, policy)  # which literals content keeps
        self.span, self.mask_policy, self.enable_thinking = span, mask, enable_thinking
        self.reading, self.history = reading, history

    def record_samples(self, source, window_seed: int | None = None, masks: bool = True) -> list[tuple]:
        """(ids, mask, window) of each sample a record makes, from the record itself
        (`messages.read_record`, `RecordReading`), never from our parser's conversation; NotMappable
        where the documented mapping or the template cannot take it. `window_seed`: a sample's render
        above LONG_RENDER characters gives the ids and mask of a window of it only (`sample.window`),
        and `window` (the text the whole render's ids spell, the window's first byte, its end) (else
        None); `masks`: False leaves every mask None (the renders up to each turn are most of a
        record's cost)."""
        record = self.reading.messages(read_record(source))
        (messages, tools), unmark = placeholders(list(record), self.content.as_text, self.jinja)

        # Every sample and every turn's span is a render of the record's first n messages: each once.
        @functools.lru_cache(maxsize=None)
        def rendered(n: int, prompt: bool = False) -> str:
            return self.render(messages[:n], tools, prompt)

        return [self._sample(rendered, len(part), trained, unmark, window_seed, masks)
                for part, trained in reference_samples(messages, self.history)]

    def load(self) -> None:
        self.text.load()
        self._template  # noqa: B018 - compiled while the workers start

    @functools.cached_property
    def _template(self) -> ChatJinja:
        # the named special tokens transformers hands every render (`eos_token` ...)
        return ChatJinja(self.jinja, named_tokens(_tokenizer_config(self.directory)))

    def render(self, messages, tools, prompt: bool = False) -> str:
        if not messages:
            return ""
        kwargs = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return self._template.render(messages, tools or None, add_generation_prompt=prompt, **kwargs)
        except _refusals() as why:  # e.g. Qwen2's template on a message without content
            raise NotMappable(f"the template refuses the messages: {why}") from None

    def _sample(self, rendered, n: int, trained: list[int], unmark: dict | None, window_seed: int | None,
                masks: bool) -> tuple:
        """(ids, mask, window) of the sample rendering the record's first `n` messages (`rendered(n,
        prompt)`), training the assistant messages at indices `trained` (see `record_samples`); mask
        None where it cannot be derived. `unmark`: the placeholders' table (`placeholders`)."""
        full = rendered(n)
        cut = window(full, window_seed, LONG_RENDER) if window_seed is not None else None
        a, b = cut or (0, len(full))  # HF encodes the window (the whole render is compared as bytes, below)
        if self.mask_policy == "all":
            ids = self.text.ids(full[a:b], unmark)
            mask = np.ones(len(ids), dtype=np.uint8)
        elif not masks:  # (the mask from renders: the first records a process checks, `record_samples`)
            ids, mask = self.text.ids(full[a:b], unmark), None
        else:  # a window's tokens are the whole render's there: their mask is theirs in the whole
            ids, offsets = self.text.encode(full[a:b], unmark)
            spans = [self._span(rendered, full, i) for i in trained]
            mask = None if None in spans else _token_mask(offsets, [(start - a, end - a) for start, end in spans])
        if cut is None:
            return ids, mask, None
        start = len(self.text.spelled(full[:a], unmark).encode("utf-8"))
        stop = start + len(self.text.spelled(full[a:b], unmark).encode("utf-8"))
        return ids, mask, (self.text.spelled(full, unmark), start, stop)

    def _span(self, rendered, full: str, i: int) -> tuple[int, int] | None:
        """The trained characters of the assistant message at index `i` in the sample's render `full`;
        None where the render up to it is not a prefix of `full`."""
        prompt, upto = rendered(i, True), rendered(i + 1)
        if not (full.startswith(upto) and upto.startswith(prompt)):
            return None
        start, end = len(prompt), len(upto)
        if self.enable_thinking is False and upto.startswith(EMPTY_THINK, start):
            start += len(EMPTY_THINK)  # non-thinking data: the empty think block is prompt
        if self.span == "im_end":
            end -= len(upto) - len(upto.rstrip("\n"))
        elif self.span == "trl":
            start -= 1
        elif self.span == "turn":
            before = rendered(i)
            if not prompt.startswith(before):
                return None
            start = len(before)
        return start, end


def _token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token (its character span in `offsets`) that touches a trained span, as
    transformers' assistant mask marks every token touching one."""
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(bounds), dtype=bool)
    for start, end in spans:
        mask |= (bounds[:, 0] < end) & (bounds[:, 1] > start)
    return mask.astype(np.uint8)


EMPTY_THINK = "<think>\n\n</think>\n\n"


def preload(tokenizer_json: str) -> None:
    """Load HF's tokenizer of `tokenizer_json` into this process (every reference encodes with it)."""
    _hf_tokenizer(tokenizer_json)


def hold(tokenizer_json: str, tokenizer) -> None:
    """HF's tokenizer of `tokenizer_json`, loaded by the caller (`run.prestart`), as this process's reference."""
    _LOADED["tokenizers", _real(tokenizer_json)] = tokenizer


def holds(tokenizer_json: str) -> bool:
    """Whether this process holds HF's tokenizer of `tokenizer_json` already."""
    return ("tokenizers", _real(tokenizer_json)) in _LOADED


PRIVATE_USE = range(0xE000, 0xF900)  # the placeholders' first characters come from here


def placeholders(value, literals: re.Pattern, jinja: str) -> tuple[object, dict | None]:
    """(`value` with each literal `literals` matches, in any of its strings (dict keys too), made a
    placeholder; the `str.translate` table that puts the literals back, None where there was none).
    A placeholder is the literal with its first character replaced by a private-use character found
    nowhere in `value` nor the Jinja, so no template test (`'</think>' in content`) and no encoder
    matches it, and, one character for one, positions in a render are positions in the real text."""
    strings = list(_strings(value))
    found = {literal for text in strings for literal in literals.findall(text)}
    if not found:
        return value, None
    taken = set().union(jinja, *strings)
    free = iter(chr(c) for c in PRIVATE_USE if chr(c) not in taken)
    markers = {first: next(free, None) for first in sorted({literal[0] for literal in found})}
    if None in markers.values():
        raise NotMappable("no private-use character is free for the placeholders of its literals")

    def marked(item):
        if isinstance(item, str):
            return literals.sub(lambda m: markers[m.group(0)[0]] + m.group(0)[1:], item)
        if isinstance(item, list):
            return [marked(v) for v in item]
        if isinstance(item, dict):
            return {marked(k): marked(v) for k, v in item.items()}
        return item

    return marked(value), str.maketrans({marker: first for first, marker in markers.items()})


def _strings(item) -> Iterator[str]:
    """Every string of a JSON-like value, dict keys too, in no set order: what `placeholders` marks.
    A stack, not recursion: a record nested deeper than Python's recursion limit is still read. The
    run's own walk (`text.literals`) is not reused: a string it skipped would be skipped here too, and
    a literal in it would pass unseen on both sides."""
    stack = [item]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, dict):
            stack += item.keys()
            stack += item.values()


def _tokenizer_config(directory: str) -> dict:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _refusals() -> tuple:
    """What a template raises on messages it cannot render: its own errors, and a value tojson
    cannot write (an attribute the messages lack)."""
    from jinja2 import TemplateError

    return TemplateError, TypeError
