"""Our pure-Python Qwen renderers against transformers rendering the official template files."""

from __future__ import annotations

import hashlib
import json

import pytest

from qwen_data.text.conversations import Conversation
from qwen_data.errors import RecordError
from qwen_data.text.templates import (
    BODY,
    CONTEXT,
    END,
    END_NL,
    EQUIVALENT_SHA256,
    HEADER,
    HEADER_NL,
    ORACLE_FILES,
    SPAN_KINDS,
    TEMPLATE_SHA256,
    THINK,
    BuiltinTemplate,
    HFTemplate,
    get_template,
    render_samples,
)

from _conversations import conversations

try:
    from ._oracles import bundled_tokenizer_dir, hf_generation_spans, hf_render, load_oracle, oracle_dir
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from _oracles import bundled_tokenizer_dir, hf_generation_spans, hf_render, load_oracle, oracle_dir

TEMPLATE_CASES = {
    # name: (tools and tool calls allowed, generation-time kwargs sets to try)
    "qwen2": (False, [{}]),
    "qwen2p5": (True, [{}]),
    "qwen3": (True, [{}, {"enable_thinking": False}, {"enable_thinking": True}]),
}


def _joined(segments) -> str:
    return "".join(segment.text for segment in segments)


def check_structure(segments, conversation: Conversation) -> None:
    """Assistant turns come out as HEADER HEADER_NL [THINK] [BODY] END END_NL, numbered 0..k-1."""
    turns = [s.turn for s in segments if s.kind == HEADER]
    assert turns == list(range(len(conversation.assistant_indices)))
    order = {HEADER: 0, HEADER_NL: 1, THINK: 2, BODY: 3, END: 4, END_NL: 5}
    previous = None
    for segment in segments:
        assert segment.text, "empty segment"
        if segment.kind == CONTEXT:
            assert segment.turn == -1
            assert previous is None or previous.kind in (CONTEXT, END_NL)
            assert previous is None or previous.kind != CONTEXT, "context segments must be merged"
        else:
            assert segment.turn >= 0
            if segment.kind == HEADER:
                assert segment.text == "<|im_start|>assistant"
                assert previous is None or previous.kind in (CONTEXT, END_NL)
            else:
                assert previous.turn == segment.turn and order[previous.kind] < order[segment.kind]
            if segment.kind in (HEADER_NL, END_NL):
                assert segment.text == "\n"
            if segment.kind == END:
                assert segment.text == "<|im_end|>"
            if segment.kind == THINK:
                assert segment.text.startswith("<think>\n") and segment.text.endswith("\n</think>\n\n")
        previous = segment
    assert previous is None or previous.kind in (CONTEXT, END_NL)


# ---------------------------------------------------------------------------------------------
# oracle files and registry


def test_oracle_files_match_sha256sums_and_registry():
    for name, filename in ORACLE_FILES.items():
        text = load_oracle(filename)  # checks SHA256SUMS
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == TEMPLATE_SHA256[name]
        assert get_template(name).sha256 == TEMPLATE_SHA256[name]
    assert load_oracle("qwen3-original.jinja")
    assert set(EQUIVALENT_SHA256) == {"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"}


def test_unknown_template_name():
    with pytest.raises(ValueError):
        get_template("qwen4")
    with pytest.raises(ValueError):
        get_template("auto")


# ---------------------------------------------------------------------------------------------
# byte-exact against transformers


@pytest.mark.parametrize("name", list(TEMPLATE_CASES))
def test_random_conversations_byte_identical(name):
    tools, generation_kwargs = TEMPLATE_CASES[name]
    oracle = load_oracle(ORACLE_FILES[name])
    template = get_template(name)
    cases = conversations(1000 + len(name), 300, tools=tools, reasoning=True)
    if tools:
        cases += conversations(2000 + len(name), 100, tools=False, reasoning=name == "qwen3")
    for n, conversation in enumerate(cases):
        segments = template.render(conversation)
        expected = hf_render(oracle, conversation.messages, conversation.tools)
        assert _joined(segments) == expected, f"conversation {n}: {conversation}"
        check_structure(segments, conversation)
        if n % 4 == 0:
            for kwargs in generation_kwargs:
                rendered = template.render(conversation, add_generation_prompt=True, **kwargs)
                expected = hf_render(oracle, conversation.messages, conversation.tools, add_generation_prompt=True, **kwargs)
                assert _joined(rendered) == expected, f"conversation {n} with generation prompt {kwargs}"
                # enable_thinking only changes Qwen3's generation prompt, never the rendered turns
                full = hf_render(oracle, conversation.messages, conversation.tools, **kwargs)
                assert _joined(segments) == full


