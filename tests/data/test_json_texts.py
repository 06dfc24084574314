"""The jsonl fast path (`_native.json_texts`): a line's text read straight from its bytes is exactly the
str the parsers read (orjson, else Python's json, as `inputs.records` reads a line), for every line it
answers; every line it leaves (None) is one the parsers must read; and the lines corpora hold are answered."""

import json
import random

import orjson
import pytest

from qwen_data._native import json_texts

KEYS = (b"text",)
SPECIAL = b'"\\{}[],:u0 '  # the bytes JSON's grammar turns on

PIECES = ["a", "é", "€", "😀", "\u0301", "\u3000", " ", "\n", "\t", "\r", "\x00", "\x1f", "\x7f", '"', "\\", "/",
          "<|endoftext|>", "\u2028", "\ufeff", "\uffff", "中文", "\U0010ffff", "\x85", "\xa0", "\x1c"]
# whole lines of the shapes corpora hold, and the cases each side must read alike
CASES = [
    b'{"text": "plain"}',
    b'{"id": 7, "text": "a\\nb", "meta": {"url": "x", "tags": ["a", 1.5e-3, true, false, null]}}',
    b' {"text" : "spaced" } \r',
    b'{"text": "\\u00e9\\u20AC\\ud83d\\ude00\\/\\b\\f\\r\\t\\"\\\\"}',
    b'{"text": "\\u0000"}',
    b'{"text": "lone \\ud800 high"}',
    b'{"text": "lone \\udc00 low"}',
    b'{"text": "pair cut \\ud83d"}',
    b'{"text": "reversed \\ude00\\ud83d"}',
    b'{"text": "ok", "other": "\\ud800"}',
    b'{"text": "a", "text": "b"}',
    b'{"te\\u0078t": "escaped key"}',
    b'{"text": "a", "te\\u0078t": "b"}',
    b'{"text": ""}',
    b'{"text": "   "}',
    b'{"text": "\\u3000\\n\\u2028"}',
    b'{"text": "\\u001c\\u001d"}',
    b'{"text": " \\u00a0x"}',
    b'{"text": 5}',
    b'{"text": null}',
    b'{"text": ["a"]}',
    b'{"other": "a"}',
    b'{}',
    b'[]',
    b'"text"',
    b'',
    b'   ',
    b'{"text": "a",}',
    b'{"text": "a"} x',
    b'{"text": "a"}}',
    b'{"text": "a"',
    b'{"text": "a\x01"}',
    b'{"text": "a\tb"}',
    b'{"text": "\xff"}',
    b'{"text": "\xc0\x80"}',
    b'{"text": "\xed\xa0\x80"}',
    b'{"text": "\xf4\x90\x80\x80"}',
    b'{"text": "\xe2\x82"}',
    b'{"text": "ok", "x": "\xe2\x82"}',
    b'{"text": "ok", "x": 01}',
    b'{"text": "ok", "x": 1.}',
    b'{"text": "ok", "x": .5}',
    b'{"text": "ok", "x": -}',
    b'{"text": "ok", "x": 1e}',
    b'{"text": "ok", "x": +1}',
    b'{"text": "ok", "x": NaN}',
    b'{"text": "ok", "x": Infinity}',
    b'{"text": "ok", "x": -0.0E+00}',
    b'{"text": "ok", "x": 123456789012345678901234567890}',
    b'{"text": "ok", "x": 1e400}',
    b'{"text": "ok", "x": tru}',
    b'{"text": "ok", "x": [1, 2,]}',
    b'{"text": "ok", "x": {"a" 1}}',
    b'{"text": "ok", "x": "\\x"}',
    b'{"text": "ok", "x": "\\u12g4"}',
    b'{"text": "ok" "x": 1}',
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "ok", "x": ' + b"[" * 100 + b"]" * 100 + b"}",
    b'{"text": "ok", "x": ' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"text":"a\x0cb"}',
    b'{"text":"ok"}\x0c',
]


