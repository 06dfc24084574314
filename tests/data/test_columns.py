"""Column mapping: --columns renames and LLaMA-Factory dataset_info.json entries -> canonical records."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from qwen_data.inputs.columns import ColumnMap, parse_columns, read_dataset_info
from qwen_data.text.conversations import to_conversation
from qwen_data.errors import RecordError

ALPACA_ENTRY = {
    "file_name": "qa.jsonl",
    "columns": {"prompt": "question", "query": "context", "response": "answer",
                "system": "sys_prompt", "history": "past"},
}
SHAREGPT_ENTRY = {
    "file_name": "chats",  # a folder, as LLaMA-Factory allows
    "formatting": "sharegpt",
    "columns": {"messages": "dialog", "system": "sys_prompt", "tools": "tool_list"},
    "tags": {"role_tag": "role", "content_tag": "text", "user_tag": "user", "assistant_tag": "bot",
             "system_tag": "sys", "observation_tag": "tool_result", "function_tag": "call"},
}

WEATHER_TOOL = {"name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
WEATHER_CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})


@pytest.fixture
def info(tmp_path):
    """A dataset_info.json with LLaMA-Factory-style entries, and the data they point at."""
    (tmp_path / "qa.jsonl").write_text("{}\n")
    (tmp_path / "chats").mkdir()
    (tmp_path / "chats" / "part-0.jsonl").write_text("{}\n")
    entries = {
        "qa": ALPACA_ENTRY,
        "chat": SHAREGPT_ENTRY,
        "plain": {"file_name": "qa.jsonl"},
        "prompt_response_only": {"file_name": "qa.jsonl", "columns": {"prompt": "instruction", "response": "output"}},
        "pictures": {"file_name": "qa.jsonl", "formatting": "sharegpt", "columns": {"messages": "conversations", "images": "pics"}},
        "default_sharegpt": {"file_name": "qa.jsonl", "formatting": "sharegpt"},
        "hub": {"hf_hub_url": "org/dataset", "subset": "en", "formatting": "sharegpt"},
        "hub_split": {"hf_hub_url": "org/dataset", "split": "train_sft", "folder": "data", "ms_hub_url": "ms/dataset"},
        "openai": {"file_name": "qa.jsonl", "formatting": "openai", "columns": {"messages": "messages", "tools": "tools"},
                   "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                            "system_tag": "system", "observation_tag": "tool"}},
    }
    path = tmp_path / "dataset_info.json"
    path.write_text(json.dumps(entries))
    return str(path)


def same_conversation(mapping: ColumnMap, record: dict, canonical: dict, fmt: str) -> None:
    assert mapping.apply(record) == canonical
    got = to_conversation(mapping.apply(record), mapping.format)
    want = to_conversation(canonical, fmt)
    assert (got.messages, got.tools) == (want.messages, want.tools)


def record_error(mapping: ColumnMap, record: dict) -> RecordError:
    with pytest.raises(RecordError) as error:
        mapping.apply(record)
    return error.value


# ---------------------------------------------------------------------------------------------
# --columns


def test_parse_columns_renames_named_keys_and_passes_the_rest():
    mapping = parse_columns(" instruction = prompt , output=answer")
    assert mapping.format is None
    assert (mapping.location, mapping.split, mapping.subset) == (None, None, None)
    assert mapping.columns_read() is None
    record = {"prompt": "Q", "answer": "A", "input": "ctx", "id": 7}
    assert mapping.apply(record) == {"instruction": "Q", "output": "A", "input": "ctx", "id": 7}
    assert record == {"prompt": "Q", "answer": "A", "input": "ctx", "id": 7}  # not modified in place
    assert to_conversation(mapping.apply(record)).messages == [
        {"role": "user", "content": "Q\nctx"}, {"role": "assistant", "content": "A"}]


def test_parse_columns_target_comes_only_from_its_source():
    mapping = parse_columns("instruction=prompt,output=answer,system=sys")
    # the record's own 'instruction' and 'system' are replaced, not mixed in
    assert mapping.apply({"prompt": "Q", "answer": "A", "instruction": "old", "system": "old sys"}) == {
        "instruction": "Q", "output": "A"}
    # two columns swapped
    swap = parse_columns("instruction=output,output=instruction")
    assert swap.apply({"instruction": "A", "output": "Q"}) == {"instruction": "Q", "output": "A"}
    chat = parse_columns("messages=turns")
    assert chat.apply({"turns": [{"role": "user", "content": "hi"}]}) == {"messages": [{"role": "user", "content": "hi"}]}


def test_parse_columns_missing_required_source_names_it():
    mapping = parse_columns("instruction=prompt,output=answer,input=ctx")
    error = record_error(mapping, {"prompt": "Q", "instruction": "Q"})
    assert (error.reason, str(error)) == ("missing-field", "no 'answer' column (mapped to output)")
    assert record_error(mapping, {"prompt": None, "answer": "A"}).reason == "missing-field"
    # an optional one may be absent
    assert mapping.apply({"prompt": "Q", "answer": "A"}) == {"instruction": "Q", "output": "A"}


@pytest.mark.parametrize("text, message", [
    ("", "--columns is empty"),
    ("   ", "--columns is empty"),
    ("instruction", "has no '='"),
    ("prompt=instruction", "unknown canonical name 'prompt'"),
    ("images=pics", "unknown canonical name 'images'"),
    ("instruction=", "names no source column"),
    ("instruction=a,,output=b", "empty item"),
    ("instruction=a,", "empty item"),
    ("instruction=a,instruction=b", "maps 'instruction' twice"),
    ("instruction=a,input=a", "reads column 'a' twice"),
])
def test_parse_columns_refuses_bad_specs(text, message):
    with pytest.raises(ValueError, match=message):
        parse_columns(text)


# ---------------------------------------------------------------------------------------------
# dataset_info.json: alpaca


def test_alpaca_entry_location_and_columns(info):
    mapping = read_dataset_info(info + ":qa")
    assert mapping.format == "alpaca"
    assert mapping.location == os.path.join(os.path.dirname(info), "qa.jsonl")
    assert os.path.isabs(mapping.location)
    assert (mapping.split, mapping.subset) == (None, None)
    assert mapping.columns_read() == ["question", "context", "answer", "sys_prompt", "past"]
    # FILE may be the folder holding dataset_info.json (LLaMA-Factory's dataset_dir)
    assert read_dataset_info(os.path.dirname(info) + ":qa") == mapping
    # picklable (sent to worker processes) and still working after the trip
    copy = pickle.loads(pickle.dumps(mapping))
    assert copy == mapping
    assert copy.apply({"question": "Q", "answer": "A"}) == {"instruction": "Q", "output": "A"}


@pytest.mark.parametrize("record, canonical", [
    ({"question": "Q", "context": "C", "answer": "A"}, {"instruction": "Q", "input": "C", "output": "A"}),
    # system and history through their renamed columns; the unmapped keys are ignored
    ({"question": "Q3", "context": "", "answer": "A3", "sys_prompt": "Be brief.", "past": [["Q1", "A1"], ["Q2", "A2"]],
      "system": "ignored", "instruction": "ignored", "output": "ignored", "history": [["x", "y"]]},
     {"instruction": "Q3", "output": "A3", "system": "Be brief.", "history": [["Q1", "A1"], ["Q2", "A2"]]}),
    # mapped optional columns that are absent or None are absent
    ({"question": "Q", "answer": "A", "sys_prompt": None, "past": None}, {"instruction": "Q", "output": "A"}),
    # an empty prompt counts as absent: the user turn is the query alone
    ({"question": "", "context": "only context", "answer": "A"}, {"instruction": "", "input": "only context", "output": "A"}),
])
def test_alpaca_entry_gives_the_canonical_record(info, record, canonical):
    same_conversation(read_dataset_info(info + ":qa"), record, canonical, "alpaca")


def test_alpaca_entry_conversation(info):
    mapping = read_dataset_info(info + ":qa")
    record = {"question": "Q2", "context": "C", "answer": "A2", "sys_prompt": "S", "past": [["Q1", "A1"]], "system": "X"}
    assert to_conversation(mapping.apply(record), mapping.format).messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2\nC"},
        {"role": "assistant", "content": "A2"},
    ]


def test_alpaca_defaults_without_columns_ignore_system_and_history(info):
    # no "columns": LLaMA-Factory's defaults instruction/input/output, and no system or history column
    mapping = read_dataset_info(info + ":plain")
    assert mapping.columns_read() == ["instruction", "input", "output"]
    record = {"instruction": "Q", "input": "C", "output": "A", "system": "S", "history": [["q", "a"]], "tools": "[]"}
    same_conversation(mapping, record, {"instruction": "Q", "input": "C", "output": "A"}, "alpaca")


def test_alpaca_columns_object_unsets_unlisted_defaults(info):
    # LLaMA-Factory reads each column from "columns" with no fallback: 'query' is unset here
    mapping = read_dataset_info(info + ":prompt_response_only")
    assert mapping.columns_read() == ["instruction", "output"]
    assert mapping.apply({"instruction": "Q", "input": "C", "output": "A"}) == {"instruction": "Q", "output": "A"}


def test_alpaca_missing_required_column(info):
    mapping = read_dataset_info(info + ":qa")
    error = record_error(mapping, {"question": "Q", "output": "A"})
    assert (error.reason, str(error)) == ("missing-field", "no 'answer' column (mapped to output)")
    error = record_error(mapping, {"instruction": "Q", "answer": "A", "question": None})
    assert (error.reason, str(error)) == ("missing-field", "no 'question' column (mapped to instruction)")


def test_alpaca_history_that_is_not_a_list_is_rejected(info):
    mapping = read_dataset_info(info + ":qa")
    with pytest.raises(RecordError) as error:
        to_conversation(mapping.apply({"question": "Q", "answer": "A", "past": "[[\"q\", \"a\"]]"}), mapping.format)
    assert error.value.reason == "bad-history"


# ---------------------------------------------------------------------------------------------
# dataset_info.json: sharegpt with custom tags


def test_sharegpt_entry_location_and_columns(info):
    mapping = read_dataset_info(info + ":chat")
    assert mapping.format == "sharegpt"
    assert mapping.location == os.path.join(os.path.dirname(info), "chats")
    assert os.path.isdir(mapping.location)
    assert mapping.columns_read() == ["dialog", "sys_prompt", "tool_list"]
    assert pickle.loads(pickle.dumps(mapping)) == mapping


def turn(role, text):
    return {"role": role, "text": text}


@pytest.mark.parametrize("record, canonical", [
    ({"dialog": [turn("user", "hi"), turn("bot", "hello")], "conversations": [{"from": "human", "value": "ignored"}]},
     {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}),
    # the system column, and a multi-turn dialog
    ({"dialog": [turn("user", "q1"), turn("bot", "a1"), turn("user", "q2"), turn("bot", "a2")], "sys_prompt": "S"},
     {"system": "S", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                                       {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]}),
    # a leading system-tag message wins over the system column
    ({"dialog": [turn("sys", "from the dialog"), turn("user", "q"), turn("bot", "a")], "sys_prompt": "column"},
     {"conversations": [{"from": "system", "value": "from the dialog"}, {"from": "human", "value": "q"},
                        {"from": "gpt", "value": "a"}]}),
    # an empty leading system message is no system prompt; the column stays unread
    ({"dialog": [turn("sys", ""), turn("user", "q"), turn("bot", "a")], "sys_prompt": "column"},
     {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}),
    # a tool call and its observation, with the tools column
    ({"dialog": [turn("user", "Weather in Paris?"), turn("call", WEATHER_CALL), turn("tool_result", '{"temp": 21}'),
                 turn("bot", "21 degrees.")], "tool_list": json.dumps([WEATHER_TOOL])},
     {"tools": json.dumps([WEATHER_TOOL]),
      "conversations": [{"from": "human", "value": "Weather in Paris?"}, {"from": "function_call", "value": WEATHER_CALL},
                        {"from": "observation", "value": '{"temp": 21}'}, {"from": "gpt", "value": "21 degrees."}]}),
])
def test_sharegpt_entry_gives_the_canonical_record(info, record, canonical):
    same_conversation(read_dataset_info(info + ":chat"), record, canonical, "sharegpt")


def test_sharegpt_tool_call_conversation(info):
    mapping = read_dataset_info(info + ":chat")
    record = {"dialog": [turn("sys", "S"), turn("user", "Weather?"), turn("call", WEATHER_CALL),
                         turn("tool_result", "sunny"), turn("bot", "Sunny.")], "tool_list": [WEATHER_TOOL]}
    c = to_conversation(mapping.apply(record), mapping.format)
    assert c.messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert c.tools == [{"type": "function", "function": WEATHER_TOOL}]


def test_sharegpt_unknown_role_tag(info):
    mapping = read_dataset_info(info + ":chat")
    # 'assistant' is a role conversations.py knows, but not one of this entry's tags
    error = record_error(mapping, {"dialog": [turn("user", "q"), turn("assistant", "a")]})
    assert error.reason == "unknown-role"
    assert "dialog[1]" in str(error) and "'assistant'" in str(error)
    assert record_error(mapping, {"dialog": [{"text": "q"}, turn("bot", "a")]}).reason == "unknown-role"


@pytest.mark.parametrize("dialog, reason, where", [
    ([turn("user", "q1"), turn("user", "q2"), turn("bot", "a")], "non-alternating", "dialog[1] is 'user'"),
    ([turn("bot", "a"), turn("user", "q")], "non-alternating", "dialog[0] is 'bot'"),
    ([turn("user", "q"), turn("bot", "a"), turn("bot", "b"), turn("user", "q2")], "non-alternating", "dialog[2] is 'bot'"),
    ([turn("user", "q"), turn("sys", "S"), turn("bot", "a")], "non-alternating", "may only come first"),
    ([turn("user", "q"), turn("bot", "a"), turn("user", "q2")], "trailing-non-assistant", "odd number of turns (3)"),
    ([turn("sys", "S")], "no-messages", "no conversation turns"),
    ([], "no-messages", "no conversation turns"),
])
def test_sharegpt_refuses_what_llama_factory_drops(info, dialog, reason, where):
    error = record_error(read_dataset_info(info + ":chat"), {"dialog": dialog})
    assert error.reason == reason
    assert where in str(error)


def test_sharegpt_record_errors_name_the_source(info):
    mapping = read_dataset_info(info + ":chat")
    error = record_error(mapping, {"conversations": [{"from": "human", "value": "q"}]})
    assert (error.reason, str(error)) == ("missing-field", "no 'dialog' column (mapped to conversations)")
    assert record_error(mapping, {"dialog": "q"}).reason == "bad-message"
    assert record_error(mapping, {"dialog": [turn("user", "q"), "a"]}).reason == "bad-message"
    error = record_error(mapping, {"dialog": [turn("user", "q"), {"role": "bot", "value": "a"}]})
    assert (error.reason, str(error)) == ("missing-field", "dialog[1] has no 'text'")


def test_sharegpt_defaults_without_tags(info):
    mapping = read_dataset_info(info + ":default_sharegpt")
    assert mapping.columns_read() == ["conversations"]
    record = {"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "q"},
                                {"from": "gpt", "value": "a"}], "system": "unmapped", "tools": "unmapped"}
    same_conversation(mapping, record, {"conversations": record["conversations"]}, "sharegpt")


def test_mapped_media_columns_reach_the_multimodal_check(info):
    mapping = read_dataset_info(info + ":pictures")
    dialog = [{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "A cat."}]
    assert mapping.apply({"conversations": dialog, "pics": ["cat.png"]})["images"] == ["cat.png"]
    with pytest.raises(RecordError) as error:
        to_conversation(mapping.apply({"conversations": dialog, "pics": ["cat.png"]}), mapping.format)
    assert error.value.reason == "multimodal"
    # empty or absent media: a text record
    assert len(to_conversation(mapping.apply({"conversations": dialog, "pics": []}), mapping.format).messages) == 2
    assert "images" not in mapping.apply({"conversations": dialog})


# ---------------------------------------------------------------------------------------------
# dataset_info.json: openai formatting


def test_openai_entry_tool_calls_and_joined_observations(info):
    mapping = read_dataset_info(info + ":openai")
    assert mapping.format == "sharegpt"
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    record = {"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": call},
                                                              {"type": "function", "function": call}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rainy"},  # joined with the one before: alternation still holds
        {"role": "assistant", "content": "Sunny, then rainy."},
    ], "tools": [WEATHER_TOOL]}
    canonical = {"tools": [WEATHER_TOOL], "conversations": [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "Weather in Paris and Rome?"},
        {"from": "function_call", "value": [call, call]},
        {"from": "observation", "value": "sunny"},
        {"from": "observation", "value": "rainy"},
        {"from": "gpt", "value": "Sunny, then rainy."},
    ]}
    same_conversation(mapping, record, canonical, "sharegpt")
    assert [m["role"] for m in to_conversation(mapping.apply(record), mapping.format).messages] == [
        "system", "user", "assistant", "tool", "tool", "assistant"]
    # the system prompt is not extended (LLaMA-Factory's openai converter appends "detailed thinking off")
    assert to_conversation(mapping.apply(record), mapping.format).messages[0]["content"] == "S"
    error = record_error(mapping, {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]})
    assert (error.reason, "messages[1] is 'tool'" in str(error)) == ("non-alternating", True)


# ---------------------------------------------------------------------------------------------
# dataset_info.json: where the data is, and bad entries


def test_hub_entries(info):
    hub = read_dataset_info(info + ":hub")
    assert (hub.location, hub.split, hub.subset, hub.folder, hub.format) == ("hf:org/dataset", "train", "en", None, "sharegpt")
    # hf_hub_url wins over ms_hub_url, as in LLaMA-Factory without USE_MODELSCOPE_HUB
    hub = read_dataset_info(info + ":hub_split")
    assert (hub.location, hub.split, hub.subset, hub.folder) == ("hf:org/dataset", "train_sft", None, "data")


def write_info(tmp_path, entries) -> str:
    (tmp_path / "d.json").write_text("{}\n")
    path = tmp_path / "dataset_info.json"
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.mark.parametrize("entry, message", [
    ({"file_name": "d.json", "ranking": True, "columns": {"prompt": "p", "chosen": "c", "rejected": "r"}}, "ranking: true"),
    ({"file_name": "d.json", "formatting": "sharegpt", "columns": {"messages": "m", "kto_tag": "label"}}, "KTO"),
    ({"file_name": "d.json", "formatting": "xml"}, "formatting 'xml' is not supported"),
    ({"script_url": "my_script"}, "script_url is not supported"),
    ({"ms_hub_url": "ms/data"}, "ms_hub_url is not supported"),
    ({"om_hub_url": "om/data"}, "om_hub_url is not supported"),
    ({"cloud_file_name": "s3://bucket/d.json"}, "cloud_file_name is not supported"),
    ({"file_name": "d.json", "num_samples": 10}, "num_samples"),
    ({"file_name": "absent.json"}, "file_name 'absent.json' not found"),
    ({"formatting": "alpaca"}, "the entry has none of"),
    ({"file_name": "d.json", "columns": {"prompt": "text"}}, "maps no response column"),
    ({"file_name": "d.json", "formatting": "sharegpt", "columns": {"system": "s"}}, "maps no messages column"),
    ({"file_name": "d.json", "columns": {"promt": "q", "response": "a"}}, "unknown columns 'promt'"),
    ({"file_name": "d.json", "formatting": "sharegpt", "tags": {"role": "r"}}, "unknown tags 'role'"),
    ({"file_name": "d.json", "formatting": "sharegpt", "tags": {"user_tag": "u"}}, "no tags.role_tag"),
    ({"file_name": "d.json", "columns": ["prompt"]}, "columns must be an object"),
    ("d.json", "not an object"),
])
def test_bad_entries_are_refused_naming_the_entry(tmp_path, entry, message):
    path = write_info(tmp_path, {"mine": entry})
    with pytest.raises(ValueError, match="mine") as error:
        read_dataset_info(path + ":mine")
    assert message in str(error.value)


def test_bad_dataset_info_files(tmp_path):
    with pytest.raises(ValueError, match=r"no such file .*nowhere\.json") as error:
        read_dataset_info(str(tmp_path / "nowhere.json") + ":qa")
    assert ":qa" in str(error.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"qa": {')
    with pytest.raises(ValueError, match=r"broken\.json:qa: .*not valid JSON"):
        read_dataset_info(f"{broken}:qa")
    names = {f"set{i}": {"file_name": "d.json"} for i in range(10)}
    path = write_info(tmp_path, names)
    with pytest.raises(ValueError) as error:
        read_dataset_info(path + ":missing")
    assert "no entry 'missing'" in str(error.value)
    assert "'set0', 'set1'" in str(error.value) and "and 2 more" in str(error.value)
    for spec in (path, path + ":", ":qa"):
        with pytest.raises(ValueError, match="expected FILE:NAME"):
            read_dataset_info(spec)
