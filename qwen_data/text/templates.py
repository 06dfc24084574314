"""Qwen chat templates as pure-Python renderers that return labelled segments.

Each renderer reproduces, byte for byte, what transformers' `apply_chat_template(messages,
tools=..., tokenize=False, add_generation_prompt=..., enable_thinking=...)` gives with the
official template (files in shared/oracles, hashes in TEMPLATE_SHA256), for the canonical
conversations of `qwen_data.text.conversations`. Jinja is not used at run time: these run once per
record in every worker.

An assistant turn comes out as these segments, in this order (empty ones are left out):

    HEADER    "<|im_start|>assistant"
    HEADER_NL "\\n"
    THINK     Qwen3's "<think>\\n...\\n</think>\\n\\n" block, where the template renders one
    BODY      content and tool calls, exactly as the template renders them
    END       "<|im_end|>"
    END_NL    "\\n"

THINK and BODY together are the assistant body; THINK is apart only so that a policy may
treat an empty think block (Qwen3 always renders one on the final turn) differently.
Everything else (system, user and tool text with their markers, the generation prompt) is
CONTEXT. `Segment.turn` numbers the assistant turns 0..k-1 and is -1 on CONTEXT.

Tokenizing segment by segment is exact only where a cut falls next to a special token. The
HEADER_NL|body cut (and THINK|BODY) sits inside plain text: a body starting with whitespace
("\\n\\nHi") tokenizes differently on its own. Tokenize the joined text and map character
spans to tokens instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import RecordError
from .conversations import Conversation

CONTEXT = "context"
HEADER = "header"
HEADER_NL = "header_nl"
THINK = "think"
BODY = "body"
END = "end"
END_NL = "end_nl"
KINDS = (CONTEXT, HEADER, HEADER_NL, THINK, BODY, END, END_NL)

# Segment kinds trained under each --assistant-span policy (the lead's contract):
# im_end_nl (LLaMA-Factory): body + <|im_end|> + "\n"; im_end (ms-swift): body + <|im_end|>;
# trl (TRL's qwen2_5 {% generation %} template): "\n" after the role + body + <|im_end|>\n;
# turn (Pai-Megatron-Patch, which trains all that follows the prompt): the whole turn from <|im_start|>.
SPAN_KINDS = {
    "im_end_nl": frozenset({THINK, BODY, END, END_NL}),
    "im_end": frozenset({THINK, BODY, END}),
    "trl": frozenset({HEADER_NL, THINK, BODY, END, END_NL}),
    "turn": frozenset({HEADER, HEADER_NL, THINK, BODY, END, END_NL}),
}

HISTORY_MODES = ("rendered", "last", "split")

# sha256 of the official template text each built-in renderer reproduces (shared/oracles).
TEMPLATE_SHA256 = {
    "qwen2": "793202280c0910ab26bc6eb57c8212c2417324c6d8c4efd0d10d59092ab3e3eb",
    "qwen2p5": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
}
ORACLE_FILES = {
    "qwen2": "qwen2-instruct.jinja",
    "qwen2p5": "qwen2.5-instruct.jinja",
    "qwen3": "qwen3.jinja",
}
# Other official texts that render our canonical conversations identically to a built-in one:
# the April-2025 Qwen3 template (still shipped by Qwen3-*-Base and the bundled tokenizer) only
# differs on non-string content and a None reasoning_content, which canonical messages never hold.
EQUIVALENT_SHA256 = {
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": "qwen3",
}


class Segment(NamedTuple):
    text: str
    kind: str
    turn: int


@dataclass
class Sample:
    """One training sample: its segments and which assistant turns (by `Segment.turn`) it trains.

    `marked_text`, when set, is `text` with the leading "<" of every literal that must stay plain
    text replaced by a marker character (see `qwen_data.text.literals`): the literals left in it are
    exactly the control tokens.
    """

    segments: list[Segment]
    trained_turns: frozenset[int]
    marked_text: str | None = None

    @functools.cached_property
    def text(self) -> str:  # (joined once: the encoder and the certificate's spelling both read it)
        return "".join(segment.text for segment in self.segments)


def _tojson(value) -> str:
    # transformers' own `tojson` filter: insertion order kept, no ASCII/HTML escaping, default separators
    return json.dumps(value, ensure_ascii=False)


class _Segments:
    """Collects segments, merging consecutive context text into one segment."""

    __slots__ = ("segments", "_context")

    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._context: list[str] = []

    def context(self, text: str) -> None:
        self._context.append(text)

    def assistant(self, turn: int, think: str, body: str, header_nl: str = "\n") -> None:
        self._flush()
        add = self.segments.append
        add(Segment("<|im_start|>assistant", HEADER, turn))
        if header_nl:
            add(Segment(header_nl, HEADER_NL, turn))
        if think:
            add(Segment(think, THINK, turn))
        if body:
            add(Segment(body, BODY, turn))
        add(Segment("<|im_end|>", END, turn))
        add(Segment("\n", END_NL, turn))

    def _flush(self) -> None:
        if self._context:
            text = "".join(self._context)
            if text:
                self.segments.append(Segment(text, CONTEXT, -1))
            self._context = []

    def finish(self) -> list[Segment]:
        self._flush()
        return self.segments


_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)


def _tools_block(tools: list) -> str:
    return _TOOLS_INTRO + "".join("\n" + _tojson(tool) for tool in tools) + _TOOLS_OUTRO


def _tool_responses(out: _Segments, messages: list[dict], i: int, content: str) -> None:
    # consecutive tool messages share one user turn of <tool_response> blocks
    n = len(messages)
    opens = i == 0 or messages[i - 1]["role"] != "tool"
    closes = i == n - 1 or messages[i + 1]["role"] != "tool"
    out.context(
        ("<|im_start|>user" if opens else "")
        + "\n<tool_response>\n"
        + content
        + "\n</tool_response>"
        + ("<|im_end|>\n" if closes else "")
    )


def _call_function(call: dict) -> dict:
    # Qwen3 tests `tool_call.function` for truth; Qwen2.5 tests `is defined` (inlined there)
    function = call.get("function")
    return function if function else call


# ---------------------------------------------------------------------------------------------
# Qwen2-Instruct


def _render_qwen2(messages: list[dict], tools, add_generation_prompt: bool, enable_thinking) -> list[Segment]:
    if tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        # The template would print tool messages under a "tool" role the model never saw and
        # silently drop tool calls, leaving empty trained turns.
        raise RecordError("template-without-tools", "the qwen2 template has no tool support; use qwen2p5 or qwen3")
    out = _Segments()
    if messages and messages[0]["role"] != "system":
        out.context("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    turn = 0
    for message in messages:
        role = message["role"]
        if role == "assistant":
            out.assistant(turn, "", message["content"])
            turn += 1
        else:
            out.context("<|im_start|>" + role + "\n" + message["content"] + "<|im_end|>\n")
    if add_generation_prompt:
        out.context("<|im_start|>assistant\n")
    return out.finish()


# ---------------------------------------------------------------------------------------------
# Qwen2.5-Instruct


_QWEN2P5_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def _render_qwen2p5(messages: list[dict], tools, add_generation_prompt: bool, enable_thinking) -> list[Segment]:
    out = _Segments()
    first_is_system = bool(messages) and messages[0]["role"] == "system"
    system = messages[0]["content"] if first_is_system else _QWEN2P5_DEFAULT_SYSTEM
    if tools:
        out.context("<|im_start|>system\n" + system + "\n\n" + _tools_block(tools))
    else:
        out.context("<|im_start|>system\n" + system + "<|im_end|>\n")
    turn = 0
    for i, message in enumerate(messages):
        role = message["role"]
        content = message["content"]
        if role == "user" or (role == "system" and i != 0):
            out.context("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            tool_calls = message.get("tool_calls")
            if not tool_calls:
                out.assistant(turn, "", content)
            else:
                # '\n' + content only when there is content; each call brings its own leading '\n'
                parts = ["\n" + content] if content else []
                for call in tool_calls:
                    function = call["function"] if "function" in call else call
                    parts.append(
                        '\n<tool_call>\n{"name": "'
                        + function["name"]
                        + '", "arguments": '
                        + _tojson(function["arguments"])
                        + "}\n</tool_call>"
                    )
                # either way the text after the role starts with '\n': that one is HEADER_NL
                out.assistant(turn, "", "".join(parts)[1:])
            turn += 1
        elif role == "tool":
            _tool_responses(out, messages, i, content)
    if add_generation_prompt:
        out.context("<|im_start|>assistant\n")
    return out.finish()


# ---------------------------------------------------------------------------------------------
# Qwen3 (the current template, TEMPLATE_SHA256["qwen3"])


def _is_tool_response_wrapper(content) -> bool:
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _render_qwen3(messages: list[dict], tools, add_generation_prompt: bool, enable_thinking) -> list[Segment]:
    out = _Segments()
    n = len(messages)
    first_is_system = n > 0 and messages[0]["role"] == "system"
    if tools:
        out.context(
            "<|im_start|>system\n" + (messages[0]["content"] + "\n\n" if first_is_system else "") + _tools_block(tools)
        )
    elif first_is_system:
        out.context("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    last_query = _last_query(messages)
    turn = 0
    for i, message in enumerate(messages):
        role = message["role"]
        content = message["content"]
        if not isinstance(content, str):
            content = ""
        if role == "user" or (role == "system" and i != 0):
            out.context("<|im_start|>" + role + "\n" + content + "<|im_end|>\n")
        elif role == "assistant":
            out.assistant(turn, *_qwen3_assistant(message, content, i > last_query, i == n - 1))
            turn += 1
        elif role == "tool":
            _tool_responses(out, messages, i, content)
    if add_generation_prompt:
        out.context("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.context("<think>\n\n</think>\n\n")
    return out.finish()


def _last_query(messages: list[dict]) -> int:
    """The last real user query (not a <tool_response> wrapper): think blocks survive only after it;
    without one, the template's default index n - 1 keeps them nowhere."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, str) and not _is_tool_response_wrapper(content):
                return i
    return len(messages) - 1


