"""CUDA graphs (train/graphs.py): a run whose micro-batches are captured and replayed takes the steps
an eager run takes, pretraining rows and packed SFT rows (FlexAttention's block mask refilled in
place), through a validation, a checkpoint and the optimizer writing split bf16 weights back where
the graph reads them. On a GPU only; `bench/gpu.sh graphs` runs them there."""

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
@pytest.mark.parametrize("blend, fp8", [("pretrain_blend.json", None), ("sft_blend.json", None),
                                        ("pretrain_blend.json", "tensorwise"), ("sft_blend.json", "blockwise")])
def test_graphed_steps_are_the_eager_steps(prefixes, tmp_path, blend, fp8):
    """FP8's tensorwise and blockwise recipes scale on the GPU, inside the graph (where Transformer
    Engine is installed: `bench/gpu.sh te` runs them)."""
    if fp8 and not _have_te():
        pytest.skip("FP8 needs Transformer Engine")
    runs = {}
    for graphs in ("off", "on"):
        args = ["--data", str(prefixes / blend), *TRAIN, "--cuda-graphs", graphs, "--save", str(tmp_path / graphs),
                *(["--fp8", fp8] if fp8 else [])]
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
