"""Column mapping: SFT records with their own column names -> the canonical records that
`qwen_data.text.conversations.to_conversation` reads.

Two sources of a mapping:

- `--columns instruction=prompt,output=answer` (`parse_columns`): the named source columns are
  renamed to canonical keys (instruction, input, output, system, history, tools, messages,
  conversations); every other key of the record passes through, and the format is still
  detected per record.
- `--dataset-info FILE:NAME` (`read_dataset_info`): one entry of a LLaMA-Factory
  `dataset_info.json`, read with LLaMA-Factory's own meaning (src/llamafactory/data/parser.py,
  converter.py and data/README.md of hiyouga/LLaMA-Factory):

  * `formatting` alpaca (the default), sharegpt, or openai (sharegpt-like messages whose
    assistant turns may carry OpenAI `tool_calls`). `ranking: true` is preference data and
    `kto_tag` KTO data: neither is SFT, so the entry is refused, as LLaMA-Factory refuses a
    ranking dataset outside reward modelling.
  * `columns`: when the entry has no `columns`, LLaMA-Factory's defaults apply (alpaca:
    instruction/input/output; sharegpt: conversations). When it has one, every column it does
    not list is unset, defaults included: LLaMA-Factory reads each name from that object with a
    None fallback. The canonical record is built from the mapped columns alone, so a field the
    entry does not map (say an alpaca `system` key) is ignored, as LLaMA-Factory ignores it.
  * `tags` (sharegpt/openai) likewise: defaults (from/value/human/gpt/observation/
    function_call/system) without `tags`, and only the listed ones with it.
  * alpaca: the user turn is the prompt and query columns (each only when non-empty); a
    history column holds [user, assistant] pairs; a record without a string response has
    nothing to train on (LLaMA-Factory drops it; we raise RecordError).
  * sharegpt: a first message carrying the system tag is the system prompt and wins over the
    system column. The other messages must alternate: user or observation at even positions,
    assistant or function call at odd ones, and there must be an even number of them (the
    last one answers). Where LLaMA-Factory logs and drops such a record we raise RecordError.
  * openai: as sharegpt, but an assistant (or function) message with `tool_calls` becomes a
    function call made of those calls' `function` objects (its text content is dropped, as
    LLaMA-Factory drops it), and consecutive observation messages count as one turn for the
    alternation check (LLaMA-Factory joins them into one observation; we keep them apart as
    tool messages, which the Qwen templates render into the same single user block).
    LLaMA-Factory's openai converter also appends "detailed thinking off" (or "\\n") to the
    system prompt, a switch of other model families; that is deliberately not reproduced.
  * media columns (images/videos/audios), when mapped, are kept under those canonical keys so
    that `to_conversation` rejects a record that carries media (qwen-data is text-only).
  * where the data lives: `file_name` relative to the dataset_info.json's folder (a file or a
    folder of files), or `hf_hub_url` with `subset`, `split` ("train" by default) and `folder`.
    ModelScope/Modelers hubs, loading scripts, cloud files and `num_samples` are refused.

Errors about one record are RecordError (the record is set aside); errors about the mapping
itself are ValueError.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import RecordError

CANONICAL = ("instruction", "input", "output", "system", "history", "tools", "messages", "conversations")

# --columns targets without which conversations.py cannot read the record's format.
_REQUIRED = frozenset({"instruction", "output", "messages", "conversations"})

# LLaMA-Factory column name -> our canonical key.
_LF_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "history": "history",
    "messages": "conversations",
    "system": "system",
    "tools": "tools",
    "images": "images",
    "videos": "videos",
    "audios": "audios",
}
# Column names LLaMA-Factory knows that only preference/KTO training reads.
_LF_NON_SFT_COLUMNS = ("chosen", "rejected", "kto_tag")

_LF_DEFAULT_COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output"},
    "sharegpt": {"messages": "conversations"},
    "openai": {"messages": "conversations"},
}
_LF_DEFAULT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
# Tag name -> canonical ShareGPT `from` value. The order is LLaMA-Factory's: when an entry gives
# two tags the same value, the later one wins its role mapping there too.
_TAG_ROLES = {
    "user_tag": "human",
    "assistant_tag": "gpt",
    "observation_tag": "observation",
    "function_tag": "function_call",
    "system_tag": "system",
}
# Columns both formats read besides their conversation: system first (see ColumnMap._common).
_COMMON = ("system", "tools", "images", "videos", "audios")
_ENTRY_LOCATIONS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name", "file_name")


@dataclass(frozen=True)
class ColumnMap:
    """How to turn a record into a canonical one; `apply` does it, once per record.

    columns: (target, source column) pairs. For --columns the targets are canonical keys; for
    a dataset-info entry they are LLaMA-Factory's column names (prompt, query, response, ...).
    tags: (LLaMA-Factory tag name, value) pairs of a sharegpt/openai entry.
    formatting: the entry's LLaMA-Factory formatting (alpaca/sharegpt/openai), None for --columns.
    folder: a hub dataset's data folder (LLaMA-Factory's `folder`), else None.
    origin: where the mapping came from, for messages.
    """

    format: str | None
    columns: tuple[tuple[str, str], ...]
    tags: tuple[tuple[str, str], ...] = ()
    formatting: str | None = None
    location: str | None = None
    split: str | None = None
    subset: str | None = None
    folder: str | None = None
    origin: str = "--columns"

    def __post_init__(self):
        # Precomputed once: apply() runs per record. Plain attributes (not fields), so equality
        # and hashing stay on the fields, and pickling carries them along.
        columns = dict(self.columns)
        tags = dict(self.tags)
        role_tags = {name: tags.get(name) for name in _TAG_ROLES}
        set_ = object.__setattr__
        set_(self, "_col", columns)
        set_(self, "_targets", frozenset(columns) | frozenset(columns.values()))
        set_(self, "_role_tag", tags.get("role_tag"))
        set_(self, "_content_tag", tags.get("content_tag"))
        set_(self, "_tag_roles", {tag: _TAG_ROLES[name] for name, tag in role_tags.items() if tag is not None})
        set_(self, "_system_tag", role_tags["system_tag"])
        # sharegpt positions: even ones take user/observation, odd ones assistant/function call;
        # openai tool calls ride on the odd-position tags
        even = frozenset(t for t in (role_tags["user_tag"], role_tags["observation_tag"]) if t is not None)
        odd = frozenset(t for t in (role_tags["assistant_tag"], role_tags["function_tag"]) if t is not None)
        set_(self, "_accept", (even, odd))
        set_(self, "_assistant_tags", odd)

    # -----------------------------------------------------------------------------------------

    def apply(self, record: dict) -> dict:
        """The canonical record for `to_conversation(..., self.format)`, or RecordError."""
        if not isinstance(record, dict):
            raise RecordError("not-an-object", f"record is a {type(record).__name__}, not a JSON object")
        if self.formatting is None:
            return self._rename(record)
        if self.formatting == "alpaca":
            return self._alpaca(record)
        return self._sharegpt(record, openai=self.formatting == "openai")

    def columns_read(self) -> list[str] | None:
        """The source columns apply() reads (None: all, as --columns passes other keys through)."""
        if self.formatting is None:
            return None
        return list(dict.fromkeys(source for _, source in self.columns))

    # -- --columns ----------------------------------------------------------------------------

    def _rename(self, record: dict) -> dict:
        # A key that is a source or a target is dropped first: the target then comes only from
        # the source the user named, never from a same-named column of the record.
        out = {key: value for key, value in record.items() if key not in self._targets}
        for target, source in self.columns:
            value = record.get(source)
            if value is not None:
                out[target] = value
            elif target in _REQUIRED:
                raise _missing(source, target)
        return out

    # -- LLaMA-Factory alpaca -----------------------------------------------------------------

    def _alpaca(self, record: dict) -> dict:
        col = self._col
        out = {}
        prompt = col.get("prompt")
        if prompt is None:
            out["instruction"] = ""  # an entry without a prompt column: the user turn is the query alone
        else:
            value = record.get(prompt)
            if value is None:
                raise _missing(prompt, "instruction")
            out["instruction"] = value or ""  # LLaMA-Factory skips an empty prompt
        response = col["response"]  # read_dataset_info refuses an alpaca entry without one
        value = record.get(response)
        if value is None:
            raise _missing(response, "output")
        out["output"] = value
        query = col.get("query")
        if query is not None and record.get(query):  # an empty or absent query adds nothing
            out["input"] = record[query]
        history = col.get("history")
        if history is not None:
            value = record.get(history)
            # LLaMA-Factory ignores a history that is not a list; we pass it on so that
            # conversations.py rejects it (bad-history) rather than train without that context
            if value is not None and value != "":
                out["history"] = value
        self._common(record, out)
        return out

    def _common(self, record: dict, out: dict, *, system: bool = True) -> None:
        """The system (unless told not to), tools and media columns the entry maps, where the record has them."""
        col = self._col
        for name in _COMMON if system else _COMMON[1:]:
            source = col.get(name)
            if source is not None:
                value = record.get(source)
                if value is not None:
                    out[name] = value

    # -- LLaMA-Factory sharegpt / openai ------------------------------------------------------

    def _sharegpt(self, record: dict, *, openai: bool) -> dict:
        source = self._col["messages"]
        messages = record.get(source)
        if messages is None:
            raise _missing(source, "conversations")
        if not isinstance(messages, list):
            raise RecordError(
                "bad-message", f"{source!r} column (mapped to conversations) is a {type(messages).__name__}, not a list"
            )
        for n, message in enumerate(messages):
            if not isinstance(message, dict):
                raise RecordError("bad-message", f"{source}[{n}] is a {type(message).__name__}, not an object")
        role_tag, content_tag = self._role_tag, self._content_tag
        out = {}
        turns: list[dict] = []
        start = 0
        if self._system_tag is not None and messages and messages[0].get(role_tag) == self._system_tag:
            # the leading system message is the system prompt and the system column goes unread;
            # an empty one is no system prompt, as an empty column is
            start = 1
            system = messages[0].get(content_tag)
            if system is not None and system != "":
                turns.append({"from": "system", "value": system})
        self._common(record, out, system=not start)
        if openai:
            self._openai_turns(messages, start, turns, source)
        else:
            self._sharegpt_turns(messages, start, turns, source)
        out["conversations"] = turns
        return out

    def _role(self, message: dict, n: int, source: str) -> str:
        role = message.get(self._role_tag)
        canonical = self._tag_roles.get(role) if isinstance(role, str) else None
        if canonical is None:
            tags = ", ".join(repr(t) for t in self._tag_roles)
            raise RecordError(
                "unknown-role", f"{source}[{n}] has {self._role_tag!r} {role!r}, none of this entry's tags ({tags})"
            )
        return canonical

    def _content(self, message: dict, n: int, source: str):
        if self._content_tag not in message:
            raise RecordError("missing-field", f"{source}[{n}] has no {self._content_tag!r}")
        return message[self._content_tag]

    def _sharegpt_turns(self, messages: list, start: int, turns: list, source: str) -> None:
        for n in range(start, len(messages)):
            message = messages[n]
            canonical = self._role(message, n, source)
            # LLaMA-Factory checks the entry's own tags by position
            parity = (n - start) % 2
            if message[self._role_tag] not in self._accept[parity]:
                raise _not_alternating(message[self._role_tag], canonical, parity, n, source)
            turns.append({"from": canonical, "value": self._content(message, n, source)})
        _check_count(len(messages) - start, source)

    def _openai_turns(self, messages: list, start: int, turns: list, source: str) -> None:
        # LLaMA-Factory checks alternation after joining consecutive observations into one
        # turn, on the mapped roles; `position` counts those joined turns.
        accept = (frozenset({"human", "observation"}), frozenset({"gpt", "function_call"}))
        position = 0
        previous = None
        for n in range(start, len(messages)):
            message = messages[n]
            role = message.get(self._role_tag)
            calls = message.get("tool_calls") if isinstance(role, str) and role in self._assistant_tags else None
            if calls:
                canonical, value = "function_call", _openai_calls(calls, n, source)
            else:
                canonical, value = self._role(message, n, source), self._content(message, n, source)
            turns.append({"from": canonical, "value": value})
            if canonical == "observation" and previous == "observation":
                continue  # joined with the observation before it
            if canonical not in accept[position % 2]:
                raise _not_alternating(role, canonical, position % 2, n, source)
            position += 1
            previous = canonical
        _check_count(position, source)


def _not_alternating(role, canonical: str, parity: int, n: int, source: str) -> RecordError:
    expected = "the user or an observation" if parity == 0 else "the assistant or a function call"
    where = " (a system message may only come first)" if canonical == "system" else ""
    return RecordError(
        "non-alternating",
        f"{source}[{n}] is {role!r} where LLaMA-Factory expects {expected}{where}: "
        "user/observation and assistant/function-call turns must alternate",
    )


def _check_count(count: int, source: str) -> None:
    if count == 0:
        raise RecordError("no-messages", f"{source!r} holds no conversation turns")
    if count % 2:
        raise RecordError(
            "trailing-non-assistant",
            f"{source!r} has an odd number of turns ({count}): the last one is not an answer to train on",
        )


def _openai_calls(calls, n: int, source: str) -> list:
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls):
        raise RecordError("bad-tool-call", f"{source}[{n}].tool_calls must be a list of {{'function': {{...}}}} objects")
    return [call["function"] for call in calls]


def _missing(source: str, target: str) -> RecordError:
    return RecordError("missing-field", f"no {source!r} column (mapped to {target})")


# ---------------------------------------------------------------------------------------------
# --columns


def parse_columns(text: str) -> ColumnMap:
    """`canonical=source,...` -> ColumnMap; ValueError on a bad spec."""
    if not text or not text.strip():
        raise ValueError("--columns is empty; expected canonical=source pairs, e.g. instruction=prompt,output=answer")
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"--columns {text!r} has an empty item (a stray comma?)")
        if "=" not in item:
            raise ValueError(f"--columns item {item!r} has no '='; expected canonical=source")
        target, source = (part.strip() for part in item.split("=", 1))
        if target not in CANONICAL:
            raise ValueError(f"--columns: unknown canonical name {target!r}; expected one of {', '.join(CANONICAL)}")
        if not source:
            raise ValueError(f"--columns item {item!r} names no source column")
        if any(target == t for t, _ in pairs):
            raise ValueError(f"--columns maps {target!r} twice")
        if any(source == s for _, s in pairs):
            raise ValueError(f"--columns reads column {source!r} twice; map each column to one canonical name")
        pairs.append((target, source))
    return ColumnMap(format=None, columns=tuple(pairs))


# ---------------------------------------------------------------------------------------------
# --dataset-info


def read_dataset_info(spec: str) -> ColumnMap:
    """`FILE:NAME` (FILE a dataset_info.json, or the folder holding one) -> ColumnMap."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"--dataset-info {spec!r}: expected FILE:NAME (a dataset_info.json and an entry in it)")
    if os.path.isdir(path):
        path = os.path.join(path, "dataset_info.json")  # LLaMA-Factory's dataset_dir
    where = f"--dataset-info {path}:{name}"
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: {path} is not valid JSON: {exc}") from None
    if not isinstance(info, dict):
        raise ValueError(f"{where}: {path} must hold a JSON object of named entries")
    if name not in info:
        names = list(info)
        shown = ", ".join(map(repr, names[:8])) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise ValueError(f"{where}: no entry {name!r} in {path} (it has {shown or 'no entries'})")
    entry = info[name]
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: the entry is a {type(entry).__name__}, not an object")
    return _from_entry(entry, os.path.dirname(os.path.abspath(path)), where)


