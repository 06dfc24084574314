"""`qwen-data sft --template qwen2p5 --assistant-span trl` (certified) against HF's apply_chat_template with
return_assistant_tokens_mask=True in a Pool, each run whole on the bench chats (unpacked, no --seq-length: nothing
cut or set aside); ids and loss masks must be identical (bench/README.md).
"""

import json
import multiprocessing
import sys

import numpy as np

import measure  # first: this checkout's qwen_data
from qwen_data.formats.indexed import IndexedDatasetWriter, token_dtype  # noqa: E402


def load(tokenizer_dir: str, template: str) -> None:
    """The pool's initializer: a tokenizer a worker, and the Qwen2.5 template that marks the assistant's tokens."""
    global TOKENIZER, TEMPLATE
    from transformers import AutoTokenizer

    TOKENIZER = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(template, encoding="utf-8") as f:
        TEMPLATE = f.read()


def encode(line: str) -> tuple:
    out = TOKENIZER.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, chat_template=TEMPLATE)
    return out["input_ids"], out["assistant_masks"]


def baseline(corpus: str, prefix: str, workers: str, tokenizer_dir: str, template: str) -> None:
    """The baseline program: `sft.py baseline IN PREFIX WORKERS TOKENIZER_DIR TEMPLATE`."""
    load(tokenizer_dir, template)  # the main process has one too, for the vocabulary size
    ids_out = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", token_dtype(len(TOKENIZER)))
    mask_out = IndexedDatasetWriter(prefix + ".lossmask.bin", prefix + ".lossmask.idx", np.uint8)
    pool = multiprocessing.Pool(int(workers), load, [tokenizer_dir, template])
    with open(corpus, encoding="utf-8") as f:
        for ids, mask in pool.imap(encode, f, chunksize=32):
            ids_out.add_document(np.array(ids, ids_out.dtype))
            mask_out.add_document(np.array(mask, np.uint8))
    ids_out.finalize()
    mask_out.finalize()


def commands(corpus: str, ours: str, base: str, workers: int) -> dict:
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    template = measure.oracle_file("qwen2.5-instruct.jinja")
    return {"qwen-data sft": measure.qwen_data_command("sft", corpus, "-o", ours, "--template", "qwen2p5",
                                                       "--assistant-span", "trl", "--reference-template", template,
                                                       "--workers", workers, "--quiet"),
            "HF apply_chat_template pool": [sys.executable, __file__, "baseline", corpus, base, workers,
                                            bundled_tokenizer_dir(),
                                            measure.oracle_file("qwen2.5-instruct.assistant-mask.jinja")]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["baseline"]:
        sys.exit(baseline(*sys.argv[2:]))
    import corpora  # not in the baseline program: it imports qwen_data's tokenizer

    sys.exit(measure.against_baseline(__doc__, corpora.chat_corpus, "--records", "records", commands,
                                      ["", ".lossmask"]))
