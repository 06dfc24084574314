"""Seeded random conversations every template and SFT test draws from: roles, tools, tool calls,
reasoning, unicode, empty strings and literal special strings, all of which the pipeline accepts."""

from __future__ import annotations

import json
import random

from qwen_data.text.conversations import Conversation, validate


PIECES = [
    "Hello",
    "What is 2+2?",
    "  leading spaces",
    "trailing spaces  ",
    "line one\nline two",
    "\n\nleading newlines",
    "trailing newlines\n\n",
    "\n",
    " ",
    "中文内容，你好世界。",
    "日本語のテキスト",
    "مرحبا بالعالم",
    "emoji 😀👍🏽🇫🇷",
    "e\u0301 combining a\u0308\u0323",
    "\u00a0nbsp\u3000ideographic space",
    "zero\u200bwidth\ufeffbom",
    "<|im_end|>",
    "<|im_start|>user\nfake turn",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<tool_response>x</tool_response>",
    '{"json": "like", "n": 1}',
    "tab\tand\r\ncrlf",
    "{{ jinja }} {% raw %} {# c #}",
    "back\\slash \"quotes\" 'single'",
]


def _text(rng: random.Random, allow_empty: bool = True) -> str:
    if allow_empty and rng.random() < 0.08:
        return ""
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))


def _solid_text(rng: random.Random) -> str:
    """Non-blank text, for turns that must carry something."""
    return _text(rng, allow_empty=False) + rng.choice(["ok", "回答", "✓", "done."])


def _json_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        return rng.choice(["Paris", "東京", "😀", "a\"b\\c", "", "<|im_end|>", "line\nbreak", "café"])
    if kind == 1:
        return rng.randint(-5, 10**6)
    if kind == 2:
        return rng.choice([0.5, 1e-7, 3.0, -2.25])
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind in (5, 6):
        # keys deliberately out of sorted order: tojson must keep insertion order
        return {key: _json_value(rng, depth + 1) for key in rng.sample(["zeta", "alpha", "ключ", "キー", "b"], 2)}
    return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _tools(rng: random.Random) -> list[dict]:
    tools = []
    for n in range(rng.randint(1, 3)):
        function = {
            "name": f"tool_{n}_{rng.choice(['weather', 'search', 'calc'])}",
            "description": rng.choice(["Get weather", "搜索网页", "حساب", "emoji 🌦", ""]),
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City, e.g. \"Paris\""}},
                "required": ["city"],
            },
        }
        if rng.random() < 0.2:
            tools.append(function)  # bare schema, passed through as is
        else:
            tools.append({"type": "function", "function": function})
    return tools


def _arguments(rng: random.Random):
    r = rng.random()
    if r < 0.5:
        return {key: _json_value(rng) for key in rng.sample(["city", "unit", "q", "日付", "n"], rng.randint(0, 3))}
    if r < 0.75:
        return json.dumps({"city": rng.choice(["Paris", "北京"])}, ensure_ascii=rng.random() < 0.5)
    if r < 0.9:
        return '{"compact":true,"x":[1,2]}'
    return "not json at all"


def _tool_call(rng: random.Random) -> dict:
    name = rng.choice(["get_weather", "search", "计算"])
    if rng.random() < 0.15:
        return {"name": name, "arguments": _arguments(rng)}  # flat shape: templates accept it too
    return {"type": "function", "function": {"name": name, "arguments": _arguments(rng)}}


def _reasoned(rng: random.Random, message: dict) -> dict:
    r = rng.random()
    if r < 0.3:
        message["reasoning_content"] = rng.choice(["", "\n", "\nplan\n\n", "思考一下", "step 1\nstep 2"]) + (
            _text(rng) if rng.random() < 0.5 else ""
        )
    elif r < 0.55:
        thought = rng.choice(["", "\n", "reason", "\n多行\n推理\n"])
        opener = rng.choice(["<think>", "<think>\n", ""])
        separator = rng.choice(["", "\n", "\n\n"])
        message["content"] = opener + thought + "</think>" + separator + message["content"]
        if rng.random() < 0.1:
            message["content"] += "</think>tail"  # the template keeps what follows the last </think>
    return message


def random_conversation(rng: random.Random, *, tools: bool, reasoning: bool) -> Conversation:
    messages: list[dict] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _text(rng)})
    wrapper_users = rng.random() < 0.05  # every user turn looks like a tool response (Qwen3 edge)
    for _ in range(rng.randint(1, 3)):
        for _ in range(1 if rng.random() < 0.85 else 2):
            if wrapper_users or rng.random() < 0.07:
                content = "<tool_response>" + _text(rng) + "</tool_response>"
            else:
                content = _text(rng)
            messages.append({"role": "user", "content": content})
        for _ in range(rng.randint(0, 2) if tools else 0):
            call = {"role": "assistant", "content": _text(rng) if rng.random() < 0.4 else ""}
            call["tool_calls"] = [_tool_call(rng) for _ in range(rng.randint(1, 3))]
            messages.append(_reasoned(rng, call) if reasoning else call)
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "tool", "content": _text(rng)})
        answer = {"role": "assistant", "content": _solid_text(rng)}
        messages.append(_reasoned(rng, answer) if reasoning else answer)
    conversation = Conversation(messages, _tools(rng) if tools and rng.random() < 0.8 else None)
    validate(conversation)  # the generator only makes conversations the pipeline accepts
    return conversation


def conversations(seed: int, count: int, *, tools: bool, reasoning: bool) -> list[Conversation]:
    rng = random.Random(seed)
    return [random_conversation(rng, tools=tools, reasoning=reasoning) for _ in range(count)]
