import os, sys, time
from qwen_data._native import json_texts
from qwen_data.text.tokenizer import QwenTokenizer
path = os.path.expanduser('~/.cache/qwen-data-bench/certify/text-unique-300MB.jsonl')
with open(path,'rb') as f: data = f.read(150_000_000)
lines = data.split(b'\n')[:-1]
texts = [t for t in json_texts(lines, (b'text',)) if t is not None]
mb = float(sys.argv[2])
A, B = [], texts[len(texts)//4:]
size = 0
for t in texts:
    if size >= mb * 1e6: break
    A.append(t); size += len(t)
tok = QwenTokenizer.shared(); tok.prepare("parse")
backend = tok.backend("parse")
t0 = time.perf_counter()
if sys.argv[1] == "serial":
    for x in A: backend.encode(x)
elif sys.argv[1] == "parallel":
    backend.encode_batch(A, parallel=True)
w = time.perf_counter() - t0
if os.fork() == 0:
    out, cur, size = [], time.process_time(), 0
    for x in B:
        backend.encode(x); size += len(x)
        if size >= 10_000_000:
            now = time.process_time(); out.append(round(now - cur, 3)); cur, size = now, 0
    print(sys.argv[1], mb, f"warm-up {w:.2f} s", out[:8], flush=True)
    os._exit(0)
os.wait()
