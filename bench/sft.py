"""`qwen-data sft --template qwen2p5 --assistant-span trl` (certified) against HF's apply_chat_template with
return_assistant_tokens_mask=True in a Pool, each run whole on the bench chats (unpacked, no --seq-length: nothing
cut or set aside); ids and loss masks must be identical (bench/README.md).
"""

import json
import sys

import measure  # first: this checkout's qwen_data


def load(tokenizer_dir: str, template: str) -> int:
    """The pool's initializer: a tokenizer a worker, and the Qwen2.5 template that marks the assistant's tokens."""
    global TOKENIZER, TEMPLATE
    from transformers import AutoTokenizer

    TOKENIZER = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(template, encoding="utf-8") as f:
        TEMPLATE = f.read()
    return len(TOKENIZER)


def encode(line: str) -> tuple:
    out = TOKENIZER.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, chat_template=TEMPLATE)
    return out["input_ids"], out["assistant_masks"]


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
    sys.exit(measure.against_baseline(__doc__, "chat_corpus", "--records", "records", commands, load, encode,
                                      ["", ".lossmask"]))
