"""`qwen-data pretrain` (default flags, certified) against Megatron-LM's preprocess_data.py way (a Pool of HF
tokenizers), each run whole on the bench text; the ids must be identical (bench/README.md).
"""

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import tempfile

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


def main() -> int | None:
    if sys.argv[1:2] == ["baseline"]:
        return baseline(*sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--docs", type=int, help="only the first N documents")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved: the fastest counts")
    args = parser.parse_args()
    import corpora  # not in the baseline program: it imports qwen_data's tokenizer
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    with tempfile.TemporaryDirectory(prefix="qwen-data-bench-") as work:
        corpus, ours, base = (os.path.join(work, name) for name in ("text.jsonl", "ours", "baseline"))
        with open(corpora.text_corpus(), "rb") as fin, open(corpus, "wb") as fout:
            fout.writelines(itertools.islice(fin, args.docs))
        size = os.path.getsize(corpus) / measure.MB
        print(f"{size:.1f} MB of text, {args.workers} workers, {measure.cpu_model()}")
        argv = measure.qwen_data_command("pretrain", corpus, "-o", ours, "--workers", args.workers, "--quiet")
        base_argv = [sys.executable, __file__, "baseline", corpus, base, args.workers, bundled_tokenizer_dir()]
        measure.against_baseline({"qwen-data pretrain": argv, "Megatron-style HF pool": base_argv}, args.repeat,
                                 size, "MB")
        return measure.verdict(ours, base, "")


if __name__ == "__main__":
    sys.exit(main())