def _from_entry(entry: dict, base: str, where: str) -> ColumnMap:
    formatting = entry.get("formatting") or "alpaca"
    if formatting not in _LF_DEFAULT_COLUMNS:
        raise ValueError(f"{where}: formatting {formatting!r} is not supported; expected alpaca, sharegpt or openai")
    if entry.get("ranking"):
        raise ValueError(f"{where}: a preference dataset (ranking: true) is not SFT data")
    if entry.get("num_samples") is not None:
        raise ValueError(f"{where}: num_samples (LLaMA-Factory's random sampling) is not supported")
    columns = _entry_object(entry, "columns", where, allowed=(*_LF_COLUMNS, *_LF_NON_SFT_COLUMNS))
    if columns is None:
        columns = _LF_DEFAULT_COLUMNS[formatting]
    if columns.get("kto_tag") is not None:
        raise ValueError(f"{where}: a KTO dataset (columns.kto_tag) is not SFT data")
    # LLaMA-Factory reads chosen/rejected only for ranking data: ignored here as there.
    mapped = tuple((key, value) for key, value in columns.items() if key in _LF_COLUMNS and value is not None)
    keys = {key for key, _ in mapped}
    tags: tuple[tuple[str, str], ...] = ()
    if formatting == "alpaca":
        if "response" not in keys:
            raise ValueError(f"{where}: the alpaca entry maps no response column, so it has nothing to train on")
        mapped = tuple(pair for pair in mapped if pair[0] != "messages")
    else:
        if "messages" not in keys:
            raise ValueError(f"{where}: the {formatting} entry maps no messages column")
        # alpaca-only columns are never read for sharegpt data
        mapped = tuple(pair for pair in mapped if pair[0] not in ("prompt", "query", "response", "history"))
        given = _entry_object(entry, "tags", where, allowed=tuple(_LF_DEFAULT_TAGS))
        tag_map = _LF_DEFAULT_TAGS if given is None else given
        for needed in ("role_tag", "content_tag"):
            if tag_map.get(needed) is None:
                raise ValueError(f"{where}: the {formatting} entry has no tags.{needed}")
        tags = tuple((key, value) for key, value in tag_map.items() if value is not None)
    location, split, subset, folder = _location(entry, base, where)
    return ColumnMap(
        format="alpaca" if formatting == "alpaca" else "sharegpt",
        columns=mapped,
        tags=tags,
        formatting=formatting,
        location=location,
        split=split,
        subset=subset,
        folder=folder,
        origin=where,
    )


