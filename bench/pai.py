"""`qwen-data sft --layout pai` against Pai-Megatron-Patch's own build_idxmap_sft_dataset.py.

Both run on the same alpaca records (tests/fixtures/pai_alpaca.jsonl) and the same tokenizer folders,
packed and unpacked, and their .bin/.idx are compared byte for byte. Where bytes differ, the
script says whether they are equal once Pai's pad id is put in place of ours in the pad positions.
It also compares the records Pai's script leaves out (a printed line each) with our rejects, and
prints both programs' wall time (each a subprocess, start-up included). Exit status 1 on a difference.

    python3 -m venv --system-site-packages /tmp/paienv
    /tmp/paienv/bin/pip install "transformers==4.57.6" "megatron-core==0.13.1"   # what Pai's script needs
    git clone https://github.com/alibaba/Pai-Megatron-Patch /tmp/Pai-Megatron-Patch  # no submodules needed
    python3 bench/pai.py --pai /tmp/Pai-Megatron-Patch --python /tmp/paienv/bin/python

Pai's script needs transformers < 5 (it takes `apply_chat_template`'s result for a list of ids)
and a megatron-core that still has `megatron.core.datasets.megatron_tokenizer.MegatronTokenizer`.
Cases: the bundled Qwen3 tokenizer folder and a Qwen2.5 one made from it (tests/_helpers.py),
each with Pai's `Qwen2Tokenizer` (pads with an added `<|extra_0|>`) and, for Qwen3, its
`Qwen3Tokenizer` (pads with the folder's pad token, `<|endoftext|>`). `--golden` writes the sha256
of Pai's files to tests/fixtures/pai_golden.json, which tests/data/test_pai.py checks our output against.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.join(ROOT, "tests"))

from _helpers import qwen25_tokenizer_folder  # noqa: E402
from qwen_data.text.tokenizer import bundled_tokenizer_dir  # noqa: E402

RECORDS = os.path.join(ROOT, "tests", "fixtures", "pai_alpaca.jsonl")
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "pai_golden.json")
SEQ_LENGTH = 256
# (tokenizer folder, Pai's --patch-tokenizer-type, our --template, the pad id Pai writes)
CASES = [("qwen2.5", "Qwen2Tokenizer", "qwen2p5", 151665), ("qwen3", "Qwen2Tokenizer", "auto", 151669),
         ("qwen3", "Qwen3Tokenizer", "auto", 151643)]

WORDS = ("the of and a to in is you that it he was for on are as with his they at be this have from "
         "data model token river stone light cloud number garden window paper music answer question "
         "北京 数据 模型 东京 你好 世界 Grüße café naïve δεδομένα данные 😀 🚀 ١٢٣ — … “quoted” "
         "def return {x} [1, 2] (a+b) 3.14 100% #tag @user http://example.com").split()


def make_records(path: str, count: int = 400, seed: int = 16) -> None:
    """Alpaca records of every shape the script handles: empty and non-empty inputs, short and long
    outputs (truncated at SEQ_LENGTH), prompts too long to keep, text with newlines and spaces."""
    rng = random.Random(seed)

    def text(n):
        parts = [rng.choice(WORDS) for _ in range(n)]
        for _ in range(n // 12):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(["\n", "\n\n", "  ", "\t"]))
        return " ".join(parts)

    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            kind = i % 10
            instruction = text(rng.randint(200, 260) if kind == 7 else rng.randint(1, 40))
            query = "" if kind % 2 else text(rng.randint(1, 30))
            output = text(rng.randint(150, 300) if kind == 3 else rng.randint(1, 80))
            f.write(json.dumps({"instruction": instruction, "input": query, "output": output}, ensure_ascii=False) + "\n")


def folders(workdir: str) -> dict[str, str]:
    return {"qwen3": bundled_tokenizer_dir(), "qwen2.5": qwen25_tokenizer_folder(os.path.join(workdir, "qwen2.5"))}


def run_pai(pai: str, python: str, records: str, folder: str, tokenizer_type: str, packed: bool,
            prefix: str) -> tuple[float, int]:
    """Seconds, and how many records the script left out (it prints a line for each)."""
    script = os.path.join(pai, "toolkits", "sft_data_preprocessing", "build_idxmap_sft_dataset.py")
    command = [python, script, "--input", records, "--output-prefix", prefix, "--patch-tokenizer-type",
               tokenizer_type, "--load", folder, "--seq-length", str(SEQ_LENGTH), "--workers", "1",
               "--partitions", "1"] + (["--sequence-packing"] if packed else [])
    env = dict(os.environ, PYTHONPATH=pai)
    start = time.perf_counter()
    out = subprocess.run(command, check=True, env=env, cwd=os.path.dirname(script), capture_output=True,
                         text=True).stdout
    return time.perf_counter() - start, out.count("omitted")


def run_ours(records: str, folder: str, template: str, packed: bool, prefix: str) -> float:
    command = [sys.executable, "-m", "qwen_data.cli", "sft", records, "--quiet", "--workers", "1", "--layout", "pai",
               "--tokenizer", folder, "--template", template, "--seq-length", str(SEQ_LENGTH), "-o", prefix]
    start = time.perf_counter()
    subprocess.run(command + (["--pack", "--packing", "next-fit"] if packed else []), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def with_pad(prefix: str, ours: int, theirs: int) -> bytes:
    """Our .bin with `theirs` in the pad positions (ids half of each row) instead of `ours`."""
    rows = np.fromfile(prefix + ".bin", np.int32).reshape(-1, 2 * SEQ_LENGTH)
    ids = rows[:, :SEQ_LENGTH]
    ids[ids == ours] = theirs  # `ours` is never data: sft rejects a sample that holds its pad id
    return rows.tobytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pai", required=True, help="a Pai-Megatron-Patch checkout")
    parser.add_argument("--python", default=sys.executable, help="the interpreter Pai's script runs with")
    parser.add_argument("--golden", action="store_true", help=f"write Pai's sha256 to {GOLDEN}")
    parser.add_argument("--workdir", default=None, help="keep the outputs here")
    args = parser.parse_args()
    if not os.path.exists(RECORDS):
        os.makedirs(os.path.dirname(RECORDS), exist_ok=True)
        make_records(RECORDS)
    work = args.workdir or tempfile.mkdtemp(prefix="pai-bench-")
    os.makedirs(work, exist_ok=True)
    paths = folders(work)
    commit = subprocess.run(["git", "-C", args.pai, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    golden = {"pai_commit": commit or None, "records": os.path.relpath(RECORDS, ROOT), "seq_length": SEQ_LENGTH,
              "cases": []}
    failures = 0
    print(f"{'case':<34} {'Pai s':>6} {'ours s':>6} {'left out':>9}  result")
    for flavour, tokenizer_type, template, pai_pad in CASES:
        for packed in (False, True):
            name = f"{flavour}-{tokenizer_type}-{'packed' if packed else 'unpacked'}"
            theirs, ours = os.path.join(work, name + "-pai"), os.path.join(work, name + "-ours")
            pai_seconds, omitted = run_pai(args.pai, args.python, RECORDS, paths[flavour], tokenizer_type, packed, theirs)
            our_seconds = run_ours(RECORDS, paths[flavour], template, packed, ours)
            theirs += "_text_document"
            with open(ours + ".json", encoding="utf-8") as f:
                manifest = json.load(f)
            our_pad, rejected = manifest["pad_id"], manifest["rejects"]["count"]
            same_idx = sha256(theirs + ".idx") == sha256(ours + ".idx")
            if omitted != rejected:
                result, failures = f"DIFFERENT: Pai left out {omitted} records, we rejected {rejected}", failures + 1
            elif sha256(theirs + ".bin") == sha256(ours + ".bin") and same_idx:
                result = "identical"
            elif same_idx and hashlib.sha256(with_pad(ours, our_pad, pai_pad)).hexdigest() == sha256(theirs + ".bin"):
                result = f"identical but for the pad id ({pai_pad} in Pai's, {our_pad} in ours)"
            else:
                result, failures = "DIFFERENT", failures + 1
            print(f"{name:<34} {pai_seconds:6.1f} {our_seconds:6.1f} {f'{omitted}/{rejected}':>9}  {result}")
            golden["cases"].append({"tokenizer": flavour, "pai_tokenizer_type": tokenizer_type, "template": template,
                                    "packed": packed, "pai_pad_id": pai_pad, "left_out": omitted,
                                    "bin_sha256": sha256(theirs + ".bin"), "idx_sha256": sha256(theirs + ".idx")})
    if args.golden:
        with open(GOLDEN, "w", encoding="utf-8") as f:
            json.dump(golden, f, indent=2)
            f.write("\n")
        print(f"wrote {GOLDEN}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
