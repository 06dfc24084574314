"""The spelling loop alone, both ways, in this process: ns a token over the bench text's first 10,000 documents."""
import json, sys, time, numpy as np
sys.path.insert(0, "bench"); import corpora
from qwen_data.text.tokenizer import QwenTokenizer
from qwen_data.certify.spelling import Speller
from qwen_data import _native
t = QwenTokenizer.shared(); t.prepare("parse"); sp = Speller(t, "parse")
texts = [json.loads(l)["text"] for l, _ in zip(open(corpora.text_corpus()), range(10000))]
chunks = []
for k in range(0, len(texts), 500):
    ids, counts = t.encode_batch(texts[k:k + 500])
    chunks.append((np.ascontiguousarray(ids, np.int32), np.ascontiguousarray(counts, np.int64), t.as_encoded or texts[k:k + 500]))
n = sum(len(c[0]) for c in chunks)
best = {}
for r in range(8):
    for path in ("scalar", "avx512"):
        _native.spelling_path(path)
        s = time.perf_counter()
        for ids, counts, enc in chunks:
            assert _native.misspelled(ids, counts, enc, sp.entries, sp.table.flat, 0, sp.wide) == -1
        best[path] = min(best.get(path, 9), (time.perf_counter() - s) / n * 1e9)
print({k: round(v, 2) for k, v in best.items()}, "ns a token;", n, "tokens; avx512/scalar", round(best["avx512"] / best["scalar"], 3))