def test_qwen3_original_template_renders_canonical_conversations_identically():
    original = load_oracle("qwen3-original.jinja")
    template = get_template("qwen3")
    for conversation in conversations(77, 150, tools=True, reasoning=True):
        assert _joined(template.render(conversation)) == hf_render(original, conversation.messages, conversation.tools)


def test_edge_cases_byte_identical():
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"b": 1, "a": "é<>&"}}}
    cases = [
        # only system + user + assistant, empty system and user
        [{"role": "system", "content": ""}, {"role": "user", "content": ""}, {"role": "assistant", "content": "A"}],
        # reasoning field is used even when content also holds </think>
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "x</think>y", "reasoning_content": "R"}],
        # empty-string reasoning field: no split of the content
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>r</think>y", "reasoning_content": ""}],
        # tool-call turn whose content is only newlines after the think split
        [
            {"role": "user", "content": "Q"},
            {
                "role": "assistant",
                "content": "<think>t</think>\n",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "done"},
        ],
        # a mid-conversation system message (the pipeline rejects it, the templates render it)
        [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
            {"role": "system", "content": "S2"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2"},
        ],
    ]
    for name in ("qwen2p5", "qwen3"):
        oracle = load_oracle(ORACLE_FILES[name])
        for messages in cases:
            for tools in (None, [weather]):
                conversation = Conversation(messages, tools)
                assert _joined(get_template(name).render(conversation)) == hf_render(oracle, messages, tools)


def test_documented_behaviours():
    """The facts the renderers rely on, as rendered by transformers."""
    q25 = get_template("qwen2p5")
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}
    messages = [{"role": "user", "content": "Q"}, call, {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}, {"role": "assistant", "content": "A"}]
    text = _joined(q25.render(Conversation(messages, None)))
    assert text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n")
    assert '"arguments": "{\\"a\\": 1}"}' in text  # string arguments double-encoded by tojson
    assert "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n" in text
    q3 = _joined(get_template("qwen3").render(Conversation(messages, None)))
    assert '"arguments": {"a": 1}}' in q3  # Qwen3 passes strings through
    assert q3.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n")  # final turn: empty think block
    tools = [{"type": "function", "function": {"name": "ü", "z": 1, "a": 2}}]
    assert '{"type": "function", "function": {"name": "ü", "z": 1, "a": 2}}' in _joined(
        q25.render(Conversation(messages[:2] + [{"role": "assistant", "content": "x"}], tools))
    )


def test_qwen2_rejects_tools():
    conversation = Conversation(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
        None,
    )
    with pytest.raises(RecordError) as error:
        get_template("qwen2").render(conversation)
    assert error.value.reason == "template-without-tools"


def test_segments_label_the_right_text():
    """Independent of the renderer's own bookkeeping: BODY is the message content where the
    template renders content verbatim, and every assistant turn is labelled."""
    for name in ("qwen2", "qwen2p5"):
        for conversation in conversations(5, 60, tools=False, reasoning=False):
            segments = get_template(name).render(conversation)
            contents = [m["content"] for m in conversation.messages if m["role"] == "assistant"]
            bodies = ["".join(s.text for s in segments if s.turn == t and s.kind == BODY) for t in range(len(contents))]
            assert bodies == contents


# ---------------------------------------------------------------------------------------------
# the {% generation %} training templates (TRL)


