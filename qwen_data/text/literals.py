"""Literal special-token strings inside chat content, told apart from those the template writes.

Under the `text`, `safe` and `reject` policies (see `qwen_data.text.tokenizer`) a literal such as
`<|im_end|>` typed into a message must not become a control id, while the `<|im_start|>` and
`<|im_end|>` the template writes around that message must. The rendered text alone cannot tell
them apart, so before rendering the leading "<" of every literal the policy acts on is replaced, in
every string of the conversation, by a marker character that occurs nowhere in it. Templates copy
content verbatim, so the literals left in the rendered text are the template's own and the content
tokens the policy keeps: all control ids. The marker is one character, like "<", so positions in
the marked text are positions in the real one.
"""

from __future__ import annotations

import re

from .. import _native
from .conversations import Conversation
from .templates import Sample, Segment, render_samples

MAY_HOLD_LEAD = 1  # `json_marks`: "<" itself, or escaped as \u003c / \u003C
ESCAPES_SURROGATE = 2  # `json_marks`: a \ud / \uD escape (a lone surrogate, read once or twice as JSON)


def json_marks(data: bytes) -> int:
    """What a record's JSON text may hold, as MAY_HOLD_LEAD | ESCAPES_SURROGATE: the substrings looked
    for anywhere in its bytes (escaped or not, so a string read again as JSON is covered), in one pass
    (five searches of every line were ~5% of an SFT worker's instructions)."""
    return _native.json_marks(data)

# Private-use characters: the first one absent from a conversation is its marker.
_MARKERS = [chr(c) for c in range(0xE000, 0xF900)]


def find(conversation: Conversation, pattern: re.Pattern) -> str | None:
    """The first literal `pattern` matches in any string of the conversation, if any."""
    for string in _strings([conversation.messages, conversation.tools]):
        match = pattern.search(string)
        if match:
            return match.group(0)
    return None


def render(template, conversation: Conversation, pattern: re.Pattern | None, history: str,
           enable_thinking) -> list[Sample]:
    """The samples a conversation makes (`templates.render_samples`), the literals `pattern`
    matches kept as text (None: every literal the template's text holds becomes an id)."""
    if pattern is None:
        return render_samples(template, conversation, history, enable_thinking=enable_thinking)
    marked, marker = mark(conversation, pattern)
    return [unmark(sample, marker) for sample in render_samples(template, marked, history,
                                                                enable_thinking=enable_thinking)]


def mark(conversation: Conversation, pattern: re.Pattern) -> tuple[Conversation, str]:
    """(the conversation with the literals `pattern` matches marked, the marker)."""
    joined = "".join(_strings([conversation.messages, conversation.tools]))
    marker = next((m for m in _MARKERS if m not in joined), None)
    if marker is None:  # pragma: no cover - 6,400 distinct private-use characters in one record
        raise ValueError("no free marker character in this record")

    def sub(value):
        if isinstance(value, str):
            return pattern.sub(lambda m: marker + m.group(0)[1:], value)
        if isinstance(value, list):
            return [sub(v) for v in value]
        if isinstance(value, dict):
            return {sub(k): sub(v) for k, v in value.items()}
        return value

    return Conversation(sub(conversation.messages), sub(conversation.tools)), marker


def unmark(sample: Sample, marker: str) -> Sample:
    """The sample with its real text back in the segments, the marked text kept aside."""
    segments = [Segment(s.text.replace(marker, "<"), s.kind, s.turn) for s in sample.segments]
    return Sample(segments, sample.trained_turns, marked_text=sample.text)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
