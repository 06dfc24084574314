"""The default backend's ids against HF `tokenizers` on the bench corpora, and what its routing costs.

gigatoken reads Unicode from newer tables than HF `tokenizers`; QwenTokenizer sends the texts holding
a character of `qwen_data.text.unicode_exact.EXACT_RANGES` to HF (the exact path). For each corpus
(text.jsonl documents, chats.jsonl messages) this prints how many texts took the exact path, on how
many bare gigatoken's ids differ from HF's, and on how many the default backend's ids do (must be 0:
the script exits 1 otherwise).

Speed, with the routing against without it:
  pipeline  `qwen-data pretrain` on text.jsonl, whole, as a subprocess (2 workers); "without" is the
            same command with the routing switched off; wall and CPU seconds of the process tree;
  encode    `encode_batch` alone in ~4 MB batches like the pipelines, CPU seconds of this process
            and the part of them spent routing, a fresh tokenizer for each run; "cold" is its first
            pass over the corpus (the routing learns which token ids matter then), "warm" a second
            pass over the same texts (gigatoken then finds every word in its cache, so the routing's
            share is largest);
and `needs_exact` alone on every text, per MB.

    python3 bench/exact.py                 # both corpora (built on first use, see corpora.py)
    python3 bench/exact.py --docs 2000     # the first 2000 texts of each, a quick check
    python3 bench/exact.py --repeat 3      # fastest of 3 runs counts (the machines are shared)
    python3 bench/exact.py --no-pipeline   # skip the pipeline runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import measure  # noqa: E402
from measure import MB  # noqa: E402

from qwen_data.text.tokenizer import QwenTokenizer  # noqa: E402
from qwen_data.text.unicode_exact import needs_exact  # noqa: E402

BATCH_BYTES = 4 << 20  # qwen_data.inputs.records.DEFAULT_CHUNK_BYTES: what one encode_batch call gets in a pipeline


def corpus_texts(docs: int | None) -> dict[str, list[str]]:
    import corpora

    with open(corpora.text_corpus(), encoding="utf-8") as f:
        text = [json.loads(line)["text"] for line in f]
    with open(corpora.chat_corpus(), encoding="utf-8") as f:
        chats = [m["content"] for line in f for m in json.loads(line)["messages"]]
    return {"text.jsonl documents": text[:docs], "chats.jsonl messages": chats[:docs]}


def batches(texts: list[str]) -> list[list[str]]:
    out, size = [[]], 0
    for t in texts:
        if size >= BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(t)
        size += len(t)
    return out


def bare_encode(tokenizer: QwenTokenizer, texts: list[str], special: str) -> tuple[np.ndarray, np.ndarray]:
    """encode_batch's gigatoken path without the routing."""
    import awkward as ak

    encoded = tokenizer.backend(special).encode_batch(texts, parallel=False)
    return np.asarray(ak.flatten(encoded, axis=1), dtype=np.int32), np.asarray(ak.num(encoded, axis=1), dtype=np.int64)


