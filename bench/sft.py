"""`qwen-data sft --template qwen2p5 --assistant-span trl` (certified) against HF's apply_chat_template with
return_assistant_tokens_mask=True in a Pool, each run whole on the bench chats (unpacked, no --seq-length: nothing
cut or set aside); ids and loss masks must be identical (bench/README.md).
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


def main() -> int | None:
    if sys.argv[1:2] == ["baseline"]:
        return baseline(*sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--records", type=int, help="only the first N records")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved: the fastest counts")
    args = parser.parse_args()
    import corpora  # not in the baseline program: it imports qwen_data's tokenizer
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    with tempfile.TemporaryDirectory(prefix="qwen-data-bench-") as work:
        corpus, ours, base = (os.path.join(work, name) for name in ("chats.jsonl", "ours", "baseline"))
        with open(corpora.chat_corpus(), "rb") as fin, open(corpus, "wb") as fout:
            records = list(itertools.islice(fin, args.records))
            fout.writelines(records)
        print(f"{len(records)} chats, {args.workers} workers, {measure.cpu_model()}")
        argv = measure.qwen_data_command("sft", corpus, "-o", ours, "--template", "qwen2p5", "--assistant-span", "trl",
                                         "--reference-template", measure.oracle_file("qwen2.5-instruct.jinja"),
                                         "--workers", args.workers, "--quiet")
        base_argv = [sys.executable, __file__, "baseline", corpus, base, args.workers, bundled_tokenizer_dir(),
                     measure.oracle_file("qwen2.5-instruct.assistant-mask.jinja")]
        measure.against_baseline({"qwen-data sft": argv, "HF apply_chat_template pool": base_argv}, args.repeat,
                                 len(records), "records")
        return measure.verdict(ours, base, "", ".lossmask")


if __name__ == "__main__":
    sys.exit(main())
