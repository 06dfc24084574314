"""train/loss.py's fused output layer + cross-entropy against megatron-core's own output layer and
vocab-parallel cross-entropy: the same masked loss and the same gradient for every parameter, over
several chunks and a ragged last one, for both Qwen2 and Qwen3 bodies (tied embeddings); under
tensor parallelism the TP=2 × DP=2 run of tests/train/test_train_smoke.py checks it against one process."""

import pytest
import torch

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


def _batch(b=2, s=200, seed=1):
    g = torch.Generator().manual_seed(seed)
    batch = dict(tokens=torch.randint(0, 151_600, (b, s), generator=g),
                 labels=torch.randint(0, 151_600, (b, s), generator=g),
                 position_ids=torch.arange(s).repeat(b, 1), segment_ids=torch.zeros(b, s, dtype=torch.long))
    weights = (torch.rand(b, s, generator=g) > 0.3).float() * 0.5
    return batch, weights


def _loss_and_grads(model, run):
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_fused_equals_megatron_loss_and_gradients(megatron_cpu, monkeypatch, name):
    from qwen_data_train import loss as loss_module
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, forward, masked_loss

    monkeypatch.setattr(loss_module, "CHUNK_TOKENS", 96)  # 400 positions: 4 chunks of 96 and one of 16
    torch.manual_seed(5)
    model = build_model(RunPlan.for_model(PRESETS[name], attention="sdpa", max_sequence_length=256))
    batch, weights = _batch()
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=False, cross_entropy="fused", seq_length=200)
    theirs, theirs_grads = _loss_and_grads(
        model, lambda: (forward(model, batch, spec) * weights).sum())
    ours, our_grads = _loss_and_grads(
        model, lambda: masked_loss(model, batch, weights, spec))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert our_grads.keys() == theirs_grads.keys()
    for key, grad in theirs_grads.items():
        torch.testing.assert_close(our_grads[key], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=key)
    with torch.no_grad():  # evaluation: the loss alone
        assert masked_loss(model, batch, weights, spec).item() == \
            pytest.approx(theirs.item(), rel=1e-6)


def test_labels_at_the_vocabulary_edges(megatron_cpu):
    from qwen_data_train.loss import linear_cross_entropy

    torch.manual_seed(0)
    hidden = torch.randn(7, 3, 16, requires_grad=True)  # [s, b, h]
    weight = torch.randn(50, 16, requires_grad=True)
    labels = torch.tensor([[0, 49, 1, 48, 0, 49, 25]] * 3)
    weights = torch.rand(3, 7)
    ours = linear_cross_entropy(hidden, weight, labels, weights, torch.float32)
    ours.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    logits = hidden.transpose(0, 1) @ weight.t()
    theirs = (torch.nn.functional.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1), reduction="none")
              * weights.reshape(-1)).sum()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(grads[0], hidden.grad)
    torch.testing.assert_close(grads[1], weight.grad)


def test_a_split_weight_takes_its_float32_gradient_unrounded(megatron_cpu, monkeypatch):
    """A bf16 output weight split from its float32 master (--bf16-weights) gets, in its
    float32_grad, the gradient a float32 weight gets: summed over chunks in float32, not rounded."""
    from qwen_data_train import loss as loss_module
    from qwen_data_train.loss import linear_cross_entropy
    from qwen_data_train.optimizer import _add_to_float32_grad, split_float32

    monkeypatch.setattr(loss_module, "CHUNK_TOKENS", 96)  # 400 positions: several chunks to sum
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 200, 64, generator=g)
    labels = torch.randint(0, 512, (2, 200), generator=g)
    weights = torch.ones(2, 200)
    master = torch.nn.Parameter(torch.randn(512, 64, generator=g) * 0.02)
    linear_cross_entropy(hidden, master, labels, weights, torch.bfloat16).backward()
    split = torch.nn.Parameter(split_float32(master.detach())[0])
    split.float32_grad = torch.zeros_like(master)
    split.register_post_accumulate_grad_hook(_add_to_float32_grad)  # as AdamW does: called with no .grad here
    linear_cross_entropy(hidden, split, labels, weights, torch.bfloat16).backward()
    assert split.grad is None
    assert torch.equal(split.float32_grad, master.grad)
    assert not torch.equal(master.grad.to(torch.bfloat16).float(), master.grad)  # what rounding would lose


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the float32-out matmuls run on CUDA"))])
def test_the_first_chunk_writes_the_weight_gradient_whole(device):
    """The output weight's gradient needs no zeros first: the first chunk's product writes it
    (whatever the memory held), the others add to it, bit for bit as zeros and adds would."""
    from qwen_data_train.loss import _accumulate_mm

    g = torch.Generator().manual_seed(3)
    parts = [(torch.randn(40, 96, generator=g).to(device, torch.bfloat16),
              torch.randn(96, 24, generator=g).to(device, torch.bfloat16)) for _ in range(3)]
    out = torch.full((40, 24), float("nan"), device=device)
    ref = torch.zeros(40, 24, device=device)
    for i, (a, b) in enumerate(parts):
        _accumulate_mm(out, a, b, first=i == 0)
        _accumulate_mm(ref, a, b)
    assert torch.equal(out, ref)


def test_the_weight_gradient_scaled_by_the_loss_gradient(megatron_cpu):
    """backward's factor (the step's scale) multiplies the output weight's gradient, in place; no
    rows at all give a zero gradient."""
    from qwen_data_train.loss import linear_cross_entropy

    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(50, 2, 16, generator=g, requires_grad=True)
    weight = torch.randn(300, 16, generator=g, requires_grad=True)
    labels, weights = torch.randint(0, 300, (2, 50), generator=g), torch.rand(2, 50, generator=g)
    grads = []
    for scale in (1.0, 0.37):
        weight.grad = None
        (linear_cross_entropy(hidden, weight, labels, weights, torch.float32) * scale).backward()
        grads.append(weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0] * 0.37, rtol=1e-6, atol=0)
    weight.grad = None
    empty = torch.zeros(0, 2, 16, requires_grad=True)
    linear_cross_entropy(empty, weight, labels[:, :0], weights[:, :0], torch.float32).backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))
