"""`qwen-data sft --layout pai` against Pai-Megatron-Patch's own build_idxmap_sft_dataset.py, byte for byte, on
tests/fixtures/pai_alpaca.jsonl, packed and unpacked (where only the pad id differs, it says so), the records left
out against our rejects, and both wall times; exit status 1 on a difference. --golden writes the sha256 of Pai's
files to tests/fixtures/pai_golden.json (tests/data/test_pai.py).

    python3 -m venv --system-site-packages /tmp/paienv
    /tmp/paienv/bin/pip install "transformers==4.57.6" "megatron-core==0.13.1"   # what Pai's script needs
    git clone https://github.com/alibaba/Pai-Megatron-Patch /tmp/Pai-Megatron-Patch  # no submodules needed
    python3 bench/pai.py --pai /tmp/Pai-Megatron-Patch --python /tmp/paienv/bin/python
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import measure  # first: this checkout's qwen_data
from measure import REPO_ROOT as ROOT

sys.path.insert(1, os.path.join(ROOT, "tests"))

from _helpers import qwen25_tokenizer_folder  # noqa: E402
from qwen_data.formats.digest import sha256_of  # noqa: E402
from qwen_data.text.tokenizer import bundled_tokenizer_dir  # noqa: E402

RECORDS = os.path.join(ROOT, "tests", "fixtures", "pai_alpaca.jsonl")
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "pai_golden.json")
SEQ_LENGTH = 256
# (tokenizer folder, Pai's --patch-tokenizer-type, our --template, the pad id Pai writes)
CASES = [("qwen2.5", "Qwen2Tokenizer", "qwen2p5", 151665), ("qwen3", "Qwen2Tokenizer", "auto", 151669),
         ("qwen3", "Qwen3Tokenizer", "auto", 151643)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pai", required=True, help="a Pai-Megatron-Patch checkout")
    parser.add_argument("--python", default=sys.executable, help="the interpreter Pai's script runs with")
    parser.add_argument("--golden", action="store_true", help=f"write Pai's sha256 to {GOLDEN}")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="pai-bench-")
    folders = {"qwen3": bundled_tokenizer_dir(), "qwen2.5": qwen25_tokenizer_folder(os.path.join(work, "qwen2.5"))}
    script = os.path.join(args.pai, "toolkits", "sft_data_preprocessing", "build_idxmap_sft_dataset.py")
    commit = subprocess.run(["git", "-C", args.pai, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    golden = {"pai_commit": commit.strip() or None, "records": os.path.relpath(RECORDS, ROOT), "seq_length": SEQ_LENGTH,
              "cases": []}
    failures = 0
    print(f"{'case':<34} {'Pai s':>6} {'ours s':>6} {'left out':>9}  result")
    for flavour, tokenizer_type, template, pai_pad in CASES:
        for packed in (False, True):
            name = f"{flavour}-{tokenizer_type}-{'packed' if packed else 'unpacked'}"
            theirs, ours = os.path.join(work, name + "-pai"), os.path.join(work, name + "-ours")
            pai = measure.run([args.python, script, "--input", RECORDS, "--output-prefix", theirs,
                               "--patch-tokenizer-type", tokenizer_type, "--load", folders[flavour], "--seq-length",
                               SEQ_LENGTH, "--workers", "1", "--partitions", "1"]
                              + (["--sequence-packing"] if packed else []),
                              env=dict(os.environ, PYTHONPATH=args.pai), cwd=os.path.dirname(script))
            omitted = pai.stdout.count("omitted")  # the script prints a line for each record it leaves out
            our_s = measure.run(measure.qwen_data_command(
                "sft", RECORDS, "--quiet", "--workers", "1", "--layout", "pai", "--tokenizer", folders[flavour],
                "--template", template, "--seq-length", SEQ_LENGTH, "-o", ours,
                *(["--pack", "--packing", "next-fit"] if packed else []))).wall_s
            theirs += "_text_document"
            with open(ours + ".json", encoding="utf-8") as f:
                manifest = json.load(f)
            our_pad, rejected = manifest["pad_id"], manifest["rejects"]["count"]
            # Our .bin with Pai's pad id in the pad positions (the ids half of each row); ours is never data.
            rows = np.fromfile(ours + ".bin", np.int32).reshape(-1, 2 * SEQ_LENGTH)
            rows[:, :SEQ_LENGTH][rows[:, :SEQ_LENGTH] == our_pad] = pai_pad
            their_bin, their_idx = sha256_of(theirs + ".bin"), sha256_of(theirs + ".idx")
            same_idx = their_idx == sha256_of(ours + ".idx")
            if omitted != rejected:
                result, failures = f"DIFFERENT: Pai left out {omitted} records, we rejected {rejected}", failures + 1
            elif same_idx and their_bin == sha256_of(ours + ".bin"):
                result = "identical"
            elif same_idx and hashlib.sha256(rows.tobytes()).hexdigest() == their_bin:
                result = f"identical but for the pad id ({pai_pad} in Pai's, {our_pad} in ours)"
            else:
                result, failures = "DIFFERENT", failures + 1
            print(f"{name:<34} {pai.wall_s:6.1f} {our_s:6.1f} {f'{omitted}/{rejected}':>9}  {result}")
            golden["cases"].append({"tokenizer": flavour, "pai_tokenizer_type": tokenizer_type, "template": template,
                                    "packed": packed, "pai_pad_id": pai_pad, "left_out": omitted,
                                    "bin_sha256": their_bin, "idx_sha256": their_idx})
    if args.golden:
        with open(GOLDEN, "w", encoding="utf-8") as f:
            json.dump(golden, f, indent=2)
            f.write("\n")
        print(f"wrote {GOLDEN}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
