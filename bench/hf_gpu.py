"""Real Qwen shapes through the train stage and back into transformers, on a GPU (docs/performance.md).

    python3 bench/hf_gpu.py data            # here: packed qwen2p5 SFT chats with a held-out split in .gpu/
    python3 bench/hf_gpu.py run MODEL ...   # there: MODEL qwen2.5-0.5b and/or qwen3-0.6b; results under $OUT
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DATA = ".gpu/hf_sft_blend.txt"  # relative: the blend names its prefixes as given, and runs elsewhere
CHATS = os.path.expanduser(os.environ.get("QWEN_DATA_BENCH_CACHE", "~/.cache/qwen-data-bench")) + "/chats.jsonl"

# The released config.json values (research/qwen.md §4), in the files' own (pre-transformers-5) spelling.
COMMON = {"attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
          "initializer_range": 0.02, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
          "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
CONFIGS = {
    "qwen2.5-0.5b": dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896,
                         intermediate_size=4864, max_position_embeddings=32768, max_window_layers=21,
                         num_attention_heads=14, num_hidden_layers=24, num_key_value_heads=2, sliding_window=32768),
    "qwen3-0.6b": dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False,
                       head_dim=128, hidden_size=1024, intermediate_size=3072, max_position_embeddings=40960,
                       max_window_layers=28, num_attention_heads=16, num_hidden_layers=28, num_key_value_heads=8,
                       rope_scaling=None, sliding_window=None),
}
STEPS = int(os.environ.get("HF_BENCH_STEPS", 100))
RUN = ["--data", DATA, "--seq-length", "4096", "--micro-batch-size", "1", "--global-batch-size", "8",
       "--num-workers", "2", "--warmup-iters", "10", "--lr", "1e-4", "--log-interval", "10"]
EVAL = ["--eval-interval", str(STEPS), "--eval-iters", "4"]


def data() -> None:
    """~6.5 MB of the bench corpus's ShareGPT chats, packed at 4096, 90/10 train/validation."""
    os.makedirs(".gpu", exist_ok=True)
    chats = ".gpu/hf_chats.jsonl"
    with open(CHATS, encoding="utf-8") as src, open(chats, "w", encoding="utf-8") as out:
        for line in src:
            if out.tell() > 6.5e6:
                break
            out.write(line)
    prefix = ".gpu/hf_sft"
    for command in (["sft", chats, "--template", "qwen2p5", "-o", prefix, "--seq-length", "4096", "--pack", "--quiet"],
                    ["blend", prefix, "--split", "90,10,0", "-o", DATA]):
        subprocess.run([sys.executable, "-m", "qwen_data.cli", *command], check=True)
    os.remove(chats)


def make_folder(name: str, directory: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(CONFIGS[name], f, indent=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:  # the released file, not transformers 5's rewrite
        json.dump(CONFIGS[name], f, indent=2)


def train(args: list[str], log: str) -> tuple[dict, str]:
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "train", *args], capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"train failed, see {log}:\n{done.stderr[-3000:]}")
    steady = re.search(r"steady state .*: tokens_per_s ([\d.e+]+)", done.stdout)
    with open(args[args.index("--log-json") + 1]) as f:
        valid = [r["valid_loss"] for r in map(json.loads, f) if "valid_loss" in r]
    return {"tokens_per_s": float(steady[1]), "valid_loss": valid[-1] if valid else None,
            "wall_s": time.time() - started}, done.stdout


def transformers_eval(folder: str) -> dict:
    """The exported model's masked loss over the train stage's evaluation rows: the validation
    split's first eval_iters × global batch samples (one data-parallel rank), each packed
    sequence run alone (positions from 0), per-token cross-entropy in float32."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qwen_data_train.config import TrainConfig
    from qwen_data_train.data import samples_of_row
    from qwen_data_train.loader import build_splits

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    config = TrainConfig.parse(RUN + EVAL + ["--train-iters", str(STEPS)])
    _, valid = build_splits(config, 8)
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(int(EVAL[-1]) * 8):  # eval_iters global batches
            row = {k: torch.as_tensor(v).unsqueeze(0) for k, v in valid[i].items()}
            for start, end, alone in samples_of_row(row):
                logits = model(input_ids=alone["tokens"].to(device), position_ids=alone["position_ids"].to(device)).logits
                losses = F.cross_entropy(logits[0].float(), alone["labels"][0].to(device), reduction="none")
                mask = row["loss_mask"][0, start:end].to(device)
                total += torch.stack([(losses * mask).sum(), mask.sum()]).double().cpu()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name three rivers."}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**{k: v.to(device) for k, v in prompt.items()}, max_new_tokens=16, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1]:]
    return {"transformers_valid_loss": (total[0] / total[1]).item(), "generated_tokens": len(new),
            "generated": tokenizer.decode(new)}


def run(name: str, out: str) -> dict:
    folder, exported = f".gpu/hf-{name}", f".gpu/out-{name}"
    make_folder(name, folder)
    result = {"model": name}
    hf, stdout = train(RUN + EVAL + ["--train-iters", str(STEPS), "--hf-model", folder, "--save-hf", exported,
                                     "--log-json", f"{out}/{name}-hf.jsonl"], f"{out}/{name}-hf.log")
    result.update({f"hf_{k}": v for k, v in hf.items()})
    result.update(transformers_eval(exported))
    result["loss_rel_diff"] = abs(result["transformers_valid_loss"] - hf["valid_loss"]) / hf["valid_loss"]
    preset, _ = train(RUN + ["--train-iters", str(max(2, STEPS * 2 // 5)), "--model", name,
                             "--log-json", f"{out}/{name}-preset.jsonl"], f"{out}/{name}-preset.log")
    result["preset_tokens_per_s"] = preset["tokens_per_s"]
    result["tokens_per_s_ratio_hf_vs_preset"] = hf["tokens_per_s"] / preset["tokens_per_s"]
    print(json.dumps(result, indent=2, ensure_ascii=False), flush=True)
    return result


def main() -> None:
    os.chdir(ROOT)
    if len(sys.argv) < 2 or sys.argv[1] not in ("data", "run"):
        raise SystemExit(__doc__)
    stage = sys.argv[1]
    if stage == "data":
        return data()
    out = os.path.abspath(os.environ.get("OUT", "bench/results/gpu"))
    os.makedirs(out, exist_ok=True)
    results = [run(name, out) for name in sys.argv[2:]]
    with open(os.path.join(out, "hf_gpu.json"), "w") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)


if __name__ == "__main__":
    main()