def parsed(line: bytes):
    """What `inputs.records` reads of a line: orjson's value, else json's; None where neither reads it."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return None


def usable(value, key: str = "text") -> str | None:
    """The text a pretraining step takes from a parsed record, or None where it rejects the record."""
    if not isinstance(value, dict) or not isinstance(value.get(key), str):
        return None
    text = value[key]
    if not text or text.isspace():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return text


def check(lines, keys=KEYS):
    answers = json_texts(lines, keys)
    assert len(answers) == len(lines)
    for line, answer in zip(lines, answers):
        if answer is None:
            continue
        value = parsed(line)
        got = answer if isinstance(answer, tuple) else (answer,)
        for key, text in zip(keys, got):
            want = usable(value, key.decode())
            assert want is not None, line
            assert text == want.encode("utf-8"), line
    return answers


def test_the_cases_are_read_as_the_parsers_read_them():
    answers = check(CASES)
    # the ones it answers; each other one is odd somehow, and left to the parsers
    answered = {0, 1, 2, 3, 4, 17, 47, 48, 49, 57}
    assert [k for k, answer in enumerate(answers) if answer is not None] == sorted(answered)


def random_text(rng):
    pieces = (rng.choice(PIECES) if rng.random() < 0.3 else rng.choice("abc xyz") for _ in range(rng.randint(0, 12)))
    return "".join(pieces)


def random_value(rng, depth=0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return random_text(rng)
    if kind == 1:
        return rng.choice([0, -1, 1.5, 1e-7, 2**63, True, False, None])
    if kind == 2:
        return rng.random() * 10 ** rng.randint(-5, 5)
    if kind == 3:
        return rng.randint(-10**6, 10**6)
    if kind == 4:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {random_text(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_line(rng) -> bytes:
    record = {random_text(rng): random_value(rng) for _ in range(rng.randint(0, 3))}
    if rng.random() < 0.9:
        record["text"] = random_text(rng)
    items = list(record.items())
    rng.shuffle(items)
    if rng.random() < 0.5:
        line = json.dumps(dict(items), ensure_ascii=rng.random() < 0.5)
    else:
        line = json.dumps(dict(items), ensure_ascii=False, indent=None, separators=(", ", " : "))
    data = line.encode("utf-8", "surrogatepass")
    for _ in range(rng.choice([0, 0, 0, 1, 2])):  # a byte changed, cut, or put in
        at = rng.randrange(len(data) + 1)
        how = rng.randrange(3)
        byte = bytes([rng.choice([rng.randrange(256), *SPECIAL])])
        data = data[:at] + byte + data[at + 1:] if how == 0 else data[:at] if how == 1 else data[:at] + byte + data[at:]
    return data


@pytest.mark.parametrize("seed", range(4))
def test_random_lines_and_their_mutants(seed):
    rng = random.Random(seed)
    lines = [random_line(rng) for _ in range(20_000)]
    answers = check(lines)
    # the fast path is taken where it should be: every clean line with a usable text
    for line, answer in zip(lines, answers):
        value = parsed(line)
        # (a key written with an escape is left to the parsers: it might spell "text")
        plain_keys = usable(value) is not None and all(json.dumps(k, ensure_ascii=False)[1:-1] == k for k in value)
        if answer is None and plain_keys and _depth(value) <= 100:
            try:
                clean = json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
            except (UnicodeEncodeError, ValueError):  # a lone surrogate, or no JSON number: left to the parsers
                continue
            assert json_texts([clean], KEYS)[0] is not None, clean


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def test_several_keys_each_once():
    lines = [b'{"a": "x", "b": "y\\n"}', b'{"a": "x"}', b'{"b": "y", "a": "x", "b": "z"}', b'{"a": "x", "b": 1}']
    assert check(lines, (b"a", b"b")) == [(b"x", b"y\n"), None, None, None]


def test_refuses_what_it_cannot_take():
    with pytest.raises(TypeError):
        json_texts([b"{}"], ("text",))
    with pytest.raises(TypeError):
        json_texts(["{}"], KEYS)
    with pytest.raises(ValueError):
        json_texts([b"{}"], ())


@pytest.mark.parametrize("keys", [["text"], ["text", "other"]])
def test_a_run_over_odd_lines_writes_what_the_parsers_alone_make_of_them(tmp_path, monkeypatch, keys):
    """The whole pretraining run, on a corpus of odd lines (the cases, random lines and their mutants), with the
    fast path and with every line left to the parsers: the same documents and the same rejects, certified."""
    import qwen_data.inputs.chunks as chunks
    from _helpers import manifest, pretrain, same_data

    rng = random.Random(11)
    lines = [line.replace(b"\n", b" ") for line in CASES + [random_line(rng) for _ in range(3000)]]
    lines += [json.dumps({"other": random_text(rng) + "x", "text": random_text(rng) + "y"}).encode()
              for _ in range(300)]
    corpus = tmp_path / "odd.jsonl"
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    extra = ["--max-rejects", "100000", "--text-key", ",".join(keys)]
    fast = pretrain([corpus], tmp_path / "fast", *extra)
    monkeypatch.setattr(chunks, "json_texts", lambda lines, keys: [None] * len(lines))
    parsed_only = pretrain([corpus], tmp_path / "parsed", *extra)
    for suffix in ([""] if len(keys) == 1 else [f"_{k}" for k in keys]):
        same_data(fast + suffix, parsed_only + suffix)
        assert manifest(fast + suffix)["certificate"]["certified"]
        assert manifest(fast + suffix)["documents"] >= 300
    assert (tmp_path / "fast.rejects.jsonl").read_bytes() == (tmp_path / "parsed.rejects.jsonl").read_bytes()