def _entry_object(entry: dict, key: str, where: str, *, allowed: tuple[str, ...]) -> dict | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {key} must be an object")
    # LLaMA-Factory ignores names it does not know; a typo there would silently unset a column,
    # so we refuse them
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown {key} {', '.join(map(repr, unknown))}; known: {', '.join(allowed)}")
    for name, item in value.items():
        if item is not None and not isinstance(item, str):
            raise ValueError(f"{where}: {key}.{name} must be a string")
    return value


def _location(entry: dict, base: str, where: str):
    """(location, split, subset, folder) in LLaMA-Factory's precedence: hubs, script, cloud, file.

    hf_hub_url wins over ms_hub_url/om_hub_url, as it does in LLaMA-Factory unless its
    USE_MODELSCOPE_HUB/USE_OPENMIND_HUB switches are on.
    """
    if entry.get("hf_hub_url"):
        return f"hf:{entry['hf_hub_url']}", entry.get("split") or "train", entry.get("subset"), entry.get("folder")
    for key in _ENTRY_LOCATIONS[1:-1]:
        if entry.get(key):
            raise ValueError(f"{where}: {key} is not supported (use file_name or hf_hub_url)")
    file_name = entry.get("file_name")
    if not file_name:
        raise ValueError(f"{where}: the entry has none of {', '.join(_ENTRY_LOCATIONS)}")
    path = os.path.abspath(os.path.join(base, file_name))
    if not os.path.exists(path):
        raise ValueError(f"{where}: file_name {file_name!r} not found ({path})")
    return path, None, None, None