def _span_from(segments, first_kind_order):
    """Character spans, per assistant turn, from the first segment whose kind is in
    `first_kind_order` to the end of END_NL."""
    spans, offset, start = [], 0, None
    for segment in segments:
        if segment.kind in first_kind_order and start is None:
            start = offset
        offset += len(segment.text)
        if segment.kind == END_NL:
            spans.append((start, offset))
            start = None
    return spans


def test_qwen2p5_generation_template_marks_newline_body_and_im_end_newline():
    """TRL's Qwen2.5 training template marks "\\n" after the role + body + "<|im_end|>\\n":
    exactly our HEADER_NL..END_NL (the `trl` span), and renders the same text as the official one."""
    mask_template = load_oracle("qwen2.5-instruct.assistant-mask.jinja")
    template = get_template("qwen2p5")
    for conversation in conversations(31, 120, tools=True, reasoning=False):
        segments = template.render(conversation)
        text, spans = hf_generation_spans(mask_template, conversation.messages, conversation.tools)
        assert text == _joined(segments)
        assert spans == _span_from(segments, {HEADER_NL})
        trained = {s.kind for s in segments if s.turn >= 0} - {HEADER}
        assert trained <= SPAN_KINDS["trl"]


def test_qwen3_generation_template_marks_body_and_im_end_newline_but_not_header_newline():
    """TRL's Qwen3 training template keeps every think block (it is not the official rendering
    for earlier turns) and marks think + body + "<|im_end|>\\n", *not* the "\\n" after the role.
    Where both templates render the same text, its spans are our THINK..END_NL."""
    mask_template = load_oracle("qwen3.assistant-mask.jinja")
    template = get_template("qwen3")
    compared = 0
    for conversation in conversations(41, 200, tools=True, reasoning=True):
        segments = template.render(conversation)
        text, spans = hf_generation_spans(mask_template, conversation.messages, conversation.tools)
        if text != _joined(segments):
            continue
        compared += 1
        assert spans == _span_from(segments, {THINK, BODY, END})
    assert compared >= 20


# ---------------------------------------------------------------------------------------------
# multi-turn history modes


def test_history_modes_qwen3():
    oracle = load_oracle(ORACLE_FILES["qwen3"])
    template = get_template("qwen3")
    for conversation in conversations(9, 80, tools=True, reasoning=True):
        count = len(conversation.assistant_indices)
        full = hf_render(oracle, conversation.messages, conversation.tools)
        (rendered,) = render_samples(template, conversation, "rendered")
        assert rendered.text == full and rendered.trained_turns == frozenset(range(count))
        (last,) = render_samples(template, conversation, "last")
        assert last.text == full and last.trained_turns == {count - 1}
        split = render_samples(template, conversation, "split")
        assert len(split) == count
        for turn, (sample, k) in enumerate(zip(split, conversation.assistant_indices)):
            assert sample.trained_turns == {turn}
            assert sample.text == hf_render(oracle, conversation.messages[: k + 1], conversation.tools)
            # the trained turn is what the model produces after the inference-time prompt
            prompt = hf_render(oracle, conversation.messages[:k], conversation.tools, add_generation_prompt=True)
            assert sample.text.startswith(prompt)
            first = next(i for i, s in enumerate(sample.segments) if s.turn == turn)
            assert _joined(sample.segments[:first]) + "<|im_start|>assistant\n" == prompt
    with pytest.raises(ValueError):
        render_samples(template, conversation, "everything")


def test_non_thinking_mode_puts_the_empty_think_block_in_the_prompt():
    """enable_thinking=False: same text, but an empty think block is prompt, so what is trained
    starts right after Qwen3's non-thinking inference prompt."""
    oracle = load_oracle(ORACLE_FILES["qwen3"])
    template = get_template("qwen3")
    checked = 0
    for conversation in conversations(23, 60, tools=True, reasoning=True):
        default = render_samples(template, conversation, "split")
        for sample, plain, k in zip(
            render_samples(template, conversation, "split", enable_thinking=False), default, conversation.assistant_indices
        ):
            assert sample.text == plain.text
            (turn,) = sample.trained_turns
            think = [s for s in plain.segments if s.turn == turn and s.kind == THINK]
            if think and think[0].text == "<think>\n\n</think>\n\n":
                checked += 1
                assert not any(s.kind == THINK and s.turn == turn for s in sample.segments)
                first_trained = next(i for i, s in enumerate(sample.segments) if s.turn == turn and s.kind != HEADER and s.kind != HEADER_NL)
                prompt = hf_render(oracle, conversation.messages[:k], conversation.tools, add_generation_prompt=True, enable_thinking=False)
                assert _joined(sample.segments[:first_trained]) == prompt
            else:
                assert [x for x in sample.segments if x.turn == turn] == [x for x in plain.segments if x.turn == turn]
    assert checked >= 20