def _qwen3_assistant(message: dict, content: str, after_query: bool, last: bool) -> tuple[str, str]:
    """(think block, the rest) of an assistant message as Qwen3's template renders it."""
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    think = ""
    body = content
    if after_query and (last or reasoning):
        think = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
        body = content.lstrip("\n")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        parts = [body]
        for j, call in enumerate(tool_calls):
            # the separator tests the content before its '\n's were stripped, as the template does
            if j or content:
                parts.append("\n")
            function = _call_function(call)
            arguments = function["arguments"]
            parts.append('<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
                         + (arguments if isinstance(arguments, str) else _tojson(arguments)) + "}\n</tool_call>")
        body = "".join(parts)
    return think, body


# ---------------------------------------------------------------------------------------------
# Public API


class ChatTemplate:
    """A renderer: `render(conversation)` -> segments whose texts join to the template's output."""

    name: str
    sha256: str

    def render(
        self,
        conversation: Conversation,
        *,
        add_generation_prompt: bool = False,
        enable_thinking: bool | None = None,
        label_turns: frozenset[int] | None = None,
    ) -> list[Segment]:
        """Render the conversation. `label_turns`: the assistant turns the caller needs labelled
        (None = all); a renderer may emit the other turns as CONTEXT (built-ins label them all)."""
        raise NotImplementedError


