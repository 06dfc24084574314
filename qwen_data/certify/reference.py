"""The parity certificate: a sample of a run's records encoded a second time by the reference
libraries and compared with our ids (and loss mask).

Pretrain's reference is HF `tokenizers` on the run's tokenizer.json; SFT's is transformers'
`apply_chat_template` with the template's own Jinja (the tokenizer folder's chat template, or the
file `--reference-template` names; either only when its sha256 is the template's), its text encoded
by the same HF tokenizer, and the trained spans found by rendering the conversation up to each
trained assistant turn with and without the generation prompt (never by our masking code).

Workers pick the records (`certify.sample`) and hand over what they made of them; the checks run
in `run.certifier`. The reference libraries load once per process (`loaded`): ~0.7 s for HF's
tokenizer, ~2 s with transformers. A mismatch stops the run (`CertificateError`, naming the record
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
from importlib import metadata

from ..qwen import CONTENT_TOKENS, FIRST_ADDED_ID, FLAVOUR_ADDED_TOKENS

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
    HF's tokenizer loads when the first record is checked (`_hf_tokenizer`).
    """

    def __init__(self, directory: str, flavour: str, policy: str) -> None:
        self.path = os.path.join(directory, "tokenizer.json")
        self.last_id = FIRST_ADDED_ID + FLAVOUR_ADDED_TOKENS[flavour] - 1
        self.policy = policy

    def load(self) -> None:
        _hf_tokenizer(self.path)

    @property
    def _full(self):
        return _hf_tokenizer(self.path)

    @functools.cached_property
    def _plain(self):
        from tokenizers import Tokenizer

        plain = Tokenizer(self._full.model)
        plain.normalizer, plain.pre_tokenizer = self._full.normalizer, self._full.pre_tokenizer
        return plain

    @functools.cached_property
    def _patterns(self) -> tuple[re.Pattern, re.Pattern]:
        """(every added token's literal, the literals this policy and flavour keep as ids)."""
        added = {t.content: i for i, t in self._full.get_added_tokens_decoder().items()}
        flavour = {c for c, i in added.items() if i <= self.last_id}
        kept = {"parse": flavour, "text": set()}.get(self.policy, flavour & CONTENT_TOKENS)
        self.ids_of = {c: added[c] for c in kept}
        return _pattern(added), _pattern(kept)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, as `encode` gives them; the texts without literals in one call
        of HF's batch encoder (its threads: one text at a time, HF encodes ~1.5 MB/s)."""
        every, kept = self._patterns
        plain = [i for i, text in enumerate(texts) if every.pattern == kept.pattern or not every.search(text)]
        ids: list[list[int] | None] = [None] * len(texts)
        for i, encoding in zip(plain, self._full.encode_batch([texts[i] for i in plain], add_special_tokens=False)):
            ids[i] = encoding.ids
        return [self.encode(text)[0] if found is None else found for text, found in zip(texts, ids)]

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids, each id's character span in `text`)."""
        every, kept = self._patterns
        if every.pattern == kept.pattern or not every.search(text):
            encoding = self._full.encode(text, add_special_tokens=False)
            return encoding.ids, encoding.offsets
        ids, offsets, position = [], [], 0
        for piece in kept.split(text) + [""]:
            if piece in self.ids_of and kept.fullmatch(piece):
                ids.append(self.ids_of[piece])
                offsets.append((position, position + len(piece)))
            elif piece:
                encoding = self._plain.encode(piece, add_special_tokens=False)
                ids += encoding.ids
                offsets += [(position + a, position + b) for a, b in encoding.offsets]
            position += len(piece)
        return ids, offsets


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
    """SFT's reference Jinja (`template_jinja`); NotCertified where transformers or the Jinja is missing."""
    if importlib.util.find_spec("transformers") is None:
        raise NotCertified("transformers is not installed: its apply_chat_template is the reference")
    jinja = template_jinja(template, tokenizer_dir, given)
    if jinja is None:
        source = OFFICIAL.get(template.name)
        where = (f": pass --reference-template with {source}'s tokenizer_config.json (`huggingface-cli download "
                 f"{source} tokenizer_config.json`), which holds it" if source else "")
        raise NotCertified(f"no official Jinja of the template {template.name} (sha256 {template.sha256[:16]}…) "
                           f"in the tokenizer folder, the local Hugging Face cache or --reference-template{where}")
    return jinja


