"""GPU checks of the train stage that are not a training run (those are `python -m train` itself): packed, attention,
profile (`-- TRAIN-ARGS`, torchrun alike, rank 0 reports), split, same-weights (`-- A B`) and hf (`-- MODEL ...`, after
`bench/gpu.sh data`; $OUT/hf_gpu.json). What each does and how bench/gpu.sh runs it: bench/README.md.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity
from torch.profiler import profile as profiler
from qwen_data_train import optimizer
from qwen_data_train.attention import compiled_flex_attention, document_mask, have_transformer_engine
from qwen_data_train.config import TrainConfig
from qwen_data_train.data import build_datasets, samples_of_row
from qwen_data_train.distributed import distributed, init_distributed
from qwen_data_train.loader import build_splits
from qwen_data_train.loop import Trainer, model_of
from qwen_data_train.model import build_model
from qwen_data_train.patches import megatron_core
from qwen_data_train.plan import Environment, RunPlan
from qwen_data_train.shapes import PRESETS
from qwen_data_train.step import ForwardSpec, forward

from measure import write_json

PROFILED = 2  # steps


def packed(args) -> None:
    device = init_distributed(1)
    train, _, _ = build_datasets(args.data, args.seq_length, train_samples=args.rows, valid_samples=0,
                                 test_samples=0, seed=1234)
    torch.manual_seed(1234)
    model = build_model(RunPlan.for_model(PRESETS[args.model], attention=args.attention,
                                          max_sequence_length=args.seq_length, cuda=True)).to(device).eval()
    print(f"{args.model}, attention {args.attention}, {args.rows} packed rows of {args.seq_length} from {args.data}")
    for autocast in (True, False) if args.attention != "te" else (True,):
        spec = ForwardSpec(args.attention, device, autocast, cross_entropy="megatron", seq_length=args.seq_length)
        worst = trained_worst = total = count = leak = 0.0
        samples = 0
        for i in range(args.rows):
            row = {k: torch.as_tensor(v).unsqueeze(0) for k, v in train[i].items()}
            with torch.no_grad():
                whole = forward(model, row, spec)[0].float()
                # The control: a causal mask over the whole row, across sample boundaries.
                leaky = forward(model, dict(row, segment_ids=torch.zeros_like(row["segment_ids"])), spec)[0].float()
                for start, end, alone in samples_of_row(row):
                    diff = (whole[start:end] - forward(model, alone, spec)[0].float()).abs()
                    trained = row["loss_mask"][0, start:end].to(device) > 0
                    worst = max(worst, diff.max().item())
                    if trained.any():
                        trained_worst = max(trained_worst, diff[trained].max().item())
                    total, count, samples = total + diff.sum().item(), count + diff.numel(), samples + 1
                leak = max(leak, (whole - leaky).abs().max().item())
        print(f"[{'bf16 autocast' if autocast else 'float32'}] {samples} samples: per-token loss |packed - alone| max "
              f"{worst:.3e} (trained tokens: max {trained_worst:.3e}), mean {total / count:.3e}; "
              f"control, attention leaking across samples: max {leak:.3e}")


def attention(args) -> None:
    preset, device = PRESETS[args.model], torch.device("cuda")
    b, s, d, heads = args.micro_batch_size, args.seq_length, preset.kv_channels, preset.num_attention_heads
    q = torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, preset.num_query_groups, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grad = torch.randn_like(q)

    def run(fn):  # the output and the q, k, v gradients against `grad`
        q.grad = k.grad = v.grad = None
        out = fn()
        out.backward(grad)
        return [out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]

    def rel(a, b):  # the worst relative difference over the output and the three gradients
        return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b))

    def time_it(fn, n=20):
        for _ in range(3):
            fn().backward(grad)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn().backward(grad)
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0) / n

    def flex(segments):
        mask = document_mask(segments).block_mask
        return lambda: compiled_flex_attention(q, k, v, block_mask=mask, scale=d ** -0.5, enable_gqa=True)

    def sdpa(mask=None):
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                                        scale=d ** -0.5, enable_gqa=True)

    one_doc, ref = torch.zeros(b, s, dtype=torch.int32, device=device), run(sdpa())
    print(f"one document a row, [{b}, {heads}/{k.shape[1]} heads, {s}, {d}] bf16: "
          f"SDPA causal {time_it(sdpa()):.2f} ms, "
          f"flex {time_it(flex(one_doc)):.2f} ms (differs by {rel(run(flex(one_doc)), ref):.1e})")
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                print(f"  SDPA causal by {backend.name}: {time_it(sdpa()):.2f} ms "
                      f"(differs by {rel(run(sdpa()), ref):.1e})")
        except RuntimeError as e:  # a backend that does not take this shape
            print(f"  SDPA causal by {backend.name}: not run ({str(e).splitlines()[0][:100]})")
    if have_transformer_engine():
        from transformer_engine.pytorch import DotProductAttention

        te = DotProductAttention(heads, d, num_gqa_groups=k.shape[1], qkv_format="bshd", attn_mask_type="causal",
                                 softmax_scale=d ** -0.5)

        def bshd():
            return te(*(t.transpose(1, 2).contiguous() for t in (q, k, v))).view(b, s, heads, d).transpose(1, 2)

        print(f"one document a row: Transformer Engine (cuDNN fused attention) {time_it(bshd):.2f} ms "
              f"(differs from SDPA by {rel(run(bshd), ref):.1e})")
    # Four documents a row, as bench/gpu.sh's packed SFT rows hold on average.
    seg = (torch.rand(b, s, device=device) < 3 / s).cumsum(-1).to(torch.int32)
    dense = sdpa(document_mask(seg.cpu()).dense().to(device))
    print(f"~4 documents a row: flex {time_it(flex(seg)):.2f} ms (differs from SDPA with a dense mask by "
          f"{rel(run(flex(seg)), run(dense)):.1e})")


def profile(args) -> None:
    config = TrainConfig.parse(args.rest)
    plan = RunPlan.resolve(config, model_of(config)[0], Environment.current())
    with megatron_core(), distributed(plan.tp, plan.pp, plan.ep, plan.cp) as device:  # torchrun: every rank
        trainer = Trainer(config, device, plan)
        for _ in range(4):  # past compilation
            trainer.train_step()
        torch.cuda.synchronize()
        with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            for _ in range(PROFILED):
                trainer.train_step()
            torch.cuda.synchronize()
        step_ms = 1000 * (time.perf_counter() - started) / PROFILED
        if dist.get_rank() != 0:
            return
        events = prof.key_averages()
        # Kernels' own time (streams that overlap count twice): near the step time the GPU is the bound, far below
        # it the host's launches or waits are.
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.self_device_time_total for e in kernels) / 1000 / PROFILED
        print(f"{step_ms:.0f} ms/step over {PROFILED} profiled steps; GPU kernels {busy_ms:.0f} ms/step "
              f"({busy_ms / step_ms:.0%})")
        print(events.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


def split_join(args) -> None:
    shape = PRESETS[args.model]
    h, q = shape.hidden_size, shape.num_attention_heads * shape.kv_channels
    kv = shape.num_query_groups * shape.kv_channels
    layer = [(q + 2 * kv, h), (h, q), (2 * shape.ffn_hidden_size, h), (h, shape.ffn_hidden_size)]
    weights = [torch.randn(rows, columns, device="cuda") for rows, columns in layer * shape.num_layers]
    eager = [optimizer._split(w) for w in weights]
    for name, split_, join in [("eager", optimizer._split, optimizer._join),
                               ("compiled", optimizer.split_float32, optimizer.join_float32)] * 2:
        torch.cuda.synchronize()
        started = time.perf_counter()
        parts = [split_(w) for w in weights]
        joined = [join(high, low) for high, low in parts]
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) and torch.equal(la, lb)
                   for (a, la), (b, lb) in zip(parts, eager))
        same = same and all(torch.equal(j.view(torch.int32), optimizer._join(*e).view(torch.int32))
                            for j, e in zip(joined, eager))
        print(f"{name}: split and join of {sum(w.numel() for w in weights) / 1e9:.2f}G elements "
              f"{1000 * (time.perf_counter() - started):.1f} ms, bits as eager: {same}")


def same_weights(args) -> None:
    from safetensors.torch import load_file

    a, b = ({k: v for path in sorted(glob.glob(os.path.join(folder, "*.safetensors")))
             for k, v in load_file(path).items()} for folder in args.rest)
    differ = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not a[k].equal(b[k]))
    print(f"{len(a)} tensors in {args.rest[0]}, {len(b)} in {args.rest[1]}: "
          + (f"differ: {differ[:5]}" if differ else "same weights"))
    sys.exit(1 if differ else 0)


# hf: HF folders with the released config.json values (in the files' own, pre-transformers-5, spelling) ->
# --hf-model -> --save-hf -> transformers.
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
STEPS, EVAL_ITERS = 100, 4
RUN = ["--data", ".gpu/hf_sft_blend.txt", "--seq-length", "4096", "--micro-batch-size", "1", "--global-batch-size", "8",
       "--num-workers", "2", "--warmup-iters", "10", "--lr", "1e-4", "--log-interval", "10"]
EVAL = ["--eval-interval", str(STEPS), "--eval-iters", str(EVAL_ITERS)]


def train_run(args: list[str], log: str) -> dict:
    """A train run: its steady-state tokens/s (the log's summary line), last validation loss and wall time."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "train", *args], capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"train failed, see {log}:\n{done.stderr[-3000:]}")
    with open(args[args.index("--log-json") + 1]) as f:
        lines = [json.loads(line) for line in f]
    valid = [r["valid_loss"] for r in lines if "valid_loss" in r]
    return {"tokens_per_s": lines[-1]["tokens_per_s"], "valid_loss": valid[-1] if valid else None,
            "wall_s": time.time() - started}


def transformers_eval(folder: str) -> dict:
    """The exported model's masked loss over the train stage's evaluation rows (the validation split's first
    eval_iters x global batch samples), each packed sequence run alone, cross-entropy in float32; and a generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model = model.to(device).eval()
    _, valid = build_splits(TrainConfig.parse(RUN + EVAL + ["--train-iters", str(STEPS)]), 8)
    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(EVAL_ITERS * 8):
            row = {k: torch.as_tensor(v).unsqueeze(0) for k, v in valid[i].items()}
            for start, end, alone in samples_of_row(row):
                logits = model(input_ids=alone["tokens"].to(device),
                               position_ids=alone["position_ids"].to(device)).logits
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


def make_folder(name: str, folder: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIGS[name], f, indent=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16).save_pretrained(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:  # the released file, not transformers 5's rewrite
        json.dump(CONFIGS[name], f, indent=2)


def hf(args) -> None:
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # .gpu/ and the blend's paths are relative
    out = os.path.abspath(os.environ.get("OUT", "bench/results/gpu"))
    results = []
    for name in args.rest:
        folder, exported = f".gpu/hf-{name}", f".gpu/out-{name}"
        make_folder(name, folder)
        run = train_run(RUN + EVAL + ["--train-iters", str(STEPS), "--hf-model", folder, "--save-hf", exported,
                                      "--log-json", f"{out}/{name}-hf.jsonl"], f"{out}/{name}-hf.log")
        result = {"model": name, **{f"hf_{k}": v for k, v in run.items()}, **transformers_eval(exported)}
        result["loss_rel_diff"] = abs(result["transformers_valid_loss"] - run["valid_loss"]) / run["valid_loss"]
        preset = train_run(RUN + ["--train-iters", str(max(2, STEPS * 2 // 5)), "--model", name,
                                  "--log-json", f"{out}/{name}-preset.jsonl"], f"{out}/{name}-preset.log")
        result["preset_tokens_per_s"] = preset["tokens_per_s"]
        result["tokens_per_s_ratio_hf_vs_preset"] = run["tokens_per_s"] / preset["tokens_per_s"]
        print(json.dumps(result, indent=2, ensure_ascii=False), flush=True)
        results.append(result)
        write_json(os.path.join(out, "hf_gpu.json"), results)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", choices=["packed", "attention", "profile", "split", "same-weights", "hf"])
    p.add_argument("--data", default=".gpu/sft_packed.json")
    p.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    p.add_argument("--seq-length", type=int, default=4096)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "te"], help="packed: the core attention")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    args.rest = argv[split + 1:]  # profile: the train stage's arguments; same-weights: two folders; hf: models
    {"packed": packed, "attention": attention, "profile": profile, "split": split_join, "same-weights": same_weights,
     "hf": hf}[args.check](args)


if __name__ == "__main__":
    main()
