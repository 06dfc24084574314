"""SFT records -> canonical conversations: formats, validation, and rendering through HF."""

from __future__ import annotations

import json

import pytest

from qwen_data.text.conversations import Conversation, detect_format, to_conversation
from qwen_data.errors import RecordError
from qwen_data.text.templates import ORACLE_FILES, get_template

try:
    from ._oracles import hf_render, load_oracle
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from _oracles import hf_render, load_oracle


def reason(record, fmt="auto", **kwargs) -> str:
    with pytest.raises(RecordError) as error:
        to_conversation(record, fmt, **kwargs)
    return error.value.reason


# ---------------------------------------------------------------------------------------------
# alpaca / Pai


def test_alpaca_joins_instruction_and_input_like_llama_factory():
    c = to_conversation({"instruction": "Translate.", "input": "你好", "output": "Hello"})
    assert c.messages == [
        {"role": "user", "content": "Translate.\n你好"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert c.tools is None
    # empty parts are skipped, not joined with a stray newline
    assert to_conversation({"instruction": "Hi", "input": "", "output": "A"}).messages[0]["content"] == "Hi"
    assert to_conversation({"instruction": "", "input": "only input", "output": "A"}).messages[0]["content"] == "only input"
    assert to_conversation({"instruction": "Hi", "output": "A"}).messages[0]["content"] == "Hi"


def test_alpaca_system_and_history():
    c = to_conversation(
        {"system": "S", "history": [["q1", "a1"], ["q2", "a2"]], "instruction": "q3", "input": "", "output": "a3"},
        "alpaca",
    )
    assert [(m["role"], m["content"]) for m in c.messages] == [
        ("system", "S"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
        ("user", "q3"),
        ("assistant", "a3"),
    ]
    assert c.assistant_indices == [2, 4, 6]
    # an empty system field is no system message: the template's default system applies
    assert to_conversation({"system": "", "instruction": "Q", "output": "A"}).messages[0]["role"] == "user"


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"instruction": "Q"}, "missing-field"),
        ({"output": "A"}, "missing-field"),
        ({"instruction": "Q", "output": ""}, "empty-assistant-turn"),
        ({"instruction": "Q", "output": " \n"}, "empty-assistant-turn"),
        ({"instruction": "Q", "output": 42}, "non-string-content"),
        ({"instruction": ["Q"], "output": "A"}, "non-string-content"),
        ({"instruction": "Q", "input": 1, "output": "A"}, "non-string-content"),
        ({"instruction": "Q", "output": "A", "system": {"x": 1}}, "non-string-content"),
        ({"instruction": "Q", "output": "A", "history": "q a"}, "bad-history"),
        ({"instruction": "Q", "output": "A", "history": [["q"]]}, "bad-history"),
        ({"instruction": "Q", "output": "A", "history": [["q", None]]}, "non-string-content"),
        ({"instruction": "Q", "output": "A", "history": [["q", ""]]}, "empty-assistant-turn"),
    ],
)
def test_alpaca_errors(record, expected):
    assert reason(record) == expected


# ---------------------------------------------------------------------------------------------
# chat


def test_chat_tool_calls_reasoning_and_tools():
    record = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18"},
            {"role": "assistant", "content": "18 degrees", "thinking": "easy"},
        ],
        "tools": json.dumps([{"type": "function", "function": {"name": "w"}}]),
    }
    c = to_conversation(record)
    assert c.messages[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}],
    }
    assert c.messages[3] == {"role": "tool", "content": "18"}
    assert c.messages[4]["reasoning_content"] == "easy"
    assert c.tools == [{"type": "function", "function": {"name": "w"}}]
    parsed = to_conversation(record, parse_tool_arguments=True)
    assert parsed.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_chat_accepts_consecutive_user_turns_and_flat_tool_calls():
    c = to_conversation(
        {
            "messages": [
                {"role": "user", "content": "one"},
                {"role": "user", "content": "two"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {}}]},
                {"role": "tool", "content": "r1"},
                {"role": "tool", "content": "r2"},
                {"role": "assistant", "content": "ok"},
            ]
        }
    )
    assert c.messages[2]["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": {}}}]