def reference_samples(conversation, history: str) -> list[tuple[list, list[int]]]:
    """(messages rendered, indices of the assistant messages trained) of each sample a conversation
    makes under the run's rendered history (`SFTConfig.rendered_history`), in order."""
    messages, turns = conversation.messages, conversation.assistant_indices
    if history == "split":
        return [(messages[:i + 1], [i]) for i in turns]
    return [(messages, turns if history == "rendered" else turns[-1:])]


_LOADED: dict[tuple[str, str], object] = {}  # (library, tokenizer.json): this process's reference


def _hf_tokenizer(path: str):
    if ("tokenizers", path) not in _LOADED:
        from tokenizers import Tokenizer

        _LOADED["tokenizers", path] = Tokenizer.from_file(path)
    return _LOADED["tokenizers", path]


def _transformers_tokenizer(path: str):
    if ("transformers", path) not in _LOADED:
        from transformers import PreTrainedTokenizerFast  # never a download: the run's own file

        _LOADED["transformers", path] = PreTrainedTokenizerFast(tokenizer_object=_hf_tokenizer(path))
    return _LOADED["transformers", path]


def loaded(tokenizer_dir: str, chat: bool) -> bool:
    """Whether this process holds the reference for a tokenizer folder already (a process forked
    from it inherits it)."""
    return ("transformers" if chat else "tokenizers", os.path.join(tokenizer_dir, "tokenizer.json")) in _LOADED


class ChatReference:
    """transformers' `apply_chat_template` with the template's Jinja; ids by `TextReference` (the
    rendered text, every literal of the flavour's added tokens an id, as transformers encodes it);
    the loss mask from renders of the conversation up to each trained turn.

    `span` and `mask` are the run's --assistant-span and --mask; the trained characters of turn k
    (message index i) run from the end of the render of messages[:i] with the generation prompt to
    the end of the render of messages[:i+1], both prefixes of the sample's render: im_end_nl takes
    them all; im_end leaves out the newline after <|im_end|>; trl adds the newline before (the
    generation prompt's last character); turn starts at the render of messages[:i] without it.
    A turn whose render is not a prefix of the sample's (Qwen3 strips earlier reasoning) leaves
    the sample's mask unchecked (counted apart).
    """

    def __init__(self, directory: str, flavour: str, jinja: str, span: str, mask: str, enable_thinking) -> None:
        self.directory, self.jinja = directory, jinja
        self.text = TextReference(directory, flavour, "parse")
        self.span, self.mask_policy, self.enable_thinking = span, mask, enable_thinking

    def load(self) -> None:
        _transformers_tokenizer(os.path.join(self.directory, "tokenizer.json"))

    @property
    def _tokenizer(self):
        return _transformers_tokenizer(os.path.join(self.directory, "tokenizer.json"))

    def render(self, messages, tools, prompt: bool = False) -> str:
        if not messages:
            return ""
        kwargs = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        return self._tokenizer.apply_chat_template(messages, tools=tools or None, chat_template=self.jinja,
                                                   tokenize=False, add_generation_prompt=prompt, **kwargs)

    def encode(self, messages, tools, trained: list[int]) -> tuple[list[int], list[int] | None]:
        """(ids, mask) of the sample rendering `messages`, training the assistant messages at
        indices `trained`; mask None where it cannot be derived."""
        full = self.render(messages, tools)
        ids, offsets = self.text.encode(full)
        if self.mask_policy == "all":
            return ids, [1] * len(ids)
        spans = []
        for i in trained:
            before, prompt = self.render(messages[:i], tools), self.render(messages[:i], tools, True)
            upto = self.render(messages[:i + 1], tools)
            if not (full.startswith(upto) and upto.startswith(prompt) and prompt.startswith(before)):
                return ids, None
            start, end = len(prompt), len(upto)
            if self.enable_thinking is False and upto.startswith(EMPTY_THINK, start):
                start += len(EMPTY_THINK)  # non-thinking data: the empty think block is prompt
            if self.span == "im_end":
                end -= len(upto) - len(upto.rstrip("\n"))
            elif self.span == "trl":
                start -= 1
            elif self.span == "turn":
                start = len(before)
            spans.append((start, end))
        mask = [int(any(a < e and s < b for s, e in spans)) for a, b in offsets]
        return ids, mask


EMPTY_THINK = "<think>\n\n</think>\n\n"


def preload(tokenizer_json: str) -> None:
    """Load HF's tokenizer of `tokenizer_json` into this process (every reference encodes with it)."""
    _hf_tokenizer(tokenizer_json)


def holds(tokenizer_json: str) -> bool:
    """Whether this process holds HF's tokenizer of `tokenizer_json` already."""
    return ("tokenizers", tokenizer_json) in _LOADED
