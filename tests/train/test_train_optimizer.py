"""train/optimizer.py's fused step (kernels.adamw_: each parameter's AdamW in one pass, the clipping's
factor and the zeroing in it, a split bf16 weight read and written as its halves) against torch's
AdamW over the joined float32 masters: the same steps on the CPU (the kernel's torch reference),
in place where CUDA graphs need it, through a checkpoint's moments; on CUDA the Triton kernel is
torch's fused AdamW's arithmetic."""

import dataclasses

import pytest
import torch

from qwen_data_train import kernels

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels run on CUDA only")


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


@pytest.fixture(autouse=True)
def megatron_backward_under_autocast(monkeypatch):
    """megatron-core's linear backward under autocast, as torch.amp.custom_bwd runs it on CUDA only."""
    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear

    backward = Linear.backward

    def under_autocast(ctx, *grads):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return backward(ctx, *grads)

    monkeypatch.setattr(Linear, "backward", staticmethod(under_autocast))


def _train(fused, bf16_weights, in_place, steps=3, moments=None):
    """A tiny model's steps (two micro-batches each, clipped), → (model, optimizer, losses, norms)."""
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.model import build_model
    from qwen_data_train.optimizer import AdamW
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    shape = dataclasses.replace(PRESETS["tiny"], vocab_size=1024, tied_embeddings=False)
    optim = TrainConfig.parse(["--data", "x", "--lr", "1e-3", "--clip-grad", "0.5", "--weight-decay", "0.1"]).optim
    torch.manual_seed(0)
    model = build_model(RunPlan.for_model(shape, attention="sdpa")).train()
    optimizer = AdamW(model, optim, bf16_weights=bf16_weights, in_place=in_place, fused=fused)
    if moments is not None:
        optimizer.load_moments(*moments)
    positions = torch.arange(64).expand(2, -1)
    losses, norms = [], []
    for step in range(steps):
        for i in range(2):
            tokens = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(2 * step + i))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean()
            loss.backward()
            losses.append(loss.item())
        norms.append(optimizer.step(1e-3 * (step + 1)).item())
    return model, optimizer, losses, norms


@pytest.mark.parametrize("bf16_weights,in_place", [(False, False), (True, False), (True, True)])
def test_fused_step_is_torch_adamw(megatron_cpu, bf16_weights, in_place):
    """One step: the same float32 masters and moments to a float32 rounding (torch's CPU AdamW
    rounds otherwise than the fused CUDA arithmetic the kernel follows). Three: the same losses and
    norms (a rounding's difference, through bf16 weights and AdamW's normalised steps, grows a
    little), the moments in torch's state, the gradients zeroed or dropped as the joined step
    leaves them."""
    model, optimizer, _, _ = _train(False, bf16_weights, in_place, steps=1)
    fused_model, fused_optimizer, _, _ = _train(True, bf16_weights, in_place, steps=1)
    assert fused_optimizer.fused and not optimizer.fused and bool(fused_optimizer.split) == bf16_weights
    for mine, theirs in zip(fused_optimizer.moments(), optimizer.moments()):
        for k in mine:
            torch.testing.assert_close(mine[k], theirs[k], rtol=1e-5, atol=1e-9)
    with optimizer.float32_weights(), fused_optimizer.float32_weights():
        for (name, p), q in zip(model.named_parameters(), fused_model.parameters()):
            assert q.dtype == torch.float32
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-8, msg=lambda m: f"{name}: {m}")

    model, optimizer, losses, norms = _train(False, bf16_weights, in_place)
    fused_model, fused_optimizer, fused_losses, fused_norms = _train(True, bf16_weights, in_place)
    assert fused_losses == pytest.approx(losses, rel=1e-4) and fused_norms == pytest.approx(norms, rel=1e-3)
    assert all(fused_optimizer.torch.state[p]["step"].item() == 3 for p in fused_optimizer.params)
    for p, q in zip(model.parameters(), fused_model.parameters()):
        assert q.dtype == p.dtype and (q.grad is None) == (p.grad is None)
        assert q.grad is None or not q.grad.any()
    assert all(not p.float32_grad.any() for p in fused_optimizer.split)


