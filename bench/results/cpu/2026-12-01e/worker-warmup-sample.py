import itertools, sys, time, json
sys.path.insert(0, "/work/main/bench"); import corpora
from qwen_data.inputs.files import expand
from qwen_data.inputs.readers import read_chunks
from qwen_data.steps.pretrain import PretrainConfig, Tokenize
path = corpora.unique_corpus("text-unique-300MB.jsonl", corpora.text_corpus(), 300_000_000)
step = Tokenize(PretrainConfig(inputs=[path], output_prefix="/tmp/prof/o"))
step.prepare(); step.checks = None
how, n = sys.argv[1], int(sys.argv[2])
read = list(itertools.islice(read_chunks(expand([path]), 1 << 22), 60))
s = time.process_time()
if how == "process":
    for c in read[40:40 + n]: step.process(c)
elif how == "encode":
    for c in read[40:40 + n]:
        texts = [json.loads(r.raw)["text"] for r in c.records()]
        step.tokenizer.encode_batch(texts, special=step.config.special_tokens)
w = time.process_time() - s
t = []
for c in read[:20]:
    s = time.process_time(); step.process(c); t.append(time.process_time() - s)
print(how, n, f"warm-up {w:.2f} s;", " ".join(f"{sum(t[k:k+5]):.2f}" for k in range(0, 20, 5)))
