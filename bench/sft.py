"""SFT throughput: `qwen-data sft --assistant-span trl` against Hugging Face's own chat-template way
(`apply_chat_template(..., return_assistant_tokens_mask=True)` in a pool: bench/README.md); token ids and
loss masks must be identical.

    python3 bench/sft.py                # both programs, the cached real chats, 2 workers
    python3 bench/sft.py --records 200  # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import measure  # noqa: E402
from measure import CHUNKSIZE, MB  # noqa: E402

SPEED_TARGET = 5.0
TEMPLATE_FILE = "qwen2.5-instruct.assistant-mask.jinja"


# --- the baseline program (runs in its own process: `sft.py baseline IN PREFIX ...`) ---


class HFChatEncoder:
    def __init__(self, tokenizer_dir: str, template_path: str) -> None:
        self.tokenizer_dir, self.template_path = tokenizer_dir, template_path

    def initializer(self) -> None:
        from transformers import AutoTokenizer

        HFChatEncoder.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        with open(self.template_path, encoding="utf-8") as f:
            HFChatEncoder.template = f.read()

    def encode(self, json_line: str):
        out = HFChatEncoder.tokenizer.apply_chat_template(
            json.loads(json_line)["messages"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=HFChatEncoder.template,
        )
        return out["input_ids"], out["assistant_masks"]


def baseline_main(argv: list) -> None:
    parser = argparse.ArgumentParser(prog="sft.py baseline")
    parser.add_argument("input")
    parser.add_argument("prefix")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--template", required=True)
    args = parser.parse_args(argv)

    import multiprocessing

    import numpy as np
    from transformers import AutoTokenizer

    from qwen_data.formats.indexed import IndexedDatasetWriter, token_dtype

    encoder = HFChatEncoder(args.tokenizer, args.template)
    vocab_size = len(AutoTokenizer.from_pretrained(args.tokenizer))
    pool = multiprocessing.Pool(args.workers, initializer=encoder.initializer)
    ids_writer = IndexedDatasetWriter(args.prefix + ".bin", args.prefix + ".idx", token_dtype(vocab_size))
    mask_writer = IndexedDatasetWriter(args.prefix + ".lossmask.bin", args.prefix + ".lossmask.idx", np.uint8)
    with open(args.input, encoding="utf-8") as fin:
        for ids, mask in pool.imap(encoder.encode, fin, CHUNKSIZE):
            ids_writer.add_document(np.array(ids, dtype=ids_writer.dtype))
            mask_writer.add_document(np.array(mask, dtype=np.uint8))
    ids_writer.finalize()
    mask_writer.finalize()
    pool.close()
    pool.join()


# --- the benchmark ---


def run_baseline(corpus: str, prefix: str, workers: int, tokenizer: str) -> measure.Measurement:
    return measure.run_checked([sys.executable, os.path.abspath(__file__), "baseline", corpus, prefix,
                                "--workers", workers, "--tokenizer", tokenizer, "--template", measure.oracle_file(TEMPLATE_FILE)])


def run_ours(corpus: str, prefix: str, workers: int, tokenizer: str | None, *extra: str) -> measure.Measurement:
    extra = (*extra, "--tokenizer", tokenizer) if tokenizer else extra
    return measure.run_checked(measure.qwen_data_command("sft", corpus, "-o", prefix, "--template", "qwen2p5",
                                                         "--assistant-span", "trl", "--workers", workers, "--quiet",
                                                         *extra))


def run_certified(corpus: str, prefix: str, workers: int, tokenizer: str | None) -> measure.Measurement:
    """Ours with the certificate, against the official Jinja (the bundled tokenizer's is Qwen3's)."""
    official = measure.oracle_file("qwen2.5-instruct.jinja")
    return run_ours(corpus, prefix, workers, tokenizer, "--reference-template", official)


def benchmark(args, workdir: str) -> int:
    import corpora

    corpus = args.input or corpora.chat_corpus()
    if args.records:
        corpus = measure.limited_corpus(corpus, args.records, workdir)
    nbytes = os.path.getsize(corpus)
    with open(corpus, "rb") as f:
        records = sum(1 for _ in f)
    print(f"corpus: {corpus}  {nbytes / MB:.1f} MB  {records} records  workers: {args.workers}")
    runners = {"baseline": run_baseline, "ours": run_ours, "certified": run_certified}
    results = measure.best_of(args.repeat, runners, args.programs.split(","), corpus, workdir, args)

    labels = {"baseline": "HF apply_chat_template pool", "ours": "qwen-data sft",
              "certified": "qwen-data sft, certified"}
    rows = []
    for name, m in results.items():
        data = measure.tokens(os.path.join(workdir, name))
        mask = measure.tokens(os.path.join(workdir, name + ".lossmask"))
        rows.append([labels[name], f"{m.wall_s:.2f}", f"{m.cpu_s:.2f}", f"{records / m.wall_s:,.0f}", f"{nbytes / MB / m.wall_s:.2f}",
                     f"{len(data) / 1e6 / m.wall_s:.3f}", f"{int(mask.sum()) / len(mask):.1%}",
                     measure.fmt_mib(m.peak_rss), m.peak_processes])  # fmt: skip
    measure.print_table(rows, ["program", "wall s", "cpu s", "records/s", "MB/s", "Mtok/s", "trained", "peak RSS", "procs"])

    status = 0
    if "ours" in results and "certified" in results:
        print(measure.certificate_cost(results["certified"], results["ours"]))
    if "ours" in results and "baseline" in results:
        measure.against_baseline(results, "records/s", SPEED_TARGET)
        ours_prefix, base_prefix = os.path.join(workdir, "ours"), os.path.join(workdir, "baseline")
        for label, suffix in (("token ids", ""), ("loss masks", ".lossmask")):
            diff = measure.compare_indexed(ours_prefix + suffix, base_prefix + suffix, label)
            print(f"{label} identical: {'yes' if diff is None else 'NO: ' + diff}")
            status |= diff is not None
    return status


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "baseline":
        return baseline_main(sys.argv[2:])
    parser = measure.comparison_arguments(__doc__)
    parser.add_argument("--records", type=int, help="only the first N records")
    parser.add_argument("--programs", default="ours,certified,baseline",
                        help="comma list of: ours, certified (ours with the certificate: --reference-template), baseline")
    args = parser.parse_args()
    measure.in_workdir(args, benchmark)


if __name__ == "__main__":
    main()