def rows(ids: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(ids, np.cumsum(lengths)[:-1]) if len(lengths) else []


def hf_reference(tokenizer: QwenTokenizer, special: str):
    """HF `tokenizers` on the same (Qwen3) files: every added token parsed, or none ("text")."""
    from tokenizers import Tokenizer

    with open(os.path.join(tokenizer.directory, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    if special == "text":
        spec["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(spec))


def check_ids(name: str, texts: list[str], special: str) -> bool:
    ours = QwenTokenizer()
    reference = hf_reference(ours, special)
    exact = bare_differs = routed_differs = 0
    start = time.perf_counter()
    for batch in batches(texts):
        theirs = [e.ids for e in reference.encode_batch(batch, add_special_tokens=False)]
        routed = rows(*ours.encode_batch(batch, special))
        bare = rows(*bare_encode(ours, batch, special))
        exact += sum(map(needs_exact, batch))
        bare_differs += sum(not np.array_equal(b, t) for b, t in zip(bare, theirs))
        routed_differs += sum(not np.array_equal(r, t) for r, t in zip(routed, theirs))
    print(f"{name}: {len(texts)} texts, {sum(len(t.encode()) for t in texts) / MB:.1f} MB, special={special} "
          f"({time.perf_counter() - start:.0f} s)")
    print(f"  exact path (a character of EXACT_RANGES): {exact}")
    print(f"  ids differ from HF, bare gigatoken:       {bare_differs}")
    print(f"  ids differ from HF, default backend:      {routed_differs}"
          f"  -> {'100% equal' if routed_differs == 0 else 'NOT EQUAL'}")
    return routed_differs == 0


def speed(name: str, texts: list[str], special: str, repeat: int) -> None:
    """encode_batch's CPU time, and the part of it spent routing (timed inside the same calls, so
    that load from others on the machine hits both alike)."""
    parts = batches(texts)
    nbytes = sum(len(t.encode()) for t in texts) / MB
    best: dict = {}
    for _ in range(repeat):
        tokenizer = QwenTokenizer()  # fresh: gigatoken caches the words it has seen
        tokenizer.prepare(special)
        routing = [0.0]
        for method in ("exact_rows", "_splice_hf"):
            setattr(tokenizer, method, timed(getattr(tokenizer, method), routing))
        for run in ("cold", "warm"):
            routing[0] = 0.0
            start = time.process_time()
            for b in parts:
                tokenizer.encode_batch(b, special)
            total = time.process_time() - start
            if run not in best or total < best[run][0]:
                best[run] = (total, routing[0])
    start = time.process_time()
    for t in texts:
        needs_exact(t)
    alone = time.process_time() - start
    print(f"{name}: encode_batch CPU s (fastest of {repeat}), {nbytes:.1f} MB")
    for run, (total, routing) in best.items():
        print(f"  {run}: {total:.3f} s ({nbytes / total:.1f} MB/s), of which routing {routing:.3f} s "
              f"({routing / nbytes * 1e3:.2f} ms/MB): with / without routing = {total / (total - routing):.3f}")
    print(f"  needs_exact on every text: {alone / nbytes * 1e3:.2f} ms/MB (the routing asks it only about texts"
          f" with a token that can spell a table character)")


def timed(method, spent: list):
    def run(*args):
        start = time.process_time()
        try:
            return method(*args)
        finally:
            spent[0] += time.process_time() - start

    return run


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


BARE_CLI = ("import sys; from qwen_data.text.tokenizer import QwenTokenizer; QwenTokenizer.exact_rows = lambda *a: []; "
            "from qwen_data.cli import main; sys.exit(main(sys.argv[1:]))")


def pipeline_speed(corpus: str, workers: int, repeat: int) -> None:
    """`qwen-data pretrain` whole, with the routing and with it switched off; identical outputs."""
    workdir = tempfile.mkdtemp(prefix="qwen-data-exact-")
    try:
        best: dict = {}
        for _ in range(repeat):
            for way, program in (("routing", ["-m", "qwen_data.cli"]), ("bare", ["-c", BARE_CLI])):
                prefix = os.path.join(workdir, way)
                argv = [sys.executable, *program, "pretrain", corpus, "-o", prefix, "--workers", workers, "--quiet"]
                m = measure.run_measured(argv, env=measure.python_env()).check()
                if way not in best or m.wall_s < best[way].wall_s:
                    best[way] = m
        same = all(read(os.path.join(workdir, "routing" + ext)) == read(os.path.join(workdir, "bare" + ext))
                   for ext in (".bin", ".idx"))
        nbytes = os.path.getsize(corpus) / MB
        print(f"pipeline: qwen-data pretrain {os.path.basename(corpus)} ({nbytes:.1f} MB), {workers} workers, "
              f"fastest of {repeat}, outputs {'identical' if same else 'DIFFERENT'}")
        for way, m in best.items():
            print(f"  {way}: wall {m.wall_s:.2f} s ({nbytes / m.wall_s:.1f} MB/s), CPU {m.cpu_s:.2f} s")
        r, b = best["routing"], best["bare"]
        print(f"  routing / bare: wall {r.wall_s / b.wall_s:.3f}, CPU {r.cpu_s / b.cpu_s:.3f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, help="only the first N texts of each corpus")
    parser.add_argument("--repeat", type=int, default=1, help="speed runs per way; the fastest counts")
    parser.add_argument("--special", default="text", choices=["text", "parse"], help="literal added tokens policy")
    parser.add_argument("--workers", type=int, default=2, help="pipeline workers")
    parser.add_argument("--no-pipeline", action="store_true", help="skip the qwen-data pretrain runs")
    args = parser.parse_args()
    ok = True
    for name, texts in corpus_texts(args.docs).items():
        ok &= check_ids(name, texts, args.special)
        speed(name, texts, args.special, args.repeat)
    if not args.no_pipeline:
        import corpora

        corpus = corpora.text_corpus()
        if args.docs:
            corpus = os.path.join(tempfile.mkdtemp(prefix="qwen-data-exact-"), "first.jsonl")
            with open(corpora.text_corpus(), encoding="utf-8") as fin, open(corpus, "w", encoding="utf-8") as fout:
                fout.writelines(line for _, line in zip(range(args.docs), fin))
        pipeline_speed(corpus, args.workers, args.repeat)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
