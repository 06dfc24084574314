"""The certificate's first layer, its loop (`_native.misspelled`): the first document whose ids do not
spell it is found, for each way ids can be wrong."""

import numpy as np
import pytest

from qwen_data.certify.spelling import Speller, SpellingError
from qwen_data.qwen import FIRST_ADDED_ID
from qwen_data.text.tokenizer import QwenTokenizer

TEXTS = ["plain text", "caf\u00e9 \U0001F600 \u00fcn\u00efc\u00f6d\u00e9", "", "a <|im_start|> literal kept as text",
         "x" * 5000 + " long words " * 300, "\r\n\t tabs and 12345",
         # each width of str (Latin-1, two bytes, four): the check makes their UTF-8 itself
         "na\u00efve caf\u00e9s and r\u00e9sum\u00e9s, " * 9, "\u201cquoted\u201d \u041a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430 \u4e2d\u6587 ascii run " * 9,
         "\U0001F600 four-byte \U00010348 " * 9]


@pytest.fixture(scope="module")
def encoded():
    tokenizer = QwenTokenizer()
    ids, counts = tokenizer.encode_batch(TEXTS, "text")
    return Speller(tokenizer, "text"), ids, counts


def _broken(ids, counts, k, how):
    ids, at = ids.copy(), int(np.cumsum(counts)[k] - counts[k])
    if how == "changed":
        ids[at + 1] += 1
    elif how == "control":
        ids[at] = FIRST_ADDED_ID  # <|endoftext|> as a control id: the text policy keeps literals as text
    elif how == "outside":
        ids[at] = 10_000_000
    elif how == "negative":
        ids[at] = -1
    return ids


@pytest.mark.parametrize("how", ["changed", "control", "outside", "negative"])
def test_the_first_wrong_document_is_found(encoded, how):
    speller, ids, counts = encoded
    assert speller.first_misspelled(TEXTS, ids, counts) == -1
    speller.check_texts(TEXTS, ids, counts)
    broken = _broken(ids, counts, 3, how)
    assert speller.first_misspelled(TEXTS, broken, counts) == 3
    assert speller.first_misspelled(TEXTS, broken, counts, first=4) == -1
    with pytest.raises(SpellingError) as error:
        speller.check_texts(TEXTS, broken, counts)
    assert error.value.index == 3
    words = {"changed": "spell other bytes", "control": "control id 151643", "outside": "outside the vocabulary",
             "negative": "outside the vocabulary"}[how]
    assert words in str(error.value)


def test_an_id_moved_across_documents_or_a_text_cut_short_is_found(encoded):
    speller, ids, counts = encoded
    short = counts.copy()
    short[0] -= 1  # document 0 loses its last id to document 1
    short[1] += 1
    assert speller.first_misspelled(TEXTS, ids, short) == 0
    assert speller.first_misspelled(TEXTS[:1] + ["plain tex"] + TEXTS[2:], ids, counts) == 1
    for k in (6, 7, 8):  # one character changed in a text of each width
        changed = TEXTS[k][:40] + ("y" if TEXTS[k][40] != "y" else "z") + TEXTS[k][41:]
        assert speller.first_misspelled(TEXTS[:k] + [changed] + TEXTS[k + 1:], ids, counts) == k
    # a lone surrogate has no UTF-8: the text is named, for the slower check to say why
    assert speller.first_misspelled(TEXTS[:7] + [TEXTS[7] + "\ud800"] + TEXTS[8:], ids, counts) == 7


