"""SFT records (alpaca, chat, ShareGPT) -> one canonical, validated conversation.

The canonical form is what Hugging Face chat templates take: OpenAI-style messages
(`role` in system/user/assistant/tool, `content` a string, optional `tool_calls` and
`reasoning_content` on assistant turns) plus an optional `tools` list. Templates render it;
nothing here knows about tokens.

Input formats (`fmt="auto"` picks per record by its keys: `messages` -> chat,
`conversations` -> sharegpt, `instruction`/`output` -> alpaca):

- alpaca (also Alibaba Pai-Megatron-Patch's SFT json): `instruction`, optional `input`,
  `output`, optional `system` (an empty one counts as absent), optional `history` as
  [[user, assistant], ...].
  The user turn is the non-empty ones of instruction and input joined by "\\n", as
  LLaMA-Factory's AlpacaDatasetConverter does (`input_separator`). Pai-Megatron-Patch's
  build_idxmap_sft_dataset.py concatenates them with no separator (`sft --layout pai` does
  too) and ignores `system` and `history` (we never do).
- chat: `{"messages": [...], "tools"?}`. Reasoning may come as `reasoning_content`, or under
  the aliases transformers also accepts (`thinking`, `reasoning`).
- sharegpt: `{"conversations": [{"from", "value"}], "system"?, "tools"?}` (LLaMA-Factory's
  conventions): from in human/gpt/system/function_call/observation, also user/assistant/tool.
  `function_call` values are JSON (one call or a list, each `{"name", "arguments"}`), may
  start with a `<think>...</think>` thought, and become an assistant turn with `tool_calls`;
  `observation` becomes a tool message. `tools` may be a JSON string; a tool that is a bare
  function schema is wrapped as `{"type": "function", "function": ...}` as LLaMA-Factory's
  Qwen tool formatter does.

Content given as a list of parts (chat `content`, ShareGPT `value`): `{"type": "text", "text": ...}`
(OpenAI) or `{"type": "text", "value": ...}` (LLaMA-Factory) parts are joined with nothing between
them, which is what the model sees from Qwen's own templates that take part lists (Qwen2-VL to
Qwen3.5 print each text part in turn) and from LLaMA-Factory's renderer. (The text-only Qwen2.5 and
Qwen3 templates cannot take lists: Qwen2.5's fails, Qwen3's renders them as empty; vLLM and SGLang
flatten lists for such templates with "\\n" and " " respectively. Put any separator inside the parts.)
A part of another type is rejected (`unsupported-content-part`), never skipped. qwen-data prepares
text-only data: a record with image, audio, video or file parts, or with non-empty media keys
(`images`/`videos`/`audios`, LLaMA-Factory's and ms-swift's multimodal columns, or LLaVA's
`image`/`video`), is rejected as `multimodal` in every format, since its `<image>`-style
placeholders would otherwise be trained as plain text.

What is accepted (HF templates render almost anything; LLaMA-Factory demands strict
user/assistant alternation; we sit between, rejecting what would train the model wrongly):
- a system message only as the first message;
- the first non-system message must be a user turn;
- consecutive user turns are accepted (the templates render them, and they are real context);
- consecutive assistant turns are rejected (nothing to answer; almost always a join bug);
- a tool message must follow an assistant turn that made tool calls, or another tool message
  (`tool-response-without-call` after a plain assistant turn, e.g. a ShareGPT `observation` after
  `gpt` rather than `function_call`); the number of responses is not checked against the number
  of calls, as LLaMA-Factory merges several results into one observation and the templates ignore
  `tool_call_id`;
- the conversation must end with an assistant turn (a trailing prompt would be untrained,
  and for Qwen3 it would also move the "last user query" and change how thinking renders);
- every assistant turn must carry something: non-blank content, tool calls or reasoning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

from ..errors import RecordError

FORMATS = ("auto", "alpaca", "chat", "sharegpt")

ROLES = ("system", "user", "assistant", "tool")

# Names other tools use for the same roles (ShareGPT / LLaMA-Factory tags); accepted everywhere.
_ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "tool": "tool",
    "observation": "tool",
}

# transformers copies these into `reasoning_content` before rendering (first non-None wins).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

# Record keys that carry media: LLaMA-Factory's and ms-swift's multimodal columns, LLaVA's singular ones.
_MEDIA_KEYS = ("images", "videos", "audios", "image", "video", "audio")

# Content-part types that carry media (OpenAI chat and Responses, vLLM, Qwen-VL's own messages).
_MEDIA_PART_TYPES = frozenset(
    {
        "image", "image_url", "input_image", "image_pil", "image_embeds",
        "audio", "audio_url", "input_audio", "audio_embeds",
        "video", "video_url", "input_video",
        "file", "input_file",
    }
)

_TEXT_ONLY = "qwen-data prepares text-only data"


@dataclass
class Conversation:
    """Canonical messages and tools, ready for a chat template."""

    messages: list[dict]
    tools: list | None = None

    @property
    def assistant_indices(self) -> list[int]:
        """Message index of each assistant turn, in order (turn number = position here)."""
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]

    def strings(self) -> Iterator[tuple[str, str]]:
        """(where, string) for every string a template can render: each message's role, content,
        reasoning and tool calls (names, arguments, and the keys of arguments given as objects),
        and the tools."""
        for n, message in enumerate(self.messages):
            for key, value in message.items():
                yield from _strings(value, f"message {n} {key}")
        yield from _strings(self.tools, "tools")


def _strings(value, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key, where)
            yield from _strings(item, where)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, where)


def to_conversation(record: dict, fmt: str = "auto", *, parse_tool_arguments: bool = False,
                    input_separator: str = "\n") -> Conversation:
    """Convert one SFT record to a validated Conversation, or raise RecordError.

    parse_tool_arguments: OpenAI-style data carries tool-call arguments as JSON strings.
    Qwen2.5's template `tojson`s them again (a double-encoded string); set this to parse a
    string holding a JSON object into a dict first, so every template renders an object.
    input_separator: between an alpaca instruction and its input, when both are there.
    """
    if not isinstance(record, dict):
        raise RecordError("not-an-object", f"record is a {type(record).__name__}, not a JSON object")
    _reject_media_keys(record)
    if fmt == "auto":
        fmt = detect_format(record)
    if fmt == "alpaca":
        conversation = _from_alpaca(record, input_separator)
    elif fmt == "chat":
        conversation = _from_chat(record)
    elif fmt == "sharegpt":
        conversation = _from_sharegpt(record)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if parse_tool_arguments:
        _parse_string_arguments(conversation)
    validate(conversation)
    return conversation


def _reject_media_keys(record: dict) -> None:
    for key in _MEDIA_KEYS:
        if record.get(key) not in (None, "", [], {}):
            raise RecordError("multimodal", f"the record has {key!r}; {_TEXT_ONLY}")


def detect_format(record: dict) -> str:
    if "messages" in record:
        return "chat"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record or "output" in record:
        return "alpaca"
    keys = ", ".join(sorted(map(str, record))[:8]) or "none"
    raise RecordError(
        "unknown-format",
        f"cannot tell the record's format from its keys ({keys}); expected 'messages' (chat), "
        "'conversations' (sharegpt) or 'instruction'/'output' (alpaca)",
    )


# ---------------------------------------------------------------------------------------------
# alpaca


def _from_alpaca(record: dict, input_separator: str = "\n") -> Conversation:
    for key in ("instruction", "output"):
        if key not in record or record[key] is None:
            raise RecordError("missing-field", f"alpaca record has no {key!r}")
    instruction = _string_field(record, "instruction")
    query = _string_field(record, "input") if record.get("input") is not None else ""
    output = _string_field(record, "output")
    messages: list[dict] = []
    system = record.get("system")
    if system is not None and system != "":  # exports often carry "": no system, as LLaMA-Factory reads it
        messages.append({"role": "system", "content": _string_field(record, "system")})
    history = record.get("history")
    if history is not None:
        if not isinstance(history, list):
            raise RecordError("bad-history", "alpaca 'history' must be a list of [user, assistant] pairs")
        for n, pair in enumerate(history):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise RecordError("bad-history", f"history[{n}] is not a [user, assistant] pair")
            for role, text in zip(("user", "assistant"), pair):
                if not isinstance(text, str):
                    raise RecordError("non-string-content", f"history[{n}] {role} text is a {type(text).__name__}")
                messages.append({"role": role, "content": text})
    messages.append({"role": "user", "content": input_separator.join(part for part in (instruction, query) if part)})
    messages.append({"role": "assistant", "content": output})
    return Conversation(messages, None)


def _string_field(record: dict, key: str) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise RecordError("non-string-content", f"field {key!r} is a {type(value).__name__}, not a string")
    return value


# ---------------------------------------------------------------------------------------------
# chat (OpenAI messages)


def _from_chat(record: dict) -> Conversation:
    raw = record.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RecordError("missing-field", "chat record needs a non-empty 'messages' list")
    messages = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RecordError("bad-message", f"messages[{n}] is not an object")
        role = _role(item.get("role", item.get("from")), n)
        content = item["content"] if "content" in item else item.get("value")
        message = {"role": role}
        tool_calls = item.get("tool_calls")
        if role == "assistant" and tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise RecordError("bad-tool-call", f"messages[{n}].tool_calls is not a list")
            if tool_calls:
                message["tool_calls"] = [_tool_call(call, n) for call in tool_calls]
        if content is None and "tool_calls" in message:
            content = ""  # OpenAI sends content=null next to tool calls; templates read it as empty
        message["content"] = _content(content, n)
        if role == "assistant":
            reasoning = next((item[key] for key in _REASONING_KEYS if item.get(key) is not None), None)
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise RecordError("non-string-content", f"messages[{n}] reasoning is a {type(reasoning).__name__}")
                message["reasoning_content"] = reasoning
        messages.append(message)
    return Conversation(messages, _tools(record.get("tools"), wrap=False))


def _role(value, n: int) -> str:
    role = _ROLE_ALIASES.get(value) if isinstance(value, str) else None
    if role is None:
        raise RecordError("unknown-role", f"messages[{n}] has role {value!r}; expected one of {ROLES}")
    return role


def _content(value, n: int) -> str:
    if value is None:
        raise RecordError("missing-field", f"messages[{n}] has no content")
    if isinstance(value, list):
        return "".join(_text_part(part, n, i) for i, part in enumerate(value))
    if not isinstance(value, str):
        raise RecordError(
            "non-string-content",
            f"messages[{n}] content is a {type(value).__name__}; expected a string or a list of text parts",
        )
    return value


def _text_part(part, n: int, i: int) -> str:
    """The text of one content part (joined as the module docstring says), or RecordError."""
    where = f"messages[{n}] content part {i}"
    if not isinstance(part, dict):
        raise RecordError("bad-content-part", f"{where} is a {type(part).__name__}, not an object")
    kind = part.get("type")
    # Qwen-VL's templates take a part holding an `image`/`video` key as media whatever its type
    if kind in _MEDIA_PART_TYPES or any(part.get(key) is not None for key in ("image", "image_url", "audio", "video")):
        raise RecordError("multimodal", f"{where} is {kind or 'media'!r}; {_TEXT_ONLY}")
    if kind != "text":
        raise RecordError(
            "unsupported-content-part", f"{where} has type {kind!r}; only 'text' parts are supported"
        )
    text = part["text"] if "text" in part else part.get("value")
    if not isinstance(text, str):
        raise RecordError("bad-content-part", f"{where} needs a string 'text' (or 'value')")
    return text


def _tool_call(call, n: int) -> dict:
    """Canonical OpenAI shape {"type": "function", "function": {"name", "arguments"}}."""
    if not isinstance(call, dict):
        raise RecordError("bad-tool-call", f"messages[{n}] has a tool call that is not an object")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise RecordError("bad-tool-call", f"messages[{n}] tool call 'function' is not an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("bad-tool-call", f"messages[{n}] tool call has no name")
    arguments = function.get("arguments", function.get("parameters"))
    if not isinstance(arguments, (dict, str)):
        raise RecordError(
            "bad-tool-call", f"messages[{n}] tool call {name!r} arguments must be an object or a JSON string"
        )
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tools(value, *, wrap: bool) -> list | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RecordError("bad-tools", f"'tools' is a string but not JSON: {exc}") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise RecordError("bad-tools", "'tools' must be a list of JSON objects")
    if wrap:
        value = [tool if tool.get("type") == "function" else {"type": "function", "function": tool} for tool in value]
    return value or None


# ---------------------------------------------------------------------------------------------
# ShareGPT (LLaMA-Factory conventions)


def _from_sharegpt(record: dict) -> Conversation:
    raw = record.get("conversations")
    if not isinstance(raw, list) or not raw:
        raise RecordError("missing-field", "sharegpt record needs a non-empty 'conversations' list")
    messages: list[dict] = []
    system = record.get("system")
    if system is not None and system != "":
        if not isinstance(system, str):
            raise RecordError("non-string-content", f"field 'system' is a {type(system).__name__}")
        # LLaMA-Factory: a leading system turn inside the conversation wins over the field
        if not (isinstance(raw[0], dict) and raw[0].get("from", raw[0].get("role")) == "system"):
            messages.append({"role": "system", "content": system})
    for n, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RecordError("bad-message", f"conversations[{n}] is not an object")
        tag = item.get("from", item.get("role"))
        value = item["value"] if "value" in item else item.get("content")
        if tag == "function_call":
            messages.append(_function_call_turn(value, n))
            continue
        messages.append({"role": _role(tag, n), "content": _content(value, n)})
    return Conversation(messages, _tools(record.get("tools"), wrap=True))


def _function_call_turn(value, n: int) -> dict:
    thought = ""
    if isinstance(value, str):
        text = value
        if "</think>" in text:
            # LLaMA-Factory lets a function_call start with the model's thought; keep it as the
            # turn's content, where Qwen3's template splits it off as reasoning
            cut = text.index("</think>") + len("</think>")
            thought, text = text[:cut], text[cut:]
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError("bad-tool-call", f"conversations[{n}] function_call is not JSON: {exc}") from None
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise RecordError("bad-tool-call", f"conversations[{n}] function_call holds no call")
    for call in calls:
        if not (isinstance(call, dict) and "name" in call and "arguments" in call):
            raise RecordError("bad-tool-call", f"conversations[{n}] function_call needs 'name' and 'arguments'")
    return {"role": "assistant", "content": thought, "tool_calls": [_tool_call(call, n) for call in calls]}


def _parse_string_arguments(conversation: Conversation) -> None:
    for message in conversation.messages:
        for call in message.get("tool_calls", ()):
            function = call["function"]
            if isinstance(function["arguments"], str):
                try:
                    parsed = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    function["arguments"] = parsed


# ---------------------------------------------------------------------------------------------
# validation


def validate(conversation: Conversation) -> None:
    """Raise RecordError when the conversation breaks the rules in the module docstring."""
    messages = conversation.messages
    if not messages:
        raise RecordError("no-messages", "the conversation has no messages")
    previous = None
    seen_user = False
    for n, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise RecordError("unknown-role", f"message {n} has role {role!r}")
        if not isinstance(message.get("content"), str):
            raise RecordError("non-string-content", f"message {n} content is not a string")
        if role == "system":
            if n != 0:
                raise RecordError("misplaced-system", f"system message at position {n}; only the first may be system")
        elif role == "user":
            seen_user = True
        elif role == "assistant":
            if not seen_user:
                raise RecordError("assistant-first", "an assistant turn comes before any user turn")
            if previous == "assistant":
                raise RecordError("consecutive-assistant", f"messages {n - 1} and {n} are both assistant turns")
            if not (message["content"].strip() or message.get("tool_calls") or message.get("reasoning_content")):
                raise RecordError("empty-assistant-turn", f"assistant turn at message {n} is empty")
        elif role == "tool":
            if previous == "assistant" and not messages[n - 1].get("tool_calls"):
                raise RecordError(
                    "tool-response-without-call", f"tool message {n} follows an assistant turn that made no tool call"
                )
            if previous not in ("assistant", "tool"):
                raise RecordError(
                    "misplaced-tool-response", f"tool message {n} does not follow an assistant turn or a tool message"
                )
        previous = role
    if not seen_user:
        raise RecordError("no-user-turn", "the conversation has no user turn")
    if previous != "assistant":
        if not any(m["role"] == "assistant" for m in messages):
            raise RecordError("no-assistant-turn", "the conversation has no assistant turn to train on")
        raise RecordError("trailing-non-assistant", f"the conversation ends with a {previous} message, not an assistant turn")