def test_templates_pickle_for_workers():
    import pickle

    conversation = conversations(3, 1, tools=True, reasoning=True)[0]
    for template in (get_template("qwen3"), HFTemplate(bundled_tokenizer_dir())):
        clone = pickle.loads(pickle.dumps(template))
        assert clone.sha256 == template.sha256
        assert render_samples(clone, conversation, "last")[0].segments == render_samples(template, conversation, "last")[0].segments


# ---------------------------------------------------------------------------------------------
# --template auto


def _normalised(segments):
    """THINK is a built-in refinement of BODY; merge neighbours of the same kind and turn."""
    merged = []
    for text, kind, turn in segments:
        kind = BODY if kind == THINK else kind
        if merged and merged[-1][1] == kind and merged[-1][2] == turn:
            merged[-1] = (merged[-1][0] + text, kind, turn)
        else:
            merged.append((text, kind, turn))
    return merged


def test_auto_on_a_known_template_uses_the_builtin_renderer():
    oracle_dir()
    template = get_template("auto", bundled_tokenizer_dir())  # ships the April-2025 Qwen3 template
    assert isinstance(template, BuiltinTemplate) and template.name == "qwen3"
    assert template.sha256 == "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"


def test_auto_through_transformers_matches_builtin_qwen3_where_prefix_stable():
    oracle_dir()
    auto = HFTemplate(bundled_tokenizer_dir())
    builtin = get_template("qwen3")
    not_stable = 0
    for conversation in conversations(13, 40, tools=True, reasoning=True):
        for history in ("last", "split"):
            ours = render_samples(builtin, conversation, history)
            theirs = render_samples(auto, conversation, history)
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                assert a.text == b.text and a.trained_turns == b.trained_turns
                trained = lambda segments, t: [s for s in _normalised(segments) if s[2] == t]  # noqa: E731
                for turn in a.trained_turns:
                    assert trained(b.segments, turn) == trained(a.segments, turn)
        if len(conversation.assistant_indices) > 1:
            try:
                render_samples(auto, conversation, "rendered")
            except RecordError as error:
                assert error.reason == "template-not-prefix-stable"
                not_stable += 1
    assert not_stable > 0  # Qwen3 strips history reasoning: the whole-chat labelling must refuse


def test_auto_through_transformers_matches_builtin_qwen2p5(tmp_path):
    source = bundled_tokenizer_dir()
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (tmp_path / name).symlink_to(source / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = load_oracle(ORACLE_FILES["qwen2p5"])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert isinstance(get_template("auto", tmp_path), BuiltinTemplate)

    config["chat_template"] = config["chat_template"].replace("You are Qwen", "You are QwenX")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    auto = get_template("auto", tmp_path)
    assert isinstance(auto, HFTemplate) and auto.end_marker == "<|im_end|>\n"
    builtin = get_template("qwen2p5")
    for conversation in conversations(17, 40, tools=True, reasoning=False):
        expected = [
            (s.text.replace("You are Qwen", "You are QwenX"), s.kind, s.turn) for s in builtin.render(conversation)
        ]
        assert [tuple(s) for s in auto.render(conversation)] == expected


def test_auto_refuses_templates_without_a_generation_prompt(tmp_path):
    source = bundled_tokenizer_dir()
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        (tmp_path / name).symlink_to(source / name)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError):
        HFTemplate(tmp_path)
