"""The reference's own reading of an SFT record: the record as its line or row holds it → the messages
and tools the official template takes, by the mapping docs/pretrain-and-sft.md documents.

It is written apart from `text.conversations`, which the certificate checks rather than trusts: a
record our parser reads wrongly (a system prompt dropped, an alpaca input joined otherwise) renders
otherwise here, and the run stops. It maps only what the documents say and the template cannot take
as it is; a record that needs more (our parser's undocumented leniencies: role aliases in `messages`,
`from`/`value` keys there, a tool call's `parameters`, a `tools` object) is `NotMappable`, counted
apart and never called checked.

- chat: `messages` as they are, `tools` as they are; content given as a list of text parts is the
  parts' texts joined with nothing between them.
- alpaca: [system (when non-empty)], the `history` pairs as user and assistant turns, the user turn
  (instruction and input, the non-empty ones, joined by the run's --input-separator), the output.
- ShareGPT: `conversations` of `from`/`value`: human/user → user, gpt/assistant → assistant,
  system, observation/tool → tool; `function_call` → an assistant turn whose `tool_calls` are the
  value's JSON (one call or a list, each with name and arguments), content the `<think>…</think>`
  thought it may start with; the `system` field first unless the first turn is a system turn;
  `tools` a list or its JSON text, a bare function schema wrapped as {"type": "function", ...}.
- `tools` given as JSON text is read (both formats); with --parse-tool-arguments, tool-call
  arguments that are JSON text of an object become that object, as the run read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool"}


class NotMappable(ValueError):
    """The record needs more than the documented mapping to become the template's messages (or the
    template refuses them)."""


def read_record(source):
    """The record a worker handed over: its jsonl line (or .json element) read here, by Python's own
    parser, or the row (or the record --columns made) as it was before our parser saw it."""
    if not isinstance(source, bytes):
        return source
    try:
        return json.loads(source)
    except ValueError:
        raise NotMappable("the line is not JSON to Python's json module") from None


@dataclass(frozen=True)
class RecordReading:
    """The run's settings that decide how a record reads: --format, --input-separator,
    --parse-tool-arguments."""

    format: str = "auto"
    input_separator: str = "\n"
    parse_arguments: bool = False

    def messages(self, record) -> tuple[list[dict], list | None]:
        """(messages, tools) of a record, or NotMappable."""
        if not isinstance(record, dict):
            raise NotMappable("the record is not a JSON object")
        kind = self.format if self.format != "auto" else detected(record)
        if kind == "chat":
            messages, tools = _chat(record)
        elif kind == "sharegpt":
            messages, tools = _sharegpt(record)
        else:
            messages, tools = _alpaca(record, self.input_separator), None
        if self.parse_arguments:
            messages = [_arguments_parsed(message) for message in messages]
        return messages, tools


def detected(record: dict) -> str:
    """The record's format by its keys, in the documented order."""
    if "messages" in record:
        return "chat"
    if "conversations" in record:
        return "sharegpt"
    if "instruction" in record or "output" in record:
        return "alpaca"
    raise NotMappable("none of messages, conversations, instruction or output")


def _chat(record: dict) -> tuple[list[dict], list | None]:
    given = record.get("messages")
    if not isinstance(given, list):
        raise NotMappable("`messages` is not a list")
    messages = []
    for message in given:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise NotMappable("a message without one of the roles system, user, assistant, tool")
        if "content" not in message and not message.get("tool_calls"):
            raise NotMappable("a message without content")
        if message["role"] == "assistant":
            for call in message.get("tool_calls") or ():
                _check_call(call)
        if isinstance(message.get("content"), list):
            message = {**message, "content": _joined(message["content"])}
        messages.append(message)
    return messages, _tools(record.get("tools"), wrap=False)


def _check_call(call) -> None:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not (isinstance(function, dict) and "name" in function and "arguments" in function):
        raise NotMappable("a tool call without a name and arguments")


def _joined(parts: list) -> str:
    """Content given as text parts: their texts, nothing between them (the documented mapping)."""
    texts = []
    for part in parts:
        text = part.get("text", part.get("value")) if isinstance(part, dict) and part.get("type") == "text" else None
        if not isinstance(text, str):
            raise NotMappable("a content part that is not text")
        texts.append(text)
    return "".join(texts)


def _tools(tools, wrap: bool) -> list | None:
    if tools is None or tools == "":
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise NotMappable("`tools` is text but not JSON") from None
    if not isinstance(tools, list):
        raise NotMappable("`tools` is not a list")
    if wrap:  # LLaMA-Factory's convention for ShareGPT: a bare function schema is the function
        tools = [t if not isinstance(t, dict) or t.get("type") == "function" else {"type": "function", "function": t}
                 for t in tools]
    return tools or None


def _alpaca(record: dict, separator: str) -> list[dict]:
    instruction, query, output = record.get("instruction"), record.get("input"), record.get("output")
    query = "" if query is None else query  # no input: the instruction alone
    if not all(isinstance(text, str) for text in (instruction, query, output)):
        raise NotMappable("instruction, input or output is not text")
    messages = []
    if record.get("system") not in (None, ""):
        messages.append({"role": "system", "content": record["system"]})
    for pair in record.get("history") or ():
        if not (isinstance(pair, list) and len(pair) == 2):
            raise NotMappable("a history entry that is not a [user, assistant] pair")
        messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    messages.append({"role": "user", "content": separator.join(text for text in (instruction, query) if text)})
    messages.append({"role": "assistant", "content": output})
    return messages


def _sharegpt(record: dict) -> tuple[list[dict], list | None]:
    turns = record.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) and "from" in t and "value" in t for t in turns):
        raise NotMappable("`conversations` is not a list of from/value turns")
    messages = []
    if record.get("system") not in (None, "") and not (turns and turns[0]["from"] == "system"):
        messages.append({"role": "system", "content": record["system"]})
    for turn in turns:
        tag, value = turn["from"], turn["value"]
        if tag == "function_call":
            messages.append(_function_call(value))
        elif tag in SHAREGPT_ROLES:
            messages.append({"role": SHAREGPT_ROLES[tag], "content": _joined(value) if isinstance(value, list)
                             else value})
        else:
            raise NotMappable(f"a turn from {tag!r}")
    return messages, _tools(record.get("tools"), wrap=True)


def _function_call(value) -> dict:
    """A ShareGPT function_call turn: its calls, after the thought it may start with."""
    thought = ""
    if isinstance(value, str):
        cut = value.find("</think>")
        if cut >= 0:
            thought, value = value[:cut + len("</think>")], value[cut + len("</think>"):]
        try:
            value = json.loads(value)
        except ValueError:
            raise NotMappable("a function_call that is not JSON") from None
    calls = value if isinstance(value, list) else [value]
    for call in calls:
        _check_call(call)
    return {"role": "assistant", "content": thought, "tool_calls": calls}


def _arguments_parsed(message: dict) -> dict:
    """--parse-tool-arguments: a call's arguments given as JSON text of an object, as that object."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = call.get("function", call)
        arguments = function["arguments"]
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            function = {**function, "arguments": parsed}
            call = {**call, "function": function} if "function" in call else function
        calls.append(call)
    return {**message, "tool_calls": calls}
