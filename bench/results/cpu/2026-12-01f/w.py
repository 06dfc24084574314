import itertools, os, sys, tempfile, time
from qwen_data.certify.checks import checks_for
from qwen_data.inputs.files import expand
from qwen_data.inputs.readers import estimated_records, read_chunks
from qwen_data.run.pipeline import input_list
from qwen_data.steps.pretrain import PretrainConfig, Tokenize
path = os.path.expanduser("~/.cache/qwen-data-bench/certify/text-unique-300MB.jsonl")
n = int(sys.argv[1]); certified = sys.argv[2] == "on"
out = os.path.join(tempfile.mkdtemp(), "o")
step = Tokenize(PretrainConfig(inputs=[path], output_prefix=out))
step.prepare()
sources = expand([path])
checks = checks_for(step, input_list(sources), [estimated_records(s) for s in sources])
step.checks = checks if certified else None
read = list(itertools.islice(read_chunks(sources), n + 1))
step.process(read.pop(0))
b = time.process_time()
for c in read: step.process(c)
print("cpu", time.process_time() - b, file=sys.stderr)
