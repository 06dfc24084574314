"""A chat template's official Jinja rendered by jinja2 itself, as transformers' `apply_chat_template`
renders it with `tokenize=False`: the certificate's SFT reference without transformers or torch.

The environment is the one transformers builds for chat templates (read from its
`utils/chat_template_utils.py`, 5.x): jinja2's immutable sandbox with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that is `json.dumps` with
`ensure_ascii=False` and no key sorting (a template may pass indent, separators and the rest), the
globals `raise_exception` (a TemplateError) and `strftime_now` (local time), and the
`{% generation %}` tag of assistant-mask templates, rendered as its body. What transformers does to
its inputs before rendering is done here too: keys whose value is None are dropped from each
message, reasoning given as `thinking` or `reasoning` is also passed as `reasoning_content` (and
all of them as `thinking`), `documents` is None, and the tokenizer's named special tokens
(`eos_token` ...) are variables. transformers' own `dict` and `namespace` globals only refuse what
a sandbox escape would need; jinja2's render the same.

tests/data/test_chat_reference.py renders generated conversations with this and with
transformers, through every official Qwen template, and requires equal strings.
"""

from __future__ import annotations

import json
from datetime import datetime

# transformers' `_REASONING_FIELDS`, the first non-None of which every copy gets
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
# The tokens transformers' `special_tokens_map` names, where the tokenizer sets them.
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatJinja:
    """One template's Jinja, compiled once; `render` as `apply_chat_template(tokenize=False)`."""

    def __init__(self, text: str, variables: dict | None = None) -> None:
        """`variables`: what the tokenizer adds to every render (its named special tokens)."""
        self.text, self.variables = text, dict(variables or {})
        self.template = _environment().from_string(text)

    def __reduce__(self):  # a compiled jinja2 template does not pickle: its text does, compiled again
        return ChatJinja, (self.text, self.variables)

    def render(self, messages: list[dict], tools: list | None = None, add_generation_prompt: bool = False,
               **kwargs) -> str:
        chat = [_as_transformers_passes(message) for message in messages]
        return self.template.render(messages=chat, tools=tools, documents=None,
                                    add_generation_prompt=add_generation_prompt, **{**self.variables, **kwargs})


def _as_transformers_passes(message: dict) -> dict:
    """A message as the template sees it from transformers: None-valued keys dropped (APIs send
    `content: null` beside tool calls), reasoning under every name templates read."""
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in REASONING_KEYS if key in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def named_tokens(config: dict) -> dict[str, str]:
    """The named special tokens a tokenizer_config.json sets (a string, or an AddedToken's dict)."""
    found = {}
    for name in NAMED_TOKENS:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[name] = value
    return found


def _environment():
    # imported here: a run that checks nothing never loads jinja2
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: the body, in a call block's scope as transformers'
        tag renders it (only an assistant mask, which the reference does not ask for, differs)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # jinja2's own filter escapes HTML characters and sorts keys: templates are rendered with this one
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