def _chat(*turns, **extra):
    return {"messages": [{"role": role, "content": content} for role, content in turns], **extra}


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"messages": []}, "missing-field"),
        ({"messages": "hi"}, "missing-field"),
        ({"messages": ["hi"]}, "bad-message"),
        (_chat(("user", "Q"), ("bot", "A")), "unknown-role"),
        ({"messages": [{"content": "Q"}]}, "unknown-role"),
        ({"messages": [{"role": "user"}, {"role": "assistant", "content": "A"}]}, "missing-field"),
        (_chat(("user", [{"type": "refusal", "refusal": "Q"}]), ("assistant", "A")), "unsupported-content-part"),
        (_chat(("user", "Q"), ("assistant", 5)), "non-string-content"),
        (_chat(("assistant", "A"), ("user", "Q"), ("assistant", "A")), "assistant-first"),
        (_chat(("system", "S"), ("assistant", "A")), "assistant-first"),
        (_chat(("user", "Q"), ("assistant", "A"), ("assistant", "B")), "consecutive-assistant"),
        (_chat(("user", "Q"), ("assistant", "A"), ("user", "Q2")), "trailing-non-assistant"),
        (_chat(("user", "Q")), "no-assistant-turn"),
        (_chat(("system", "S")), "no-user-turn"),
        (_chat(("user", "Q"), ("assistant", "")), "empty-assistant-turn"),
        (_chat(("user", "Q"), ("assistant", "\n ")), "empty-assistant-turn"),
        (_chat(("user", "Q"), ("system", "S"), ("assistant", "A")), "misplaced-system"),
        (_chat(("user", "Q"), ("tool", "r"), ("assistant", "A")), "misplaced-tool-response"),
        (_chat(("user", "Q"), ("assistant", "A"), tools=42), "bad-tools"),
        (_chat(("user", "Q"), ("assistant", "A"), tools="not json"), "bad-tools"),
        (
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]},
            "bad-tool-call",
        ),
        (
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": [1]}]}]},
            "bad-tool-call",
        ),
        (
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": {"name": "f"}}]},
            "bad-tool-call",
        ),
        (
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": 1}]},
            "non-string-content",
        ),
    ],
)
def test_chat_errors(record, expected):
    assert reason(record) == expected


def test_reasoning_alone_makes_a_turn_non_empty():
    c = to_conversation({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "reasoning_content": "r"}]})
    assert c.messages[1]["reasoning_content"] == "r"


# ---------------------------------------------------------------------------------------------
# ShareGPT


def test_sharegpt_basic_and_system_precedence():
    c = to_conversation({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": "S"})
    assert c.messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"},
    ]
    c = to_conversation(
        {
            "conversations": [{"from": "system", "value": "inner"}, {"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}],
            "system": "outer",
        },
        "sharegpt",
    )
    assert [m["content"] for m in c.messages] == ["inner", "Q", "A"]


def test_sharegpt_function_call_and_observation():
    record = {
        "conversations": [
            {"from": "human", "value": "How old am I? Born 1990-05-15."},
            {"from": "function_call", "value": '{"name": "age", "arguments": {"birthdate": "1990-05-15"}}'},
            {"from": "observation", "value": '{"age": 34}'},
            {"from": "function_call", "value": '<think>\ntwo more\n</think>\n[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'},
            {"from": "observation", "value": "r1"},
            {"from": "observation", "value": "r2"},
            {"from": "gpt", "value": "You are 34."},
        ],
        "tools": json.dumps([{"name": "age", "parameters": {"type": "object"}}, {"type": "function", "function": {"name": "a"}}]),
    }
    c = to_conversation(record)
    assert c.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "age", "arguments": {"birthdate": "1990-05-15"}}}],
    }
    assert c.messages[2] == {"role": "tool", "content": '{"age": 34}'}
    assert c.messages[3]["content"] == "<think>\ntwo more\n</think>"
    assert [call["function"]["name"] for call in c.messages[3]["tool_calls"]] == ["a", "b"]
    # bare function schemas are wrapped, as LLaMA-Factory's Qwen tool formatter does
    assert c.tools == [
        {"type": "function", "function": {"name": "age", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "a"}},
    ]
    # rendered through the official templates; the tool call line is LLaMA-Factory's json.dumps form
    for name in ("qwen2p5", "qwen3"):
        text = "".join(s.text for s in get_template(name).render(c))
        assert text == hf_render(load_oracle(ORACLE_FILES[name]), c.messages, c.tools)
        line = json.dumps({"name": "age", "arguments": {"birthdate": "1990-05-15"}}, ensure_ascii=False)
        assert f"<tool_call>\n{line}\n</tool_call>" in text
    q3 = "".join(s.text for s in get_template("qwen3").render(c))
    assert "<|im_start|>assistant\n<think>\ntwo more\n</think>\n\n<tool_call>" in q3


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"conversations": []}, "missing-field"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "bard", "value": "A"}]}, "unknown-role"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": "{oops"}]}, "bad-tool-call"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": '{"name": "f"}'}]}, "bad-tool-call"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": "[]"}]}, "bad-tool-call"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": None}]}, "missing-field"),
        ({"conversations": [{"from": "gpt", "value": "A"}]}, "assistant-first"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "observation", "value": "r"}, {"from": "gpt", "value": "A"}]}, "misplaced-tool-response"),
        ({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": 3}, "non-string-content"),
    ],
)
def test_sharegpt_errors(record, expected):
    assert reason(record) == expected


# ---------------------------------------------------------------------------------------------
# detection


def test_detect_format():
    assert detect_format({"messages": []}) == "chat"
    assert detect_format({"conversations": []}) == "sharegpt"
    assert detect_format({"instruction": "x", "output": "y"}) == "alpaca"
    assert reason({"text": "pretraining text"}) == "unknown-format"
    assert reason(["not", "a", "dict"]) == "not-an-object"
    with pytest.raises(ValueError):
        to_conversation({"messages": []}, "jsonl")


def test_forced_format_mismatch_is_a_record_error():
    assert reason({"instruction": "Q", "output": "A"}, "chat") == "missing-field"
    assert reason({"messages": [{"role": "user", "content": "Q"}]}, "alpaca") == "missing-field"


def test_conversation_is_plain_data():
    c = Conversation([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}])
    assert c.tools is None and c.assistant_indices == [1]
