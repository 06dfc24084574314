"""The train stage on the CPU: tiny Qwen-shaped GPTModels on prefixes written by the real
`qwen-data pretrain` / `qwen-data sft --pack` CLIs, through `qwen-data blend` and megatron-core's
dataset builder.

  - a pretraining blend trains (loss falls), checkpoints with dist_checkpointing and resumes to the
    very same losses as an uninterrupted run;
  - TP=2 × DP=2 (torchrun, gloo) gives the same losses and gradient norms as one process, and so
    do two pipeline stages (PP=2, alone and × DP=2), whose checkpoint resumes in one process;
  - packed SFT rows: every sample's per-token losses equal those of the sample run alone, and the
    SDPA core attention equals megatron-core's own local attention;
  - the records give MFU in both counts (causal by document, full by row) given a peak, and the
    log's last line names the run (model, gpus, fp8, packed, ep) and the machine.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from _helpers import write_jsonl
from _train import run_train as _train
from _train import torchrun, train_prefixes


pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

TRAIN = ["--model", "tiny", "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--log-interval", "1", "--num-workers", "0", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup-iters", "1"]


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    return train_prefixes(tmp_path_factory.mktemp("train_data"))


@pytest.fixture(scope="module")
def full_run(prefixes, tmp_path_factory):
    """6 steps: (records, stdout, the run's folder: TensorBoard in tb/)."""
    out = tmp_path_factory.mktemp("full")
    records, stdout = _train(["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "6", *TRAIN,
                              "--tensorboard-dir", str(out / "tb")], out / "log.jsonl")
    return records, stdout, out


def assert_same_steps(records, reference, stdout, says):
    """A run took the reference's steps (losses and gradient norms, step by step), and its output
    `says` how it ran."""
    assert says in stdout
    assert [r["iteration"] for r in records] == [r["iteration"] for r in reference]
    for mine, theirs in zip(records, reference):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)


def test_pretrain_blend_trains(full_run):
    records, stdout, _ = full_run
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0]["loss"] > 11  # ln(151,936) ≈ 11.9 at initialisation
    assert records[-1]["loss"] < records[0]["loss"] - 2
    assert all(0 <= r["data_share"] < 1 and r["tokens_per_s"] > 0 for r in records)
    assert "tok/s" in stdout and "data" in stdout
    # the run's first lines: what its data check read (before anything is built); then, on a CPU, bf16
    # weights are not built, so the default holds float32 ones
    first, second = stdout.splitlines()[:2]
    assert re.fullmatch(r"data: 2 prefixes, [\d.]+ MB checked against their manifests in [\d.]+ s", first), first
    assert "float32 weights (split bf16 weights: it computes under bf16 autocast" in second