def test_ids_spelling_far_more_or_less_than_their_text_are_found(encoded):
    """The loop writes the ids' bytes out and checks that they stay within the text only every few
    tokens: ids spelling kilobytes more than their text (short tokens, long ones, both) are refused,
    as are ids spelling less, and a barred id among many good ones."""
    speller, ids, counts = encoded
    long = TEXTS[4]
    many, n = speller.tokenizer.encode_batch([long], "text")
    for text in ("", "x", long[:100], long[:-1], long + "x"):
        assert speller.first_misspelled(["plain text", text], np.concatenate([ids[:counts[0]], many]),
                                        np.array([counts[0], n[0]])) == 1, len(text)
    barred = many.copy()
    barred[len(barred) // 2] = FIRST_ADDED_ID
    assert speller.first_misspelled([long], barred, n) == 0
    assert speller.first_misspelled([long], many, n) == -1


def test_a_byte_changed_anywhere_in_a_long_token_is_found(encoded):
    """Tokens longer than 8 bytes are compared 8 bytes at a time, the last 8 overlapping: a byte
    changed at each place of each such token (ASCII text: a character is a byte) is found."""
    speller = encoded[0]
    texts = ["internationalization " + "-" * 40 + " " * 40 + "=" * 16 + " responsibilities" + " " * 17 + "def"]
    ids, counts = speller.tokenizer.encode_batch(texts, "text")
    assert speller.first_misspelled(texts, ids, counts) == -1
    lengths = speller.table.lengths[ids]
    starts = np.cumsum(lengths) - lengths
    long = np.flatnonzero(lengths > 8)
    assert len(long) >= 4 and lengths[long].max() >= 32, lengths
    for t in long:
        for j in range(int(lengths[t])):
            at = int(starts[t]) + j
            changed = texts[0][:at] + ("#" if texts[0][at] != "#" else "@") + texts[0][at + 1:]
            assert speller.first_misspelled([changed], ids, counts) == 0, (t, j)


def test_the_utf8_the_encoder_left_on_a_str_is_read_as_a_copy_without_it_is(encoded):
    """gigatoken asks CPython for each text's UTF-8, which stays on the str: the check reads it there;
    a copy of the text (built character by character: nothing asked for its UTF-8) is made UTF-8 by
    the check itself. Both ways find the same documents."""
    speller, ids, counts = encoded
    texts = list(TEXTS)  # the objects the fixture encoded: their UTF-8 is cached
    copies = ["".join(list(t)) for t in TEXTS]
    for given in (texts, copies):
        assert speller.first_misspelled(given, ids, counts) == -1
        for k in (1, 6, 7, 8):
            assert speller.first_misspelled(given, _broken(ids, counts, k, "changed"), counts) == k


# -- the structure mask (`_native.structure_mask`) against numpy's way of deriving it ------------------
HEADER, EMPTY_THINK = b"<|im_start|>assistant\n", b"<think>\n\n</think>\n\n"


def _numpy_structure_mask(spelled, ids, token_starts, sample_ends, span, last_only, empty_think_is_prompt):
    """The mask as the previous numpy version derived it, byte offsets first: the oracle here."""
    from qwen_data.qwen import IM_END_ID, IM_START_ID

    heads, ends = np.flatnonzero(ids == IM_START_ID), np.flatnonzero(ids == IM_END_ID)
    closing = np.searchsorted(ends, heads)
    samples = np.searchsorted(sample_ends, heads, side="right")
    by_sample = {}
    for h, k, s in zip(heads.tolist(), closing.tolist(), samples.tolist()):
        start = int(token_starts[h])
        if spelled[start:start + len(HEADER)] != HEADER or k == len(ends) or ends[k] >= sample_ends[s]:
            continue
        content, close = start + len(HEADER), int(token_starts[ends[k]]) + len("<|im_end|>")
        stop = close + (spelled[close:close + 1] == b"\n")
        first = {"im_end_nl": content, "im_end": content, "trl": content - 1, "turn": start}[span]
        last = close if span == "im_end" else stop
        turn = [(first, last)]
        if empty_think_is_prompt and spelled.startswith(EMPTY_THINK, content):
            turn = [(first, content), (content + len(EMPTY_THINK), last)]
        by_sample.setdefault(s, []).append(turn)
    pieces = [p for turns in by_sample.values() for turn in (turns[-1:] if last_only else turns)
              for p in turn if p[1] > p[0]]
    trained = np.zeros(len(ids) + 1, dtype=np.int32)
    if pieces:
        a, b = np.asarray(pieces, dtype=np.int64).T
        token_ends = np.append(token_starts[1:], len(spelled))
        np.add.at(trained, np.searchsorted(token_ends, a, side="right"), 1)
        np.add.at(trained, np.searchsorted(token_starts, b, side="left"), -1)
    return (np.cumsum(trained[:-1]) > 0).astype(np.uint8)


CHATML = ["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n",
          "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\na1<|im_end|>\n"
          "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</think>\n\na2<|im_end|>",
          "<|im_start|>assistant\ncut short, no end",
          "<|im_start|>assistantx\nnot a header<|im_end|>\n<|im_start|>assistant\n\n<|im_end|><|im_end|>\n",
          "<|im_start|>assistant\n<|im_start|>assistant\ntwo heads<|im_end|>\nafter"]


@pytest.mark.parametrize("span", ["im_end_nl", "im_end", "trl", "turn"])
def test_the_structure_mask_is_numpys(span):
    from qwen_data.certify.spelling import structure_mask
    from qwen_data.qwen import IM_END_ID, IM_START_ID

    tokenizer = QwenTokenizer()
    speller = Speller(tokenizer, "parse")
    rng = np.random.default_rng(5)
    texts = CHATML * 3
    ids, counts = tokenizer.encode_batch(texts, "parse")
    cases = [(ids, counts)]
    for _ in range(20):  # control ids put anywhere, samples cut anywhere: every branch, any order
        mixed = ids.copy()
        at = rng.integers(0, len(mixed), 12)
        mixed[at] = rng.choice([IM_START_ID, IM_END_ID], 12)
        cuts = np.sort(rng.choice(np.arange(1, len(mixed)), 6, replace=False))
        cases.append((mixed, np.diff(np.concatenate([[0], cuts, [len(mixed)]]))))
    for case_ids, case_counts in cases:
        spelled = speller.table.spell(case_ids)
        lengths = speller.table.lengths[case_ids.astype(np.intp)]
        starts = np.cumsum(lengths) - lengths
        for last_only in (False, True):
            for think in (False, True):
                ends = np.cumsum(case_counts)
                expected = _numpy_structure_mask(spelled, case_ids, starts, ends, span, last_only, think)
                found = structure_mask(speller.table, case_ids, ends, span, last_only, think)
                assert np.array_equal(found, expected), (span, last_only, think)
    assert structure_mask(speller.table, ids, np.cumsum(counts), span, False, False).any()


# -- the table itself ---------------------------------------------------------------------------------
def test_the_table_spells_each_piece_byte_by_byte_in_hfs_alphabet():
    """The table (built at C speed: `Spelling.from_json`) gives each id the bytes its vocabulary piece's
    characters stand for one by one, and each added token its UTF-8; the alphabet is HF's byte-level one.
    Then the ids HF itself makes of texts in several scripts spell those texts."""
    import json

    from tokenizers import Tokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    from qwen_data.certify.spelling import Spelling
    from qwen_data.qwen import BYTE_OF_CHAR

    assert set(BYTE_OF_CHAR) == set(ByteLevel.alphabet()) and sorted(BYTE_OF_CHAR.values()) == list(range(256))
    tokenizer = QwenTokenizer()
    table = Spelling.from_json(tokenizer._json_text, tokenizer.added_tokens, tokenizer.vocab_size)
    expected = [b""] * tokenizer.vocab_size
    for piece, i in json.loads(tokenizer._json_text)["model"]["vocab"].items():
        expected[i] = bytes(BYTE_OF_CHAR[c] for c in piece)
    for content, i in tokenizer.added_tokens.items():
        expected[i] = content.encode("utf-8")
    assert [table.flat[a:b].tobytes() for a, b in zip(table.starts[:-1], table.starts[1:])] == expected
    hf = Tokenizer.from_str(tokenizer._json_text)
    for text in TEXTS + ["ÿ\u00ad\u00a0 \x00\x7f <|im_start|>"]:
        assert table.spell(np.asarray(hf.encode(text, add_special_tokens=False).ids)) == text.encode("utf-8")
    broken = tokenizer._json_text.replace('"!": 0', '"\\u00a0": 0', 1)  # a character outside the alphabet
    assert broken != tokenizer._json_text
    with pytest.raises(ValueError, match="outside byte-level BPE's alphabet"):
        Spelling.from_json(broken, tokenizer.added_tokens, tokenizer.vocab_size)
