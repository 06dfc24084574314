"""`qwen-data pretrain` (default flags, certified) against Megatron-LM's preprocess_data.py way (a Pool of HF
tokenizers), each run whole on the bench text; the ids must be identical (bench/README.md).
"""

import json
import multiprocessing
import sys

import numpy as np

import measure  # first: this checkout's qwen_data
from qwen_data.formats.indexed import IndexedDatasetWriter, token_dtype  # noqa: E402

EOD_ID = 151643  # <|endoftext|>


def load_tokenizer(directory: str) -> None:
    """The pool's initializer: a tokenizer a worker (preprocess_data.py's Encoder.initializer)."""
    global TOKENIZER
    from transformers import AutoTokenizer

    TOKENIZER = AutoTokenizer.from_pretrained(directory)


def encode(line: str) -> list:
    """preprocess_data.py's Encoder.encode: a document a call, literal special tokens as text, eod appended."""
    ids = TOKENIZER(json.loads(line)["text"], split_special_tokens=True).input_ids
    return ids + [EOD_ID] if ids else ids


def baseline(corpus: str, prefix: str, workers: str, tokenizer_dir: str) -> None:
    """The baseline program: `pretrain.py baseline IN PREFIX WORKERS TOKENIZER_DIR`."""
    load_tokenizer(tokenizer_dir)  # the main process has one too, for the vocabulary size
    writer = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", token_dtype(len(TOKENIZER)))
    pool = multiprocessing.Pool(int(workers), load_tokenizer, [tokenizer_dir])
    with open(corpus, encoding="utf-8") as f:
        for ids in pool.imap(encode, f, chunksize=32):
            writer.add_document(np.array(ids, writer.dtype))
    writer.finalize()


def commands(corpus: str, ours: str, base: str, workers: int) -> dict:
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    return {"qwen-data pretrain": measure.qwen_data_command("pretrain", corpus, "-o", ours, "--workers", workers,
                                                            "--quiet"),
            "Megatron-style HF pool": [sys.executable, __file__, "baseline", corpus, base, workers,
                                       bundled_tokenizer_dir()]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["baseline"]:
        sys.exit(baseline(*sys.argv[2:]))
    import corpora  # not in the baseline program: it imports qwen_data's tokenizer

    sys.exit(measure.against_baseline(__doc__, corpora.text_corpus, "--docs", "MB", commands, [""]))
