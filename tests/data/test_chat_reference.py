"""The certificate's SFT reference on its own: the official Jinja rendered by jinja2 as transformers
renders it (`certify.render`), and raw records mapped to the messages the template takes."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys

import jinja2
import pytest
from _conversations import conversations
from _oracles import bundled_tokenizer_dir, hf_render, load_oracle, oracle_dir

from qwen_data.certify.render import ChatJinja, named_tokens

# Every official template, and the assistant-mask ones (their `{% generation %}` tag).
TEMPLATES = {"qwen2-instruct.jinja": [{}], "qwen2.5-instruct.jinja": [{}],
             "qwen2.5-instruct.assistant-mask.jinja": [{}], "qwen3-original.jinja": [{}],
             "qwen3.jinja": [{}, {"enable_thinking": False}, {"enable_thinking": True}],
             "qwen3.assistant-mask.jinja": [{}, {"enable_thinking": False}]}


def ours(text: str) -> ChatJinja:
    with open(bundled_tokenizer_dir() / "tokenizer_config.json", encoding="utf-8") as f:
        return ChatJinja(text, named_tokens(json.load(f)))


def varied(messages: list[dict], rng: random.Random) -> list[dict]:
    """Messages as records bring them: reasoning under transformers' other names, `content: null`
    beside tool calls, keys no template reads."""
    out = copy.deepcopy(messages)
    for message in out:
        if "reasoning_content" in message and rng.random() < 0.5:
            message[rng.choice(["thinking", "reasoning"])] = message.pop("reasoning_content")
        if message.get("tool_calls") and not message["content"] and rng.random() < 0.5:
            message["content"] = None
        if rng.random() < 0.1:
            message["name"] = "someone"
    return out


def outcome(render, *args, **kwargs) -> tuple[str, str]:
    """What a render gives: its text, or the kind of error it raised (Qwen2's template cannot
    take a message without content)."""
    try:
        return "rendered", render(*args, **kwargs)
    except jinja2.exceptions.TemplateError as error:
        return "refused", type(error).__name__


@pytest.mark.parametrize("name", TEMPLATES)
def test_our_jinja_renders_what_transformers_renders(name):
    text, rng = load_oracle(name), random.Random(7)
    template = ours(text)
    checked = 0
    for conversation in conversations(11, 40, tools=True, reasoning=True) + conversations(12, 20, tools=False,
                                                                                          reasoning=False):
        messages = varied(conversation.messages, rng)
        for end in range(1, len(messages) + 1):  # every prefix, as the reference renders them
            for prompt in (False, True):
                for kwargs in TEMPLATES[name]:
                    expected = outcome(hf_render, text, messages[:end], conversation.tools,
                                       add_generation_prompt=prompt, **kwargs)
                    assert outcome(template.render, messages[:end], conversation.tools, prompt, **kwargs) == expected
                    checked += expected[0] == "rendered"
    assert checked > 500


def test_the_environment_is_transformers_own():
    """tojson's arguments and defaults, loop controls, raise_exception, strftime_now, named tokens."""
    text = ("{%- for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson }}|"
            "{{ m | tojson(indent=2) }}{% endfor %}{{ tools | tojson(separators=(',', ':'), sort_keys=true) }}"
            "{{ eos_token }}{{ pad_token }}{{ bos_token is defined }}{{ documents is none }}"
            "{{ strftime_now('%Y') }}{% if messages|length > 3 %}{{ raise_exception('too long: ' ~ "
            "messages|length) }}{% endif %}")
    messages = [{"role": "user", "content": "<b>é</b> \"q\" 😀", "z": 1, "a": [1.5, None]},
                {"role": "assistant", "content": "ok", "reasoning": "why"}, {"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f", "b": 2, "a": 1}}]
    assert ours(text).render(messages, tools) == hf_render(text, messages, tools)
    with pytest.raises(jinja2.exceptions.TemplateError, match="too long: 4"):
        ours(text).render(messages + messages[:1], tools)
    with pytest.raises(jinja2.exceptions.SecurityError):  # the sandbox, immutable
        ours("{{ messages.append(1) }}").render(messages)


def test_a_compiled_template_travels_between_processes():
    """A run on Ray gets its checker back from the checking process, pickled (a compiled jinja2
    template alone does not pickle: a certified SFT run on Ray failed at its end)."""
    import pickle

    text = load_oracle("qwen2.5-instruct.jinja")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    again = pickle.loads(pickle.dumps(ours(text)))
    assert again.render(messages) == ours(text).render(messages) == hf_render(text, messages)


def test_sft_imports_neither_transformers_nor_torch(tmp_path):
    """A certified `qwen-data sft` run (its checking process included: -X importtime reports the
    imports of every process forked from it) never imports transformers or torch."""
    examples = os.path.join(os.path.dirname(__file__), "..", "..", "qwen_data", "examples", "chats.jsonl")
    code = "import sys; from qwen_data.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", code, "sft", examples, "-o", str(tmp_path / "s"),
                          "--template", "qwen3", "--reference-template", str(oracle_dir() / "qwen3.jinja"),
                          "--quiet", "--workers", "2", "--chunk-mb", "0.002"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "jinja2" in imported and "tokenizers" in imported  # the report is really read
    heavy = sorted(m for m in imported if m.split(".")[0] in ("transformers", "torch"))
    assert heavy == []
    with open(tmp_path / "s.json", encoding="utf-8") as f:
        certificate = json.load(f)["certificate"]
    assert certificate["certified"] and set(certificate["reference"]) == {"jinja2", "tokenizers"}
