"""SFT input shapes: content-part lists, multimodal records, tool responses without a call.

End to end through `qwen-data sft`, read back with megatron-core; ids compared with transformers'
`apply_chat_template` on the official templates, rejects read from PREFIX.rejects.jsonl.
"""

import json

import pytest

from qwen_data.cli import main
from _helpers import hf_ids, write_jsonl


def sft(src, prefix, template):
    return main(["sft", "--quiet", str(src), "-o", str(prefix), "--template", template])


def read_samples(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ids, mask = IndexedDataset(str(prefix)), IndexedDataset(str(prefix) + ".lossmask")
    return [ids[i].tolist() for i in range(len(ids))], [mask[i].tolist() for i in range(len(mask))]


def read_rejects(prefix):
    """{record number: (reason, message)}; every entry names its file."""
    rejects = {}
    with open(f"{prefix}.rejects.jsonl", encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            assert entry["file"] and entry["message"]
            rejects[entry.get("line", entry.get("record"))] = (entry["reason"], entry["message"])
    return rejects


def parts(*texts, key="text"):
    return [{"type": "text", key: text} for text in texts]


CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]

# (record with content parts, the same conversation as plain strings: parts joined with nothing between)
JOINED = [
    (  # OpenAI parts in every role, a separator inside the parts, a part that is empty
        {"messages": [
            {"role": "system", "content": parts("You are ", "terse.")},
            {"role": "user", "content": parts("Weather in ", "Paris?\n", "", "Answer in French.")},
            {"role": "assistant", "content": parts("Let me look."), "tool_calls": [CALL]},
            {"role": "tool", "content": parts('{"temp": ', "18}")},
            {"role": "assistant", "content": parts("Il fait ", "18 degrés.")},
        ], "tools": TOOLS},
        {"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?\nAnswer in French."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"temp": 18}'},
            {"role": "assistant", "content": "Il fait 18 degrés."},
        ], "tools": TOOLS},
    ),
    (  # LLaMA-Factory's {"type": "text", "value"} parts; no separator is added between parts
        {"messages": [
            {"role": "user", "content": parts("数据", "模型", key="value")},
            {"role": "assistant", "content": parts("a", "b", key="value")},
        ]},
        {"messages": [{"role": "user", "content": "数据模型"}, {"role": "assistant", "content": "ab"}]},
    ),
    (  # ShareGPT values as part lists
        {"conversations": [{"from": "human", "value": parts("Hi ", "there")},
                           {"from": "gpt", "value": parts("Hello", "!")}]},
        {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]},
    ),
]


@pytest.mark.parametrize("template", ["qwen2p5", "qwen3"])
def test_text_parts_are_joined_into_the_text_the_model_sees(tmp_path, template):
    src = write_jsonl(tmp_path / "parts.jsonl", [record for record, _ in JOINED])
    assert sft(src, tmp_path / "parts", template) == 0
    ids, _ = read_samples(tmp_path / "parts")
    assert ids == [hf_ids(template, joined)["input_ids"] for _, joined in JOINED]


GOOD = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def chat_with_user_parts(*user_parts):
    return {"messages": [{"role": "user", "content": list(user_parts)}, {"role": "assistant", "content": "a"}]}


def test_parts_that_are_not_text_are_rejected_not_skipped(tmp_path):
    lines = [
        GOOD,
        chat_with_user_parts({"type": "text", "text": "q"}, {"type": "refusal", "refusal": "no"}),  # 2
        chat_with_user_parts({"type": "input_text", "text": "q"}),  # 3 text-like, another API's type
        chat_with_user_parts({"text": "q"}),  # 4 no type
        chat_with_user_parts({"type": "text", "text": ["q"]}),  # 5
        chat_with_user_parts("q"),  # 6 a bare string as a part
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]},  # 7
    ]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    assert sft(src, tmp_path / "out", "qwen2p5") == 0
    reasons = {line: reason for line, (reason, _) in read_rejects(tmp_path / "out").items()}
    assert reasons == {2: "unsupported-content-part", 3: "unsupported-content-part", 4: "unsupported-content-part",
                       5: "bad-content-part", 6: "bad-content-part", 7: "unsupported-content-part"}
    assert read_samples(tmp_path / "out")[0] == [hf_ids("qwen2p5", GOOD)["input_ids"]]


def test_multimodal_records_are_rejected_in_every_format(tmp_path):
    image_url = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    lines = [
        GOOD,
        chat_with_user_parts({"type": "text", "text": "What is this?"}, image_url),  # 2 OpenAI
        chat_with_user_parts({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),  # 3
        chat_with_user_parts({"type": "video_url", "video_url": {"url": "v.mp4"}}),  # 4
        chat_with_user_parts({"type": "image", "image": "cat.jpg"}, {"type": "text", "text": "q"}),  # 5 Qwen-VL
        {"messages": [{"role": "user", "content": "<image>What is this?"}, {"role": "assistant", "content": "A cat."}],
         "images": ["cat.jpg"]},  # 6 LLaMA-Factory mllm, chat
        {"conversations": [{"from": "human", "value": "<video>Describe."}, {"from": "gpt", "value": "A dog."}],
         "videos": ["dog.mp4"]},  # 7 sharegpt
        {"instruction": "<audio>Transcribe.", "output": "hello", "audios": ["a.wav"]},  # 8 alpaca
        {"id": "1", "image": "coco/1.jpg",
         "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A bus."}]},  # 9 LLaVA
        {"instruction": "Say hi", "output": "hi", "images": []},  # 10 no media at all: kept
    ]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    assert sft(src, tmp_path / "out", "qwen2p5") == 0
    rejects = read_rejects(tmp_path / "out")
    assert sorted(rejects) == list(range(2, 10))
    assert all(reason == "multimodal" and "text-only" in message for reason, message in rejects.values())
    kept = {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}
    assert read_samples(tmp_path / "out")[0] == [hf_ids("qwen2p5", r)["input_ids"] for r in (GOOD, kept)]


def test_tool_response_needs_a_tool_call(tmp_path):
    call_turn = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    answered = {"messages": [{"role": "user", "content": "Weather?"}, call_turn, {"role": "tool", "content": "18"},
                             {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "18, sunny."}]}
    lines = [
        answered,
        {"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Checking."},
                      {"role": "tool", "content": "18"}, {"role": "assistant", "content": "18."}]},  # 2
        {"conversations": [{"from": "human", "value": "Weather?"}, {"from": "gpt", "value": "Checking."},
                           {"from": "observation", "value": "18"}, {"from": "gpt", "value": "18."}]},  # 3
        {"conversations": [{"from": "human", "value": "Weather?"},
                           {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": {}})},
                           {"from": "observation", "value": "18"}, {"from": "gpt", "value": "18."}]},  # 4 kept
    ]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    assert sft(src, tmp_path / "out", "qwen2p5") == 0
    reasons = {line: reason for line, (reason, _) in read_rejects(tmp_path / "out").items()}
    assert reasons == {2: "tool-response-without-call", 3: "tool-response-without-call"}
    sharegpt_call = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {}}}]},
        {"role": "tool", "content": "18"}, {"role": "assistant", "content": "18."}]}
    assert read_samples(tmp_path / "out")[0] == [hf_ids("qwen2p5", r)["input_ids"] for r in (answered, sharegpt_call)]
