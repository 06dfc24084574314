"""`qwen-data pretrain` (default flags, certified) against Megatron-LM's preprocess_data.py way (a Pool of HF
tokenizers), each run whole on the bench text; the ids must be identical (bench/README.md).
"""

import json
import sys

import measure  # first: this checkout's qwen_data

EOD_ID = 151643  # <|endoftext|>


def load_tokenizer(directory: str) -> int:
    """The pool's initializer: a tokenizer a worker (preprocess_data.py's Encoder.initializer)."""
    global TOKENIZER
    from transformers import AutoTokenizer

    TOKENIZER = AutoTokenizer.from_pretrained(directory)
    return len(TOKENIZER)


def encode(line: str) -> list:
    """preprocess_data.py's Encoder.encode: a document a call, literal special tokens as text, eod appended."""
    ids = TOKENIZER(json.loads(line)["text"], split_special_tokens=True).input_ids
    return [ids + [EOD_ID] if ids else ids]


def commands(corpus: str, ours: str, base: str, workers: int) -> dict:
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    return {"qwen-data pretrain": measure.qwen_data_command("pretrain", corpus, "-o", ours, "--workers", workers,
                                                            "--quiet"),
            "Megatron-style HF pool": [sys.executable, __file__, "baseline", corpus, base, workers,
                                       bundled_tokenizer_dir()]}


if __name__ == "__main__":
    sys.exit(measure.against_baseline(__doc__, "text_corpus", "--docs", "MB", commands, load_tokenizer, encode, [""]))
