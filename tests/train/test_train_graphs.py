"""CUDA graphs (train/graphs.py): a run whose micro-batches are captured and replayed takes the steps
an eager run takes, pretraining rows and packed SFT rows (FlexAttention's block mask refilled in
place, or under --attention te the THD form's cu_seqlens), through a validation, a checkpoint and the
optimizer writing split bf16 weights back where the graph reads them. On a GPU only; `bench/gpu.sh
graphs` runs them there (the te cases where Transformer Engine is installed)."""

import pytest
import torch
from _train import run_train, train_prefixes

pytestmark = pytest.mark.slow
on_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are captured on a GPU")

TRAIN = ["--model", "tiny", "--seq-length", "256", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--log-interval", "1", "--num-workers", "0", "--train-iters", "12", "--eval-interval", "5",
         "--eval-iters", "1", "--split", "80,20,0", "--save-interval", "7", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup-iters", "1"]


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    return train_prefixes(tmp_path_factory.mktemp("train_data"))


def _have_te() -> bool:
    from train.attention import have_transformer_engine

    return have_transformer_engine()


@on_a_gpu
@pytest.mark.parametrize("blend, fp8, attention", [
    ("pretrain_blend.json", None, "sdpa"), ("sft_blend.json", None, "sdpa"),
    ("pretrain_blend.json", "tensorwise", "sdpa"), ("sft_blend.json", "blockwise", "sdpa"),
    ("sft_blend.json", None, "te"), ("pretrain_blend.json", None, "te")])
def test_graphed_steps_are_the_eager_steps(prefixes, tmp_path, blend, fp8, attention):
    """FP8's tensorwise and blockwise recipes scale on the GPU, inside the graph; Transformer Engine's
    attention is captured with packed rows' THD form of a fixed count (where Transformer Engine is
    installed: `bench/gpu.sh te` runs them)."""
    if (fp8 or attention == "te") and not _have_te():
        pytest.skip("FP8 and --attention te need Transformer Engine")
    runs = {}
    for graphs in ("off", "on"):
        args = ["--data", str(prefixes / blend), *TRAIN, "--cuda-graphs", graphs, "--save", str(tmp_path / graphs),
                "--attention", attention, *(["--fp8", fp8] if fp8 else [])]
        runs[graphs] = run_train(args, tmp_path / f"{graphs}.jsonl")
    (eager, _), (graphed, stdout) = runs["off"], runs["on"]
    assert "micro-batches replayed as CUDA graphs (as asked)" in stdout
    steps = [r for r in graphed if "loss" in r]
    assert [r["iteration"] for r in steps] == list(range(1, 13))
    for mine, theirs in zip(steps, (r for r in eager if "loss" in r)):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-3), mine["iteration"]
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-2), mine["iteration"]
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.5  # it learns: the graphs read the weights AdamW writes
    valid = [(r["iteration"], r["valid_loss"]) for r in graphed if "valid_loss" in r]  # eager forward passes
    assert valid == [(r["iteration"], pytest.approx(r["valid_loss"], rel=1e-3)) for r in eager if "valid_loss" in r]
    assert [i for i, _ in valid] == [5, 10]


@on_a_gpu
def test_auto_runs_packed_rows_through_te_in_the_graphs(prefixes, tmp_path):
    """Where Transformer Engine is installed on Hopper, `auto` under CUDA graphs takes its THD attention
    for packed rows (plan.AUTO_TE_PACKED) and says so first: the steps those of eager --attention te."""
    if not _have_te() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("auto takes te on Hopper with Transformer Engine")
    runs = {}
    for attention, graphs in (("te", "off"), ("auto", "auto")):
        args = ["--data", str(prefixes / "sft_blend.json"), *TRAIN, "--attention", attention, "--cuda-graphs", graphs]
        runs[graphs] = run_train(args, tmp_path / f"{graphs}.jsonl")
    (eager, _), (graphed, stdout) = runs["off"], runs["auto"]
    assert "attention te (auto: Transformer Engine's THD attention for packed rows inside the CUDA graphs" in stdout
    assert "micro-batches replayed as CUDA graphs (auto:" in stdout
    for mine, theirs in zip((r for r in graphed if "loss" in r), (r for r in eager if "loss" in r)):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-3), mine["iteration"]

@pytest.fixture(scope="module")
def megatron_gpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


def _packed(samples_per_row: list[int], s: int, seed: int) -> dict:
    """A micro-batch of packed rows, row i cut into samples_per_row[i] samples of random lengths."""
    from qwen_data_train.data import boundaries
    g = torch.Generator().manual_seed(seed)
    rows = []
    for count in samples_per_row:
        segment_ids = torch.zeros(s, dtype=torch.int32)
        segment_ids[torch.randperm(s - 1, generator=g)[: count - 1] + 1] = 1
        rows.append(boundaries(segment_ids.cumsum(0).numpy().astype("int32"), s))
    batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    b = len(samples_per_row)
    tokens = torch.randint(0, 1000, (b, s + 1), generator=g)
    return dict(batch, tokens=tokens[:, :-1], labels=tokens[:, 1:], loss_mask=torch.ones(b, s))


@on_a_gpu
def test_te_packed_rows_replay_the_eager_micro_batches_in_graphs_of_their_sample_count(megatron_gpu):
    """Each replay reads its micro-batch's cu_seqlens, refilled in place: loss and gradients those of
    the micro-batch run eagerly (the exact form). One of more samples than the first graph's count
    (64 for two rows) gets a graph of its own (256), and the graph of 64 replays right after it."""
    from qwen_data_train.graphs import MicroBatchGraphs
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss

    if not _have_te():
        pytest.skip("needs Transformer Engine")
    device, s = megatron_gpu, 256
    counts = [[3, 5], [2, 9], [40, 41], [1, 4], [7, 2], [60, 30], [4, 4]]
    batches = [_packed(c, s, seed) for seed, c in enumerate(counts)]
    spec = ForwardSpec("te", device, autocast=True, cross_entropy="fused", seq_length=s)
    torch.manual_seed(5)
    model = build_model(RunPlan.for_model(PRESETS["tiny"], attention="te", max_sequence_length=s, autocast=True,
                                          cuda=True)).to(device)
    scale = torch.full((), 0.5, device=device)

    def grads():
        return torch.cat([p.grad.flatten().float() for p in model.parameters()])

    eager = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        weights = batch["loss_mask"].to(device)
        loss = masked_loss(model, batch, weights, spec)
        (loss * scale).backward()
        eager.append((loss.item(), grads().clone()))
    graphs = MicroBatchGraphs(model, model, spec)
    for batch, (loss, grad) in zip(batches, eager):
        for p in model.parameters():
            p.grad.zero_()  # in place, where the graphs add theirs (AdamW(in_place=True) does the same)
        got = graphs.run(batch, batch["loss_mask"].to(device), scale)
        assert got[0].item() == pytest.approx(loss, rel=1e-3)
        assert (grads() - grad).norm() <= 2e-2 * grad.norm()
    assert set(graphs.graphs) == {(True, 64), (True, 256)}
    control = (eager[0][1] - eager[1][1]).norm() / eager[1][1].norm()
    assert control > 0.1  # the micro-batches' gradients differ well beyond the tolerance