def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(folder))
    events.Reload()
    return lambda tag: [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_holds_what_the_log_says(full_run):
    records, _, out = full_run
    scalars = _scalars(out / "tb")
    for field in ("loss", "lr", "grad_norm", "tokens_per_s", "data_share"):
        assert scalars(f"train/{field}") == [(r["iteration"], pytest.approx(r[field], rel=1e-6)) for r in records]


def test_the_log_ends_with_the_summary_and_the_machine(full_run):
    """Without a peak (--peak-tflops, or a known GPU) there is no MFU; the JSON log's last line is the
    steady state and the machine: no GPU here, the CPU's model."""
    records, stdout, out = full_run
    assert not any(k.startswith("mfu") for r in records for k in r) and "MFU" not in stdout
    with open(out / "log.jsonl") as f:
        summary = [json.loads(line) for line in f][-1]
    assert summary["summary"] is True and summary["iterations"] == 6 and summary["tokens_per_s"] > 0
    assert not any(k.startswith("mfu") for k in summary)
    from train.metrics import GPU_QUERY, SAMPLED

    assert all(summary[k] is None for k in ("gpu_name", "gpu_uuid", *GPU_QUERY, *SAMPLED))
    assert isinstance(summary["cpu_model"], str) and summary["cpu_model"]
    # what the run was, for bench/records.py: without its command line
    assert {k: summary[k] for k in ("model", "gpus", "fp8", "packed", "ep", "bf16_weights")} == {
        "model": "tiny", "gpus": 1, "fp8": None, "packed": False, "ep": 1, "bf16_weights": False}


def test_bench_records_read_the_log(full_run, monkeypatch):
    """bench/records.py takes the run and the machine from the log's summary, steps and the last loss
    from its intervals."""
    records, _, out = full_run
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    import records as bench_records

    try:
        found = bench_records.record("cpu", str(out / "log.jsonl"))
    finally:
        sys.modules.pop("records", None)
    with open(out / "log.jsonl") as f:
        summary = [json.loads(line) for line in f][-1]
    assert found["steps"] == 6 and found["loss_at_end"] == round(records[-1]["loss"], 4)
    assert found["tokens_per_s_per_gpu"] == found["tokens_per_s"] > 0  # one process
    assert {k: found[k] for k in (*bench_records.RUN, *bench_records.MACHINE)} == {
        k: summary[k] for k in (*bench_records.RUN, *bench_records.MACHINE)}


@pytest.mark.parametrize("data,seq_length", [("pretrain_blend.json", 128), ("sft_blend.json", 256)])
def test_mfu_counts_causal_attention_by_document_and_full_attention_by_row(prefixes, tmp_path, data, seq_length):
    """Both counts share the products with weights (6 FLOPs a weight a token); the full one adds the
    attention of whole rows (12·layers·heads·head_dim·s a token), the causal one half of each
    document's: s a token for pretraining rows (one document), less for packed SFT rows."""
    log = tmp_path / "log.jsonl"
    records, stdout = _train(["--data", str(prefixes / data), "--train-iters", "3", *TRAIN, "--seq-length",
                              str(seq_length), "--peak-tflops", "1"], log)
    from qwen_data_train.shapes import PRESETS

    shape, peak = PRESETS["tiny"], 1e12
    weights = 6 * shape.matmul_params()
    per_position = 6 * shape.num_layers * shape.num_attention_heads * shape.kv_channels
    assert "% (causal) / " in stdout and "% (full)" in stdout
    for r in records:
        flops_per_token = r["mfu_full"] * peak / r["tokens_per_s"]
        assert flops_per_token == pytest.approx(weights + 2 * per_position * seq_length, rel=1e-9)
        # the causal count's Σ sᵢ² a token: s for rows of one document, less for rows of several
        attended = (r["mfu_causal"] * peak / r["tokens_per_s"] - weights) / per_position
        if data.startswith("pretrain"):
            assert attended == pytest.approx(seq_length, rel=1e-6)
        else:
            assert 1 < attended < 0.9 * seq_length
    with open(log) as f:
        summary = [json.loads(line) for line in f][-1]
    assert 0 < summary["mfu_causal"] <= summary["mfu_full"]
    assert summary["packed"] is data.startswith("sft")  # the SFT prefix is packed (sft --pack)


def test_validation_loss_is_logged_and_reaches_tensorboard(prefixes, tmp_path):
    records, stdout = _train(["--data", str(prefixes / "web"), "--split", "80,20,0", "--train-iters", "2", *TRAIN,
                              "--eval-interval", "1", "--eval-iters", "1", "--tensorboard-dir", str(tmp_path / "tb")],
                             tmp_path / "log.jsonl")
    valid = [r for r in records if "valid_loss" in r]
    assert [r["iteration"] for r in valid] == [1, 2] and "validation at iteration 2: loss" in stdout
    assert all(9 < r["valid_loss"] < 13 for r in valid)  # ln(151,936) ≈ 11.9 near initialisation
    assert _scalars(tmp_path / "tb")("validation/loss") == [(r["iteration"], pytest.approx(r["valid_loss"], rel=1e-6))
                                                           for r in valid]


def test_checkpoint_resume_continues_exactly(prefixes, full_run, tmp_path):
    data = ["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "6", *TRAIN]
    first, _ = _train(data + ["--save", str(tmp_path / "ckpt"), "--exit-after", "3"], tmp_path / "a.jsonl")
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert (tmp_path / "ckpt" / "iter_0000003" / "metadata.json").is_file()  # a dist_checkpointing directory
    second, stdout = _train(data + ["--load", str(tmp_path / "ckpt")], tmp_path / "b.jsonl")
    assert_same_steps(first + second, full_run[0], stdout, "resumed from")


def test_tensor_and_data_parallel_match_one_process(prefixes, full_run, tmp_path):
    data = ["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "6", "--exit-after", "3", *TRAIN]
    records, stdout = _train(data + ["--tp", "2"], tmp_path / "tp2dp2.jsonl", nproc=4)
    assert "TP 2 × PP 1 × DP 2" in stdout
    for mine, reference in zip(records, full_run[0][:3]):
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-4)
        assert mine["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-3)


def test_recompute_gives_the_same_gradients(megatron_cpu):
    """Full and selective (MLP) recompute run megatron-core's checkpointed forward again in
    backward: the loss and every gradient equal those of a model that kept its activations."""
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    tokens = torch.randint(0, 151_000, (2, 64))
    positions = torch.arange(64).expand(2, -1)

    def losses_and_grads(recompute):
        torch.manual_seed(0)
        model = build_model(RunPlan.for_model(PRESETS["tiny"], attention="sdpa", recompute=recompute)).train()
        loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).sum()
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss, grads = losses_and_grads(None)
    for recompute in ("full", "selective"):
        again, regrads = losses_and_grads(recompute)
        assert again == pytest.approx(loss, rel=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(regrads[name], grad, rtol=1e-5, atol=1e-7, msg=f"{recompute}: {name}")


def test_recompute_runs_under_the_autocast_of_its_forward(megatron_cpu):
    """megatron-core's checkpoint recomputes in backward, after the autocast block has closed (as
    it has on autograd's CUDA thread): megatron-core's own checkpoint recomputes float32, the one
    megatron_core() puts in its place (where megatron-core calls it) under the forward's autocast."""
    from megatron.core import tensor_parallel

    def dtypes_seen(checkpoint):
        seen = []
        weight = torch.randn(8, 8, requires_grad=True)

        def layer(x):
            y = x @ weight
            seen.append(y.dtype)
            return y

        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = checkpoint(layer, False, torch.randn(4, 8, requires_grad=True))
        out.float().sum().backward()
        return seen  # [forward, recompute]

    assert dtypes_seen(tensor_parallel.random.checkpoint) == [torch.bfloat16, torch.float32]
    assert dtypes_seen(tensor_parallel.checkpoint) == [torch.bfloat16, torch.bfloat16]


def test_moe_router_trains_under_bf16_autocast(megatron_cpu):
    """The trainer's float32 weights under bf16 autocast: without the patch the backward of
    megatron-core's router product multiplies a bf16 gradient by a float32 weight and fails (as
    it did on the GPUs); with it the router's logits and gradients are float32."""
    from megatron.core.transformer.moe import moe_utils, router

    def router_grad(gating_linear):
        inp = torch.randn(6, 16, requires_grad=True)
        weight = torch.randn(8, 16, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = gating_linear(inp, weight, None, torch.float32)
        logits.float().sum().backward()
        return logits.dtype, weight.grad.dtype

    with pytest.raises(RuntimeError, match="same dtype"):
        router_grad(moe_utils.router_gating_linear)  # megatron-core's own
    assert router_grad(router.router_gating_linear) == (torch.float32, torch.float32)  # where the router calls it

    # from a bf16 residual stream (its router_dtype then bf16): the logits still float32, each gradient its tensor's
    inp = torch.randn(6, 16, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(8, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = router.router_gating_linear(inp, weight, None, torch.bfloat16)
    logits.sum().backward()
    assert (logits.dtype, inp.grad.dtype, weight.grad.dtype) == (torch.float32, torch.bfloat16, torch.float32)
    torch.testing.assert_close(logits, inp.float() @ weight.t())


@pytest.mark.parametrize("fp32_residual", [False, True])
def test_the_residual_stream_starts_in_autocast_dtype(megatron_cpu, fp32_residual):
    """Under autocast the embedding's output, which the layers add to, is bf16 (--fp32-residual-connection:
    float32, the embedding table's), and pipeline stages pass it in that dtype."""
    from qwen_data_train.model import build_model
    from qwen_data_train.model.transformer import transformer_config
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    plan = RunPlan.for_model(PRESETS["tiny"], attention="sdpa", max_sequence_length=128, autocast=True,
                             fp32_residual=fp32_residual)
    model = build_model(plan).to(megatron_cpu)
    tokens = torch.randint(0, 1000, (2, 16), device=megatron_cpu)
    positions = torch.arange(16, device=megatron_cpu).repeat(2, 1)
    with torch.autocast(megatron_cpu.type, dtype=torch.bfloat16):
        stream = model.embedding(input_ids=tokens, position_ids=positions)
    dtype = torch.float32 if fp32_residual else torch.bfloat16
    assert stream.dtype == transformer_config(plan).pipeline_dtype == dtype
    assert model.embedding(input_ids=tokens, position_ids=positions).dtype == torch.float32  # no autocast, no cast


@pytest.mark.parametrize("autocast", [False, True])
def test_grouped_experts_compute_what_sequential_experts_do(megatron_cpu, autocast):
    """The experts as two grouped products give the loss and gradients of megatron-core's
    sequential experts, from the same parameters (float32; bf16 autocast within its rounding):
    over two steps of two micro-batches, each step's micro-batches sharing one stack of the
    weights (experts.weights_shared), and the weights changed between the steps as an optimizer
    changes them (a stack kept from the first step would compute the second with old weights)."""
    from qwen_data_train.model import build_model
    from qwen_data_train.model.experts import weights_shared
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss

    if (megatron_cpu.type == "cuda") != autocast:
        pytest.skip("CUDA's grouped GEMM takes bf16 (float32 runs the sequential experts); the CPU runs float32 "
                    "(megatron-core's linears have no CPU autocast)")
    b, s = 2, 64
    torch.manual_seed(0)
    batches = [{k: v.to(megatron_cpu) for k, v in dict(
        tokens=torch.randint(0, 1000, (b, s)), labels=torch.randint(0, 1000, (b, s)),
        position_ids=torch.arange(s).repeat(b, 1), segment_ids=torch.zeros(b, s, dtype=torch.long)).items()}
        for _ in range(2)]
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=autocast, cross_entropy="fused", seq_length=s)

    def run(grouped):
        torch.manual_seed(3)
        model = build_model(RunPlan.for_model(PRESETS["tiny-qwen3-moe"], attention="sdpa", max_sequence_length=128,
                            grouped_experts=grouped)).to(megatron_cpu)
        losses, grads = [], []
        for step in range(2):
            with weights_shared(model):
                losses += [masked_loss(model, batch, torch.ones(b, s, device=megatron_cpu), spec) for batch in batches]
                sum(losses[-2:]).backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
            with torch.no_grad():  # a step that moves every weight
                for p in model.parameters():
                    p -= 0.05 * p.grad.sign()
                    p.grad = None
        return type(model.decoder.layers[0].mlp.experts).__name__, torch.stack(losses).detach(), torch.cat(grads)

    (grouped, loss, grads), (sequential, reference, reference_grads) = run(True), run(False)
    assert (grouped, sequential) == ("GroupedExperts", "SequentialMLP")
    tolerance = 1e-2 if autocast else 1e-6
    assert abs(loss[2] - loss[0]) > 1e-3 * loss[0]  # the second step's weights differ
    assert torch.allclose(loss, reference, rtol=tolerance / 10), (loss, reference)
    assert ((grads - reference_grads).norm() / reference_grads.norm()).item() < tolerance


def test_moe_tokens_are_dispatched_in_the_autocast_dtype(megatron_cpu):
    """The tokens a mixture of experts' dispatcher permutes are autocast's dtype under autocast (half
    the bytes of the float32 residual stream), the stream's own dtype without it."""
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    model = build_model(RunPlan.for_model(PRESETS["tiny-qwen3-moe"], attention="sdpa",
                                                                     max_sequence_length=128)).to(megatron_cpu)
    moe = model.decoder.layers[0].mlp
    seen = []
    dispatch_preprocess = moe.token_dispatcher.dispatch_preprocess

    def recorded(hidden, *args):
        seen.append(hidden.dtype)
        return dispatch_preprocess(hidden, *args)

    moe.token_dispatcher.dispatch_preprocess = recorded
    hidden = torch.randn(16, 1, PRESETS["tiny-qwen3-moe"].hidden_size, device=megatron_cpu)
    probs, routing_map = moe.route(hidden)
    moe.preprocess(hidden, probs, routing_map)
    with torch.autocast(megatron_cpu.type, dtype=torch.bfloat16):
        moe.preprocess(hidden, probs, routing_map)
    assert seen == [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the compiled split and join run on CUDA"))])
def test_split_float32_is_exact_and_rounds_as_autocast(device):
    from qwen_data_train.optimizer import join_float32, split_float32

    x = torch.cat([torch.randn(100_000) * 10.0 ** torch.randint(-30, 30, (100_000,)),
                   torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 3.4e38, -3.4e38, float("inf"), float("-inf"),
                                 1.0 + 2 ** -8, -(1.0 + 2 ** -8), 1.0 + 3 * 2 ** -8])])  # the last three: ties
    x = x.to(device).view(-1, 1)  # a matrix, as the weights split are
    high, low = split_float32(x)
    assert high.dtype == torch.bfloat16 and low.dtype == torch.int16
    assert torch.equal(high, x.to(torch.bfloat16))  # what autocast computes with
    bits, back = x.view(torch.int32), join_float32(high, low).view(torch.int32)
    # a tie rounded down to an even bf16 comes back one unit of the last place lower; all else exactly
    down = ((bits & 0xFFFF) == 0x8000) & (((bits >> 16) & 1) == 0)
    assert down[-3:].flatten().tolist() == [True, True, False]
    assert torch.equal(back[~down], bits[~down]) and torch.equal(back[down], bits[down] - 1)
    assert torch.equal(split_float32(join_float32(high, low))[0], high)


# CPU autocast hands RMSNorm a bf16 input beside its float32 weight; torch then says it takes its
# unfused path (CUDA runs it fused): a notice of this test's device, not of the code under test.
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")
def test_bf16_weights_train_as_float32_weights_under_autocast(megatron_cpu, monkeypatch):
    """AdamW over split matrices (bf16 weight + the rest) steps the same float32 masters as over
    float32 parameters cast by autocast at every use: the same losses, gradient norms, moments and
    updates, even updates too small for bf16 to see; checkpoints see the float32 masters."""
    import dataclasses

    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.optimizer import AdamW
    from qwen_data_train.shapes import PRESETS

    backward = Linear.backward

    def backward_under_autocast(ctx, *grads):  # as torch.amp.custom_bwd does for megatron-core on CUDA only
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return backward(ctx, *grads)

    monkeypatch.setattr(Linear, "backward", staticmethod(backward_under_autocast))
    shape = dataclasses.replace(PRESETS["tiny"], vocab_size=1024, tied_embeddings=False)
    lr = 1e-6  # an update far below a bf16 step of these weights: lost with the master's low bits
    optim = TrainConfig.parse(["--data", "x", "--lr", str(lr), "--clip-grad", "0.5"]).optim
    batches = [torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    positions = torch.arange(64).expand(2, -1)

    def train(bf16_weights, in_place=False):
        torch.manual_seed(0)
        model = build_model(RunPlan.for_model(shape, attention="sdpa")).train()
        first = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer = AdamW(model, optim, bf16_weights=bf16_weights, in_place=in_place)
        losses, norms = [], []
        for step in range(3):
            total = 0.0
            for tokens in batches[2 * step:2 * step + 2]:  # two micro-batches a step
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean()
                loss.backward()
                total += loss.item()
            losses.append(total)
            norms.append(optimizer.step(lr).item())
        return model, optimizer, first, losses, norms

    model, optimizer, first, losses, norms = train(False)
    split_model, split_optimizer, _, split_losses, split_norms = train(True)
    names = {p: n for n, p in split_model.named_parameters()}
    split = {names[p] for p in split_optimizer.split}
    assert "output_layer.weight" in split and "embedding.word_embeddings.weight" not in split
    assert split == {n for n, p in model.named_parameters() if p.ndim == 2} - {"embedding.word_embeddings.weight"}
    assert all(p.dtype == torch.bfloat16 and p.low.dtype == torch.int16 for p in split_optimizer.split)
    assert split_losses == pytest.approx(losses, rel=1e-6) and split_norms == pytest.approx(norms, rel=1e-6)
    assert split_optimizer.state_bytes() == optimizer.state_bytes()
    for mine, theirs in zip(split_optimizer.moments(), optimizer.moments()):
        for k in mine:
            torch.testing.assert_close(mine[k], theirs[k], rtol=1e-5, atol=1e-12)
    before = {n: p.detach().clone() for n, p in split_model.named_parameters()}
    reference = dict(model.named_parameters())
    with split_optimizer.float32_weights():  # what a checkpoint saves and an export writes
        for name, p in split_model.named_parameters():
            assert p.dtype == torch.float32, name
            assert (reference[name] - first[name]).abs().max() > lr, name  # three steps of up to ~lr each
            # the same masters, but for a tie rounded down (split_float32) now and then: 1 unit apart
            torch.testing.assert_close(p, reference[name], rtol=2 ** -23, atol=0, msg=lambda m: f"{name}: {m}")
    for name, p in split_model.named_parameters():  # split again, bit for bit
        assert torch.equal(p, before[name]), name

    # in place (CUDA graphs read weights and gradients where they were captured): the same steps, and
    # every weight and gradient in the memory it had after the first step, through steps and a checkpoint
    kept_model, kept_optimizer, _, kept_losses, kept_norms = train(True, in_place=True)
    assert kept_losses == split_losses and kept_norms == split_norms
    where = {n: (p.data_ptr(), p.grad.data_ptr() if p.grad is not None else None)
             for n, p in kept_model.named_parameters()}
    assert all(p.grad is None for p in kept_optimizer.split)  # their float32 gradients take theirs
    kept_split = {id(p) for p in kept_optimizer.split}
    assert all(p.grad is not None and not p.grad.any() for p in kept_model.parameters() if id(p) not in kept_split)
    with kept_optimizer.float32_weights():
        pass
    tokens = batches[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept_model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean().backward()
    kept_optimizer.step(lr)
    assert where == {n: (p.data_ptr(), p.grad.data_ptr() if p.grad is not None else None)
                     for n, p in kept_model.named_parameters()}
    for name, p in kept_model.named_parameters():
        assert p.dtype == dict(split_model.named_parameters())[name].dtype, name


BF16_WEIGHTS_OVER_TWO_RANKS = """
import contextlib, dataclasses, json
import torch, torch.distributed as dist
from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear
from qwen_data_train.config import TrainConfig
from qwen_data_train.distributed import data_parallel, distributed, reduce_grads
from qwen_data_train.model import build_model
from qwen_data_train.optimizer import AdamW
from qwen_data_train.patches import megatron_core
from qwen_data_train.plan import RunPlan
from qwen_data_train.shapes import PRESETS

backward = Linear.backward

def backward_under_autocast(ctx, *grads):  # as torch.amp.custom_bwd does for megatron-core on CUDA only
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return backward(ctx, *grads)

Linear.backward = staticmethod(backward_under_autocast)
shape = dataclasses.replace(PRESETS["tiny"], vocab_size=1024, tied_embeddings=False)
config = TrainConfig.parse(["--data", "x", "--lr", "1e-3", "--clip-grad", "0.5"])
positions = torch.arange(64).expand(2, -1)

def train(bf16_weights, device):
    torch.manual_seed(0)
    plan = RunPlan.for_model(shape, attention="sdpa", data_parallel="torch", dp=2)
    core = build_model(plan).train()
    optimizer = AdamW(core, config.optim, bf16_weights=bf16_weights)  # split before DDP, as the trainer does
    model = data_parallel(core, plan, device)
    norms, started = [], []
    reduction = model.split_grad_reduction
    for step in range(3):
        for micro in range(2):  # two micro-batches a step, DDP's reduction held until the last
            seed = 100 * dist.get_rank() + 2 * step + micro  # each rank its own rows
            tokens = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(seed))
            with model.no_sync() if micro == 0 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean()
                loss.backward()
            started.append(len(reduction.pending) if reduction else 0)  # reductions backward started
        reduce_grads(model, optimizer.params)
        norms.append(optimizer.step(1e-3).item())
    with optimizer.float32_weights():
        weights = torch.cat([p.detach().flatten().float() for p in core.parameters()])
    return optimizer, norms, weights, started

with megatron_core(), distributed(1) as device:
    optimizer, norms, weights, _ = train(False, device)
    split_optimizer, split_norms, split_weights, started = train(True, device)
    other = split_weights.clone()
    dist.broadcast(other, src=1)
    if dist.get_rank() == 0:
        # the same masters but for a tie rounded down (split_float32) now and then: 1 unit apart, which
        # the next steps may carry to 2 (seen: 1 weight of 205,376 after 3 steps)
        close = torch.allclose(split_weights, weights, rtol=2 ** -22, atol=0)
        print(json.dumps({"split": len(split_optimizer.split), "started": started, "norms": norms,
                          "split_norms": split_norms,
                          "close": close, "ranks_apart": (split_weights - other).abs().max().item()}))
"""


def test_bf16_weights_train_over_data_parallel_ranks_as_float32_weights(tmp_path):
    """Over two data-parallel ranks (torch's DDP, each rank its own rows, two micro-batches a step),
    split weights take the float32 run's steps: the same gradient norms and, to float32's last places, the
    same masters, equal on both ranks. DDP never sees their float32 gradients; without their own reduction
    each rank would step by its own rows alone and the ranks would drift apart. That reduction starts
    during the last micro-batch's backward, for every split weight (the output layer's too: the loss here
    is not the fused one), and not in the micro-batches before."""
    script = tmp_path / "bf16_dp.py"
    script.write_text(BF16_WEIGHTS_OVER_TWO_RANKS)
    done = subprocess.run(torchrun(2) + [str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["split"] > 0
    assert got["started"] == [0, got["split"]] * 3
    assert got["split_norms"] == pytest.approx(got["norms"], rel=1e-6)
    assert got["ranks_apart"] == 0.0 and got["close"], got


def test_split_weights_save_and_resume_as_their_float32_masters(megatron_cpu, tmp_path):
    """bf16 weights split from their masters (the default on CUDA) are saved as the float32 masters and
    resumed as the same split: every bit of the masters, the bf16 weights and AdamW's moments comes back in
    a model drawn from another seed. (Loaded into the split model as it computes, the masters would lose
    their low 16 bits.)"""
    from qwen_data_train.checkpoint import Checkpointer
    from qwen_data_train.config import CheckpointConfig, TrainConfig
    from qwen_data_train.hf.checkpoint import HFExport
    from qwen_data_train.loop import model_of
    from qwen_data_train import marks
    from qwen_data_train.model import build_model
    from qwen_data_train.optimizer import AdamW
    from qwen_data_train.plan import RunPlan

    config = TrainConfig.parse(["--data", "x"])
    shape, hf_config, generation = model_of(config)
    export = HFExport(shape, hf_config, torch.bfloat16, None, generation)

    plan = RunPlan.for_model(shape, attention="sdpa")

    def made(seed):
        torch.manual_seed(seed)
        core = build_model(plan)
        return core, AdamW(core, config.optim, bf16_weights=True)

    def state(core, optimizer):
        with optimizer.float32_weights():
            masters = [p.detach().clone() for p in optimizer.params]
        split = [(p.detach().clone(), marks.low_bits(p).clone()) for p in optimizer.split]
        return masters, split, optimizer.moments()

    core, optimizer = made(0)
    for p in optimizer.params:  # a step, so that the moments and the masters' low bits are not zeros
        if marks.float32_grad(p) is not None:
            marks.float32_grad(p).normal_()
        else:
            p.grad = torch.randn(p.shape)
    optimizer.step(1e-3)
    saved = state(core, optimizer)
    Checkpointer(CheckpointConfig(save=str(tmp_path), save_interval=0, load=None, save_hf=None), plan, core,
                 optimizer, export).save(1, 8)
    other, resumed = made(1)
    assert not torch.equal(state(other, resumed)[0][0], saved[0][0])
    assert Checkpointer(CheckpointConfig(save=None, save_interval=0, load=str(tmp_path), save_hf=None), plan, other,
                        resumed, export).load() == (1, 8)
    masters, split, moments = state(other, resumed)
    assert optimizer.split and all(torch.equal(a, b) for a, b in zip(masters, saved[0]))
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) and torch.equal(la, lb)
               for (a, la), (b, lb) in zip(split, saved[1]))
    assert all(torch.equal(m[k], n[k]) for m, n in zip(moments, saved[2]) for k in m)


def test_moe_trains_packed_sft_and_logs_the_tokens_of_each_expert(prefixes, tmp_path):
    """Qwen3-MoE (8 experts, 2 per token, 2 layers) on packed SFT rows: each log line counts every
    token of the global batch twice in each layer."""
    records, stdout = _train(["--data", str(prefixes / "sft_blend.json"), "--train-iters", "2", *TRAIN, "--model",
                              "tiny-qwen3-moe", "--seq-length", "256"], tmp_path / "moe.jsonl")
    assert "experts max/mean" in stdout
    for r in records:
        assert len(r["expert_tokens"]) == 8 and sum(r["expert_tokens"]) == 4 * 256 * 2 * 2
        assert r["expert_load_max"] == max(r["expert_tokens"]) * 8 / sum(r["expert_tokens"])
    assert records[-1]["loss"] < records[0]["loss"]


@pytest.fixture(scope="module")
def qwen3_run(prefixes, tmp_path_factory):
    data = ["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "3", *TRAIN, "--model", "tiny-qwen3"]
    return data, _train(data, tmp_path_factory.mktemp("qwen3") / "one.jsonl")[0]


@pytest.mark.parametrize("layout,nproc", [(["--tp", "2", "--sequence-parallel"], 2),
                                          (["--tp", "2", "--pp", "2", "--sequence-parallel"], 4)])
def test_qwen3_norms_stay_whole_under_tensor_parallelism(qwen3_run, tmp_path, layout, nproc):
    """Qwen3's QK norms: each TP rank normalises only its heads, so their gradients are summed over
    the group; without that, TP=2 drifts from one process (gradient norm off by ~1e-3 at step 2).
    Under sequence parallelism every other norm sees part of the sequence: its gradient is summed
    too; and with two pipeline stages besides."""
    data, one = qwen3_run
    two, stdout = _train(data + layout, tmp_path / "tp2.jsonl", nproc=nproc)
    assert "TP 2 (sequence parallel)" in stdout
    for mine, reference in zip(two, one):
        assert mine["loss"] == pytest.approx(reference["loss"], rel=1e-6)
        assert mine["grad_norm"] == pytest.approx(reference["grad_norm"], rel=5e-5)


@pytest.mark.parametrize("kind,layout,nproc", [("packed-sft", ["--tp", "2", "--sequence-parallel"], 4),
                                               ("pretrain", ["--pp", "2"], 4)])
def test_context_parallel_matches_one_process(prefixes, qwen3_run, tmp_path, kind, layout, nproc):
    """Each row split over two context-parallel ranks (chunks 0 and 3 of four on one, 1 and 2 on
    the other), keys and values gathered: the losses and gradient norms of one process, for
    packed SFT rows, whose samples must not see each other across the cut, under tensor and
    sequence parallelism besides; and for causal rows over two pipeline stages."""
    data, one = qwen3_run
    if kind == "packed-sft":
        data = data + ["--data", str(prefixes / "sft_blend.json"), "--seq-length", "256", "--eval-interval", "0"]
    if torch.cuda.is_available():  # float32 there too (flex attention's block masks): bf16 would round apart
        data = data + ["--fp32"]
    if kind == "packed-sft" or torch.cuda.is_available():
        one, _ = _train(data, tmp_path / "one.jsonl")
    two, stdout = _train(data + ["--cp", "2", *layout], tmp_path / "cp2.jsonl", nproc=nproc)
    assert_same_steps(two, one, stdout, "CP 2 × DP 1")


@pytest.fixture(scope="module")
def moe_runs(prefixes, tmp_path_factory):
    """One process's run of tiny-qwen3-moe under a load-balancing loss, on pretraining rows or packed SFT
    rows (whose pads transformers' balance loss leaves out), made when first asked for."""
    runs = {}

    def one(form, data):
        args = ["--train-iters", "4", *TRAIN, "--model", "tiny-qwen3-moe", "--moe-balance-loss", form, "--data",
                *([str(prefixes / "sft_blend.json"), "--seq-length", "256", "--eval-interval", "0"]
                  if data == "packed-sft" else [str(prefixes / "pretrain_blend.json")])]
        if (form, data) not in runs:
            runs[form, data] = _train(args, tmp_path_factory.mktemp("moe") / "one.jsonl")[0]
        return args, runs[form, data]
    return one


@pytest.mark.parametrize("form,data,layout,nproc", [
    ("transformers", "packed-sft", ["--tp", "2", "--sequence-parallel"], 2),
    ("transformers", "pretrain", ["--cp", "2", "--ep", "2"], 4),
    ("per-layer", "pretrain", ["--tp", "2", "--sequence-parallel"], 2)])
def test_moe_trains_split_as_in_one_process(moe_runs, tmp_path, form, data, layout, nproc):
    """Qwen3-MoE with its tokens split over ranks (sequence parallelism; context parallelism beside
    experts split over data-parallel ranks) takes one
    process's steps: losses, gradient norms and the tokens each expert gets, under transformers'
    load-balancing loss (its counts summed over the ranks that split a micro-batch, pads left out)
    and megatron-core's per-layer one (what pipeline stages take). Two things kept them apart: megatron-core
    before 0.19 weighed its per-layer loss by the tokens a rank holds (patches.compat.
    moe_balance_loss_over_tp_cp), and expert gradients were averaged over data-parallel ranks
    only, not over the context-parallel ones too (a 3e-3 gradient-norm difference at step 1)."""
    args, one = moe_runs(form, data)
    split, stdout = _train(args + layout, tmp_path / "split.jsonl", nproc=nproc)
    assert_same_steps(split, one, stdout, f"balance loss {form}")
    # The same weights route the same tokens: the first step's counts are equal. Later steps' weights
    # differ by float rounding between layouts, which may move a token that lies on a routing tie
    # (seen on some CPUs: one token of 1,000 at step 4 under CP 2 × EP 2), never more than a few.
    counts = [(np.asarray(a["expert_tokens"]), np.asarray(b["expert_tokens"])) for a, b in zip(split, one)]
    assert np.array_equal(*counts[0])
    for step, (a, b) in enumerate(counts):
        assert a.sum() == b.sum() and np.abs(a - b).max() <= max(2, b.sum() // 200), (step, a, b)


FAILING_RANK = """
import torch, torch.distributed as dist
from qwen_data_train.distributed import distributed
with distributed(1) as device:
    waiting = torch.zeros(4, device=device)
    if dist.get_rank() == 0:
        dist.recv(waiting, src=1)  # a transfer rank 1 never sends
    else:
        dist.irecv(waiting, src=0)  # pending on rank 1's device when it fails
        raise {error}
"""


def fail_rank_1(tmp_path, error: str, env: dict) -> subprocess.CompletedProcess:
    """Two processes in the train stage's process groups; rank 1 raises `error` mid-transfer."""
    script = tmp_path / "fail.py"
    script.write_text(FAILING_RANK.format(error=error))
    return subprocess.run(torchrun(2) + [str(script)], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, **env))


def test_a_failing_rank_ends_the_job(tmp_path):
    """NCCL only: gloo ends its peers itself. Tearing the groups down on rank 1 waited for its GPU,
    where a transfer waited for rank 0, which waited for rank 1: the job hung."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (NCCL)")
    done = fail_rank_1(tmp_path, 'RuntimeError("rank 1 runs out of memory")', {})
    assert done.returncode != 0
    assert "rank 1 failed" in done.stderr and "RuntimeError: rank 1 runs out of memory" in done.stderr


def test_a_rank_that_refuses_says_so_in_one_line(tmp_path):
    done = fail_rank_1(tmp_path, 'ValueError("--pp 3 does not divide 28 layers")', {"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode != 0
    assert "rank 1: error: --pp 3 does not divide 28 layers\n" in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("damage", ["nan weight", pytest.param("corrupt idx", marks=pytest.mark.corrupts_outputs)])
def test_the_module_entry_refuses_in_one_line_as_qwen_data_train_does(tmp_path, damage):
    """`python -m qwen_data_train` (what torchrun runs) said a refusal of its data inside a [rank0]
    traceback; it says the one line `qwen-data train` says, exit status 2. Refused before a model."""
    from _helpers import copy_prefix, pretrain

    web = pretrain([write_jsonl(tmp_path / "c.jsonl", [{"text": f"text {i} " * 9} for i in range(8)])], tmp_path / "web")
    if damage == "nan weight":
        data = tmp_path / "nan.txt"
        data.write_text(f"nan {web} 1 {web}\n")
    else:
        data = copy_prefix(web, str(tmp_path / "cut"))
        with open(data + ".idx", "r+b") as f:
            f.truncate(40)
    args = ["--data", str(data), *TRAIN, "--train-iters", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {entry: subprocess.run([sys.executable, "-m", *entry, *args], capture_output=True, text=True, timeout=120,
                                  env=env) for entry in (("qwen_data.cli", "train"), ("qwen_data_train",))}
    lines = {entry: [line for line in run.stderr.splitlines() if "error" in line.lower()] for entry, run in runs.items()}
    said = lines["qwen_data.cli", "train"]
    assert len(said) == 1 and said[0].startswith("qwen-data train: error: ") and str(data) in said[0], said
    done = runs["qwen_data_train",]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines["qwen_data_train",] == said


def test_pipeline_parallel_matches_one_process(prefixes, full_run, tmp_path):
    """Two pipelines of two stages each (tied embeddings split between the stages, the pipelines
    as data parallelism) take the same steps as one process: first loss, gradient norms, and the
    losses the updated weights give. (One pipeline alone: the next test.)"""
    data = ["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "6", "--exit-after", "3", *TRAIN]
    records, stdout = _train(data + ["--pp", "2"], tmp_path / "pp.jsonl", nproc=4)
    assert_same_steps(records, full_run[0][:3], stdout, "TP 1 × PP 2 × DP 2")


def test_checkpoint_from_two_stages_resumes_on_one(prefixes, full_run, tmp_path):
    """Two pipeline stages take one process's steps, and the checkpoint they save loads into one
    process, which goes on as the uninterrupted run."""
    data = ["--data", str(prefixes / "pretrain_blend.json"), "--train-iters", "6", *TRAIN]
    first, stdout = _train(data + ["--pp", "2", "--save", str(tmp_path / "ckpt"), "--exit-after", "3"],
                           tmp_path / "a.jsonl", nproc=2)
    assert_same_steps(first, full_run[0][:3], stdout, "TP 1 × PP 2 × DP 1")
    second, stdout = _train(data + ["--load", str(tmp_path / "ckpt")], tmp_path / "b.jsonl")
    assert [r["iteration"] for r in second] == [4, 5, 6]
    assert_same_steps(second, full_run[0][3:], stdout, "resumed from")


# ---------------------------------------------------------------------------------------------
# In-process: packed rows


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


def test_gradient_buckets_cover_every_gradient(megatron_cpu, monkeypatch):
    """Gradients reduced in flat buckets (data parallelism across pipelines, TP-partial norms):
    every gradient is reduced once, whatever the bucket size cuts."""
    from megatron.core import parallel_state
    from qwen_data_train import distributed
    monkeypatch.setattr(distributed, "BUCKET_ELEMENTS", 10)
    sizes = (3, 8, 4, 12, 1)
    grads = [torch.full((n,), float(n)) for n in sizes]
    distributed.all_reduce_grads(grads, parallel_state.get_data_parallel_group(), divide_by=2)  # one rank: a sum of one
    assert [g.tolist() for g in grads] == [[n / 2] * n for n in sizes]


def _packed_batch(prefixes, least_segments=3):
    from qwen_data_train.data import build_datasets
    train, _, _ = build_datasets(str(prefixes / "sft_blend.json"), 256, train_samples=8, valid_samples=0,
                                 test_samples=0, seed=1)
    for i in range(len(train)):
        sample = train[i]
        if int(sample["segment_ids"].max()) + 1 >= least_segments:
            return {k: torch.as_tensor(v).unsqueeze(0) for k, v in sample.items()}
    raise AssertionError("no packed row with enough samples")


def _model(name, attention):
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    torch.manual_seed(3)
    return build_model(RunPlan.for_model(PRESETS[name], attention=attention, max_sequence_length=256)).eval()


def _spec(attention, device):
    """float32, megatron-core's cross-entropy: what `step.forward` computes."""
    from qwen_data_train.step import ForwardSpec
    return ForwardSpec(attention, device, autocast=False, cross_entropy="megatron", seq_length=256)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_packed_row_equals_its_samples_alone(prefixes, megatron_cpu, name):
    from qwen_data_train.data import samples_of_row
    from qwen_data_train.step import forward
    batch = _packed_batch(prefixes)
    model = _model(name, "sdpa")
    spec = _spec("sdpa", megatron_cpu)
    with torch.no_grad():
        packed = forward(model, batch, spec)[0]
        for start, end, alone in samples_of_row(batch):
            single = forward(model, alone, spec)[0]
            torch.testing.assert_close(packed[start:end], single, rtol=1e-4, atol=1e-4)
        # The mask matters: the same row with causal attention across samples differs.
        leaky = dict(batch, segment_ids=torch.zeros_like(batch["segment_ids"]))
        assert not torch.allclose(forward(model, leaky, spec)[0], packed, atol=1e-3)


def test_sdpa_attention_equals_megatron_local_attention(prefixes, megatron_cpu):
    from qwen_data_train.step import forward
    batch = _packed_batch(prefixes)
    with torch.no_grad():
        ours = forward(_model("tiny-qwen3", "sdpa"), batch, _spec("sdpa", megatron_cpu))
        theirs = forward(_model("tiny-qwen3", "local"), batch, _spec("local", megatron_cpu))
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_presets_match_the_real_models():
    from qwen_data_train.shapes import PRESETS

    # Parameter counts of the released models, tied embeddings counted once (Qwen3's technical
    # report: 0.6B = 0.44B non-embedding + 151,936 × 1024; 1.7B = 1.4B + 151,936 × 2048).
    expected = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688,
                "qwen2.5-7b": 7_615_616_512,
                "qwen3-0.6b": 596_049_920, "qwen3-1.7b": 1_720_574_976, "qwen3-8b": 8_190_735_360}
    for name, count in expected.items():
        assert PRESETS[name].parameters() == count, name
    # Qwen3-MoE, as their model cards give them: total, activated per token, non-embedding.
    for name, total, active, body in (("qwen3-30b-a3b", 30.5e9, 3.3e9, 29.9e9),
                                      ("qwen3-235b-a22b", 235e9, 22e9, 234e9)):
        shape = PRESETS[name]
        embeddings = 2 * shape.vocab_size * shape.hidden_size
        assert round(shape.parameters() / total, 2) == 1.0, name
        assert round((shape.matmul_params() + shape.vocab_size * shape.hidden_size) / active, 1) == 1.0, name
        assert round((shape.parameters() - embeddings) / body, 2) == 1.0, name


def test_config_is_built_once_from_the_command_line():
    import dataclasses

    from qwen_data_train.config import TrainConfig
    config = TrainConfig.parse(["--data", "out/blend.json", "--train-iters", "250", "--tp", "2", "--lr", "1e-3"])
    assert config.data.path == "out/blend.json" and config.model.name is None and config.parallel.tp == 2
    assert config.optim.lr == 1e-3 and config.optim.warmup_iters == 2  # 1% of the iterations
    assert config.global_batch_size is None  # micro batch × DP, once the ranks are known
    assert config.data.eod_mask_loss  # Qwen's practice unless --no-eod-mask-loss
    assert not TrainConfig.parse(["--data", "d", "--no-eod-mask-loss"]).data.eod_mask_loss
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.optim.lr = 1.0