def test_fused_step_in_place_and_from_moments(megatron_cpu):
    """In place: every weight, gradient and moment where it was after the first step. Moments
    loaded (a checkpoint's) step on from where they were: a run of 1 + 2 steps is a run of 3."""
    model, optimizer, _, _ = _train(True, True, True, steps=1)
    def where_all():
        return {n: (p.data_ptr(), p.grad.data_ptr() if p.grad is not None else None,
                    p.low.data_ptr() if p.ndim == 2 and "word_embeddings" not in n else None)
                for n, p in model.named_parameters()}

    where = where_all()
    moments = [(m["exp_avg"].data_ptr(), m["exp_avg_sq"].data_ptr()) for m in optimizer.moments()]
    tokens = torch.randint(0, 1024, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(tokens, torch.arange(64).expand(2, -1), None, labels=tokens).float().mean()
    loss.backward()
    optimizer.step(1e-3)
    assert where == where_all()
    assert moments == [(m["exp_avg"].data_ptr(), m["exp_avg_sq"].data_ptr()) for m in optimizer.moments()]

    whole, whole_optimizer, _, _ = _train(True, True, False, steps=3)
    _, first, _, _ = _train(True, True, False, steps=1)
    saved = [{k: v.clone() for k, v in m.items()} for m in first.moments()]
    again, again_optimizer, _, _ = _train(True, True, False, steps=2, moments=(saved, 1))
    assert all(again_optimizer.torch.state[p]["step"].item() == 3 for p in again_optimizer.params)
    # not the same weights (the second run started from the first's initial ones), but the moments
    # carried: the bias corrections of steps 2 and 3, not 1 and 2
    fresh, fresh_optimizer, _, _ = _train(True, True, False, steps=2)
    differs = [not torch.equal(a["exp_avg"], b["exp_avg"])
               for a, b in zip(again_optimizer.moments(), fresh_optimizer.moments())]
    assert all(differs)


def test_reference_is_torch_adamw_on_the_cpu():
    """kernels.adamw_reference_ (torch's fused CUDA arithmetic written out) against torch's AdamW on
    the CPU over five steps, weight decay and clipping's factor included, float32 and split."""
    from qwen_data_train.optimizer import join_float32, split_float32

    torch.manual_seed(0)
    w = torch.randn(300, 7) * 0.05
    grads = [torch.randn(300, 7) * 10.0 ** -i for i in range(5)]
    coef = torch.tensor(0.3)
    ref = torch.nn.Parameter(w.clone())
    adam = torch.optim.AdamW([ref], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    flat, high_low = w.clone(), split_float32(w.clone())
    m, v, m2, v2 = (torch.zeros_like(w) for _ in range(4))
    for step, g in enumerate(grads, 1):
        ref.grad = g * coef
        adam.step()
        scalars = kernels.AdamWStep(1e-3, 0.9, 0.95, 1e-8, 0.1, step)
        kernels.adamw_reference_(flat, None, g.clone(), m, v, coef, scalars, zero_grad=False)
        grad = g.clone()
        kernels.adamw_reference_(*high_low, grad, m2, v2, coef, scalars, zero_grad=True)
        assert not grad.any()
    torch.testing.assert_close(flat, ref.detach(), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(join_float32(*high_low), flat, rtol=2 ** -23, atol=0)
    torch.testing.assert_close(m, adam.state[ref]["exp_avg"], rtol=1e-6, atol=1e-9)
    assert torch.equal(m, m2)


@cuda
@pytest.mark.parametrize("n", [1, 2047, 2048 * 3 + 5, 896 * 4864])
@pytest.mark.parametrize("split", [False, True])
def test_triton_adamw_is_torch_fused_adamw(n, split):
    """The kernel against torch's fused AdamW (CUDA) over five steps: the same float32 masters
    (nearly all bitwise) and moments; a split weight's halves the split of what the kernel computed."""
    from qwen_data_train.optimizer import join_float32, split_float32

    torch.manual_seed(0)
    w = torch.randn(n, device="cuda") * 0.05
    ref = torch.nn.Parameter(w.clone())
    adam = torch.optim.AdamW([ref], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    weight, low = split_float32(w.clone()) if split else (w.clone(), None)
    master = join_float32(weight, low) if split else weight
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for step in range(1, 6):
        g, coef = torch.randn(n, device="cuda") * 10.0 ** -step, torch.tensor(0.7, device="cuda")
        ref.grad = g.clone()
        torch._foreach_mul_([ref.grad], coef)
        adam.step()
        if split:  # the torch AdamW above steps what the split master is: join, step, split again
            ref.data.copy_(join_float32(*split_float32(ref.detach())))
        grad = g.clone()
        kernels.adamw_(weight, low, grad, m, v, coef, kernels.AdamWStep(3e-4, 0.9, 0.95, 1e-8, 0.1, step), True)
        assert not grad.any()
    master, want = join_float32(weight, low) if split else weight, ref.detach()
    # One H200, torch 2.11: 99.9% of the weights bitwise, the rest up to 3.5e-10 apart (weights ~0.05):
    # torch computes the moments in float32 with fused multiply-adds, the kernel their products in
    # float64, which differ where a moment nearly cancels
    assert (master == want).float().mean() > 0.99
    torch.testing.assert_close(master, want, rtol=0, atol=1e-9)
    for mine, theirs in ((m, adam.state[ref]["exp_avg"]), (v, adam.state[ref]["exp_avg_sq"])):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6 * theirs.abs().max().item())