class BuiltinTemplate(ChatTemplate):
    def __init__(self, name: str, sha256: str | None = None) -> None:
        self.name = name
        self.sha256 = sha256 or TEMPLATE_SHA256[name]
        self._render = _RENDERERS[name]

    def render(self, conversation, *, add_generation_prompt=False, enable_thinking=None, label_turns=None):
        return self._render(conversation.messages, conversation.tools, add_generation_prompt, enable_thinking)

    def __repr__(self) -> str:
        return f"BuiltinTemplate({self.name!r}, sha256={self.sha256[:12]}...)"


_RENDERERS = {"qwen2": _render_qwen2, "qwen2p5": _render_qwen2p5, "qwen3": _render_qwen3}
TEMPLATE_NAMES = tuple(_RENDERERS)


class HFTemplate(ChatTemplate):
    """A tokenizer directory's own chat template, rendered by transformers (slow, general).

    Assistant spans come from prefix renders: for assistant message k, the render of
    messages[:k] with the generation prompt must be a prefix of the full render, and the render
    of messages[:k+1] must be too; the text between is the turn. The generation prompt gives
    HEADER (+ HEADER_NL up to its first newline); the turn ends with the template's end-of-turn
    marker (found by rendering a probe conversation), split into END and its trailing
    whitespace END_NL. Templates that rewrite history (Qwen3 strips earlier reasoning) break
    the prefix property for earlier turns: render those turns only as context (history "last"
    or "split"), or use a built-in template.
    """

    name = "auto"

    def __init__(self, tokenizer_dir: str | Path) -> None:
        self.tokenizer_dir = str(tokenizer_dir)
        self._tokenizer = None
        self.sha256 = hashlib.sha256(self.template_text.encode("utf-8")).hexdigest()
        self.end_marker = self._probe_end_marker()

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
            if not self._tokenizer.chat_template:
                raise ValueError(f"{self.tokenizer_dir} has no chat_template")
        return self._tokenizer

    @property
    def template_text(self) -> str:
        return self.tokenizer.get_chat_template()

    def __getstate__(self):
        # workers reload the tokenizer themselves rather than unpickling a large object
        state = self.__dict__.copy()
        state["_tokenizer"] = None
        return state

    def _apply(self, messages, tools, add_generation_prompt, enable_thinking) -> str:
        if not messages:
            return ""
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def _probe_end_marker(self) -> str:
        sentinel = "QWEN_DATA_PROBE_7f3a"
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": sentinel}]
        text = self._apply(probe, None, False, None)
        if text.count(sentinel) != 1:
            raise ValueError("the chat template does not render assistant content verbatim; cannot derive spans")
        marker = text.split(sentinel)[1]
        if not marker.strip():
            raise ValueError(f"the chat template ends an assistant turn with no marker ({marker!r})")
        prompt = self._apply(probe[:1], None, True, None)
        if prompt == self._apply(probe[:1], None, False, None):
            raise ValueError("the chat template has no generation prompt; cannot find where assistant turns start")
        return marker

    def render(self, conversation, *, add_generation_prompt=False, enable_thinking=None, label_turns=None):
        messages, tools = conversation.messages, conversation.tools
        full = self._apply(messages, tools, add_generation_prompt, enable_thinking)
        positions = conversation.assistant_indices
        wanted = range(len(positions)) if label_turns is None else sorted(label_turns)
        marker = self.end_marker
        segments: list[Segment] = []
        cursor = 0
        for turn in wanted:
            k = positions[turn]
            before = self._apply(messages[:k], tools, False, enable_thinking)
            prompt = self._apply(messages[:k], tools, True, enable_thinking)
            upto = self._apply(messages[: k + 1], tools, False, enable_thinking)
            if not (
                prompt.startswith(before)
                and upto.startswith(prompt)
                and full.startswith(upto)
                and len(before) >= cursor
            ):
                raise RecordError(
                    "template-not-prefix-stable",
                    f"this chat template renders assistant turn {turn} differently once later messages follow "
                    "(e.g. Qwen3 strips earlier reasoning), so its span cannot be found; train only the last turn "
                    "or split the conversation per turn, or use a built-in template (qwen2, qwen2p5, qwen3)",
                )
            turn_text = upto[len(prompt) :]
            if not turn_text.endswith(marker):
                raise RecordError(
                    "template-turn-end-not-found",
                    f"assistant turn {turn} does not end with the template's end marker {marker!r}",
                )
            if before[cursor:]:
                segments.append(Segment(before[cursor:], CONTEXT, -1))
            segments += self._turn(turn, prompt[len(before) :], turn_text)
            cursor = len(upto)
        if full[cursor:]:
            segments.append(Segment(full[cursor:], CONTEXT, -1))
        return segments

    def _turn(self, turn: int, generation_prompt: str, turn_text: str) -> list[Segment]:
        """Assistant turn `turn`'s segments: the generation prompt (HEADER, up to its first newline,
        then HEADER_NL), the body, the end marker (END, then its trailing whitespace, END_NL)."""
        marker = self.end_marker
        closing = marker.rstrip()
        newline = generation_prompt.find("\n")
        if newline < 0:
            segments, lead = [Segment(generation_prompt, HEADER, turn)], ""
        else:
            segments = [Segment(generation_prompt[:newline], HEADER, turn), Segment("\n", HEADER_NL, turn)]
            lead = generation_prompt[newline + 1 :]
        body = lead + turn_text[: len(turn_text) - len(marker)]
        if body:
            segments.append(Segment(body, BODY, turn))
        segments.append(Segment(closing, END, turn))
        if marker[len(closing) :]:
            segments.append(Segment(marker[len(closing) :], END_NL, turn))
        return segments

    def __repr__(self) -> str:
        return f"HFTemplate({self.tokenizer_dir!r}, sha256={self.sha256[:12]}...)"


