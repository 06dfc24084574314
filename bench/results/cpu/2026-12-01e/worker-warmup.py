import itertools, sys, time
sys.path.insert(0, "/work/main/bench"); import corpora
from qwen_data.inputs.files import expand
from qwen_data.inputs.readers import read_chunks
from qwen_data.steps.pretrain import PretrainConfig, Tokenize
path = corpora.unique_corpus("text-unique-300MB.jsonl", corpora.text_corpus(), 300_000_000)
step = Tokenize(PretrainConfig(inputs=[path], output_prefix="/tmp/prof/o"))
step.prepare(); step.checks = None
read = list(itertools.islice(read_chunks(expand([path]), 1 << 22), 70))
t = []
for c in read:
    s = time.process_time(); step.process(c); t.append(time.process_time() - s)
print(" ".join(f"{sum(t[k:k+5]):.2f}" for k in range(0, 70, 5)))
print("texts encoded", step.tokenizer.texts)
