"""A worker's own work: a step's `process` over the same chunks, certified and not, this tree against another
revision's `qwen_data/` (its C built as the package builds it), each run a process of its own, the rounds
interleaved; CPU seconds over the chunks, or with --callgrind the instructions (valgrind, a run over no chunk
subtracted: what the step's set-up costs). Pretrain: the never-repeating text (`corpora.UNIQUE`); SFT: scaled chats,
packed, checked against the template's official Jinja. --layers: this tree alone, also certified with the first
layer (every document's spelling, `Step._spell`) left out: what of the certified worker's cost that layer is.

    python3 bench/worker.py --job pretrain --against f3f8492 [--chunks 6] [--rounds 3] [--callgrind]
    python3 bench/worker.py --job pretrain --layers --chunks 30 --rounds 5
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile

import measure  # first: this checkout's qwen_data
import corpora

TEMPLATE = "qwen2.5-instruct.jinja"
# One run: the step prepared and its checker built as a run builds them, a chunk processed untimed (timed runs: its
# caches warm), then CPU seconds.
CHILD = """
import itertools, os, sys, tempfile, time
import qwen_data
# the tree asked for (its folder is the working directory), not another one an editable install puts first
if not os.path.realpath(qwen_data.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep):
    sys.exit(f"qwen_data came from {qwen_data.__file__}, not the tree in {os.getcwd()}: uninstall the editable install")
from qwen_data.certify.checks import checks_for
from qwen_data.inputs.files import expand
from qwen_data.inputs.readers import estimated_records, read_chunks
from qwen_data.run.pipeline import input_list
job, path, chunks, jinja = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
certified, warm = sys.argv[4] != "off", sys.argv[6] == "warm"
out = os.path.join(tempfile.mkdtemp(), "o")
if job == "pretrain":
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize
    step = Tokenize(PretrainConfig(inputs=[path], output_prefix=out))
else:
    from qwen_data.steps.sft import ChatSamples, SFTConfig
    step = ChatSamples(SFTConfig(inputs=[path], output_prefix=out, template="qwen2p5", pack=True, seq_length=4096,
                                 reference_template=jinja))
if sys.argv[4] == "unspelled":
    type(step)._spell = lambda self, *args: None
step.prepare()
sources = expand([path])
checks = checks_for(step, input_list(sources), [estimated_records(s) for s in sources])
step.checks = checks if certified else None
read = list(itertools.islice(read_chunks(sources), chunks + warm))
if warm:
    step.process(read.pop(0))
began = time.process_time()
for chunk in read:
    step.process(chunk)
print(time.process_time() - began)
"""


def tree_of(revision: str, work: str) -> str:
    """A folder holding `revision`'s qwen_data/, its C built there."""
    root = os.path.join(work, revision.replace("/", "_"))
    os.makedirs(root)
    archive = subprocess.run(["git", "archive", revision, "qwen_data"], cwd=measure.REPO_ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    package = os.path.join(root, "qwen_data")
    measure.build_native(os.path.join(package, "_native.c"),
                         os.path.join(package, "_native" + sysconfig.get_config_var("EXT_SUFFIX")))
    return root


MODES = {False: "off", True: "on", "unspelled": "unspelled"}  # how a run is certified: the child's word for it


def run(root: str, args, corpus: str, jinja: str, certified, chunks: int) -> float:
    """One process's CPU seconds, or with --callgrind its instructions (`certified`: a key of MODES)."""
    env = measure.python_env(root)  # (its qwen_data first)
    command = [sys.executable, "-c", CHILD, args.job, corpus, str(chunks), MODES[certified], jinja,
               "cold" if args.callgrind else "warm"]
    if not args.callgrind:  # (run in the tree: `-c` puts the current folder first on the path)
        return float(subprocess.run(command, cwd=root, env=env, check=True, capture_output=True, text=True).stdout)
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command], cwd=root, env=env,
                       check=True, capture_output=True)
        summary = subprocess.run(["callgrind_annotate", out], check=True, capture_output=True, text=True).stdout
    return float(next(line for line in summary.splitlines() if "PROGRAM TOTALS" in line).split()[0].replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", choices=("pretrain", "sft"), default="pretrain")
    parser.add_argument("--against", default="HEAD", help="the git revision whose qwen_data/ is the baseline")
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true", help="instructions (valgrind) instead of CPU seconds")
    parser.add_argument("--layers", action="store_true", help="this tree alone: also certified without the spelling")
    args = parser.parse_args()
    if args.callgrind and not shutil.which("valgrind"):
        raise SystemExit("--callgrind: valgrind is not installed")
    corpus = (corpora.unique_corpus("text-unique-300MB.jsonl", corpora.text_corpus(), 300_000_000)
              if args.job == "pretrain" else corpora.scaled_sft_corpus("chat", 300_000_000))
    jinja = measure.oracle_file(TEMPLATE, None)
    modes = list(MODES) if args.layers else [False, True]
    with tempfile.TemporaryDirectory() as work:
        trees = {"ours": measure.REPO_ROOT, **({} if args.layers else {args.against: tree_of(args.against, work)})}
        found = {(tree, mode): [] for tree in trees for mode in modes}
        for r in range(1 if args.callgrind else args.rounds):
            for tree in list(trees)[:: 1 if r % 2 == 0 else -1]:  # the order flips every round
                for certified in modes[:: 1 if r % 2 == 0 else -1]:
                    value = run(trees[tree], args, corpus, jinja, certified, args.chunks)
                    if args.callgrind:
                        value -= run(trees[tree], args, corpus, jinja, certified, 0)
                    found[tree, certified].append(value)
    report(found, list(trees), args.callgrind)


def report(found: dict, trees: list, instructions: bool) -> None:
    unit = "M instructions" if instructions else "CPU s"
    scale = 1e-6 if instructions else 1.0
    median = {key: statistics.median(values) for key, values in found.items()}
    for tree in trees:
        off, on = median[tree, False], median[tree, True]
        print(f"{tree:>12}: uncertified {off * scale:,.2f} {unit}, certified {on * scale:,.2f} ({on / off:.3f}x)")
        if (tree, "unspelled") in median:
            unspelled = median[tree, "unspelled"]
            print(f"{'':>12}  certified without the spelling {unspelled * scale:,.2f} ({unspelled / off:.3f}x): "
                  f"the spelling {(on - unspelled) / (on - off):.0%} of what certifying adds")
    if len(trees) < 2:
        return
    ours, theirs = trees
    print(f"ours / {theirs}: uncertified {median[ours, False] / median[theirs, False]:.3f}, "
          f"certified {median[ours, True] / median[theirs, True]:.3f}")


if __name__ == "__main__":
    main()