def get_template(name: str, tokenizer_dir: str | Path | None = None, *, prefer_builtin: bool = True) -> ChatTemplate:
    """`qwen2`, `qwen2p5`, `qwen3`, or `auto` (the tokenizer directory's own chat_template).

    With `auto`, a template whose sha256 is one the built-ins reproduce gets the fast built-in
    renderer (keeping the directory template's sha256); anything else renders through transformers.
    """
    if name in _RENDERERS:
        return BuiltinTemplate(name)
    if name != "auto":
        raise ValueError(f"unknown template {name!r}; expected one of {TEMPLATE_NAMES + ('auto',)}")
    if tokenizer_dir is None:
        raise ValueError("--template auto needs a tokenizer directory with a chat_template")
    hf = HFTemplate(tokenizer_dir)
    if prefer_builtin:
        for builtin, digest in TEMPLATE_SHA256.items():
            if digest == hf.sha256:
                return BuiltinTemplate(builtin)
        if hf.sha256 in EQUIVALENT_SHA256:
            return BuiltinTemplate(EQUIVALENT_SHA256[hf.sha256], hf.sha256)
    return hf


def render_samples(
    template: ChatTemplate, conversation: Conversation, history: str = "rendered", *, enable_thinking=None
) -> list[Sample]:
    """The training samples for one conversation, under a multi-turn history mode.

    rendered: one sample, the whole conversation as the template renders it, every assistant
              turn trained (with Qwen3, earlier turns lose their reasoning: not what the model
              saw when it wrote them).
    last:     one sample, the whole conversation, only the final assistant turn trained.
    split:    one sample per assistant turn: the conversation cut right after that turn, only
              that turn trained, so each trained turn is rendered as at inference.

    enable_thinking=False: the official Qwen3 template renders whole conversations the same
    either way (the flag only changes its generation prompt, which then ends with an empty
    think block). Here it means non-thinking-mode data, as in LLaMA-Factory: an empty think
    block `<think>\n\n</think>\n\n` is prompt (CONTEXT), not trained. The text is unchanged.
    """
    if history not in HISTORY_MODES:
        raise ValueError(f"unknown history mode {history!r}; expected one of {HISTORY_MODES}")
    count = len(conversation.assistant_indices)
    if history == "split":
        parts = [
            (Conversation(conversation.messages[: k + 1], conversation.tools), frozenset({turn}))
            for turn, k in enumerate(conversation.assistant_indices)
        ]
    else:
        parts = [(conversation, frozenset(range(count)) if history == "rendered" else frozenset({count - 1}))]
    samples = []
    for part, turns in parts:
        segments = template.render(part, enable_thinking=enable_thinking, label_turns=turns)
        if enable_thinking is False:
            segments = [
                Segment(s.text, CONTEXT, -1) if s.kind == THINK and s.text == _EMPTY_THINK else s for s in segments
            ]
        samples.append(Sample(segments, turns))
    return samples


_EMPTY_THINK = "<think>\n\n</think>\n\n"
