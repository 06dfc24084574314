"""The certificate's first layer, its loop (`_native.misspelled`): the first document whose ids do not
spell it is found, for each way ids can be wrong."""

import numpy as np
import pytest

from qwen_data.certify.spelling import Speller, SpellingError
from qwen_data.qwen import FIRST_ADDED_ID
from qwen_data.text.tokenizer import QwenTokenizer

TEXTS = ["plain text", "caf\u00e9 \U0001F600 \u00fcn\u00efc\u00f6d\u00e9", "", "a <|im_start|> literal kept as text",
         "x" * 5000 + " long words " * 300, "\r\n\t tabs and 12345"]


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
