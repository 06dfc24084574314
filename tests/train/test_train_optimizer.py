"""train/optimizer.py's fused step (kernels.adamw_: each parameter's AdamW in one pass, the clipping's
factor and the zeroing in it, a split bf16 weight read and written as its halves) against torch's
AdamW over the joined float32 masters: the same steps (on the CPU the kernel's torch reference),
in place where CUDA graphs need it, through a checkpoint's moments; the kernel (CUDA) and its
reference (CPU) each step by step against a float64 AdamW, no further from it than torch's fused
AdamW is, give or take a bound of a few float32 units of the last place."""

import dataclasses
import math

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


def _train(device, fused, bf16_weights, in_place, steps=3, moments=None):
    """A tiny model's steps (two micro-batches each, clipped) on `device` (megatron_cpu's: CUDA where
    there is one, as megatron-core makes its rotary tables there), → (model, optimizer, losses, norms)."""
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.model import build_model
    from qwen_data_train.optimizer import AdamW
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    shape = dataclasses.replace(PRESETS["tiny"], vocab_size=1024, tied_embeddings=False)
    optim = TrainConfig.parse(["--data", "x", "--lr", "1e-3", "--clip-grad", "0.5", "--weight-decay", "0.1"]).optim
    torch.manual_seed(0)
    model = build_model(RunPlan.for_model(shape, attention="sdpa")).to(device).train()
    optimizer = AdamW(model, optim, bf16_weights=bf16_weights, in_place=in_place, fused=fused)
    if moments is not None:
        optimizer.load_moments(*moments)
    positions = torch.arange(64, device=device).expand(2, -1)
    losses, norms = [], []
    for step in range(steps):
        for i in range(2):
            tokens = torch.randint(0, 1024, (2, 64), generator=torch.Generator().manual_seed(2 * step + i)).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean()
            loss.backward()
            losses.append(loss.item())
        norms.append(optimizer.step(1e-3 * (step + 1)).item())
    return model, optimizer, losses, norms


@pytest.mark.parametrize("bf16_weights,in_place", [(False, False), (True, False), (True, True)])
def test_fused_step_is_torch_adamw(megatron_cpu, bf16_weights, in_place):
    """One step: the same float32 masters and moments to a float32 rounding (torch's CPU AdamW
    rounds otherwise than the fused CUDA arithmetic the kernel follows; on a GPU machine both run
    there, the Triton kernel against torch's fused AdamW). Three: the same losses and
    norms (a rounding's difference, through bf16 weights and AdamW's normalised steps, grows a
    little), the moments in torch's state, the gradients zeroed or dropped as the joined step
    leaves them."""
    model, optimizer, _, _ = _train(megatron_cpu, False, bf16_weights, in_place, steps=1)
    fused_model, fused_optimizer, _, _ = _train(megatron_cpu, True, bf16_weights, in_place, steps=1)
    assert fused_optimizer.fused and not optimizer.fused and bool(fused_optimizer.split) == bf16_weights
    for mine, theirs in zip(fused_optimizer.moments(), optimizer.moments()):
        for k in mine:
            torch.testing.assert_close(mine[k], theirs[k], rtol=1e-5, atol=1e-9)
    with optimizer.float32_weights(), fused_optimizer.float32_weights():
        for (name, p), q in zip(model.named_parameters(), fused_model.parameters()):
            assert q.dtype == torch.float32
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-8, msg=lambda m: f"{name}: {m}")

    model, optimizer, losses, norms = _train(megatron_cpu, False, bf16_weights, in_place)
    fused_model, fused_optimizer, fused_losses, fused_norms = _train(megatron_cpu, True, bf16_weights, in_place)
    assert fused_losses == pytest.approx(losses, rel=1e-4) and fused_norms == pytest.approx(norms, rel=1e-3)
    assert all(fused_optimizer.torch.state[p]["step"].item() == 3 for p in fused_optimizer.params)
    for p, q in zip(model.parameters(), fused_model.parameters()):
        assert q.dtype == p.dtype and (q.grad is None) == (p.grad is None)
        assert q.grad is None or not q.grad.any()
    assert all(not p.float32_grad.any() for p in fused_optimizer.split)


def test_fused_step_in_place_and_from_moments(megatron_cpu):
    """In place: every weight, gradient and moment where it was after the first step. Moments
    loaded (a checkpoint's) step on from where they were: a run of 1 + 2 steps is a run of 3."""
    model, optimizer, _, _ = _train(megatron_cpu, True, True, True, steps=1)
    def where_all():
        return {n: (p.data_ptr(), p.grad.data_ptr() if p.grad is not None else None,
                    p.low.data_ptr() if p.ndim == 2 and "word_embeddings" not in n else None)
                for n, p in model.named_parameters()}

    where = where_all()
    moments = [(m["exp_avg"].data_ptr(), m["exp_avg_sq"].data_ptr()) for m in optimizer.moments()]
    tokens = torch.randint(0, 1024, (2, 64), device=megatron_cpu)
    with torch.autocast(megatron_cpu.type, dtype=torch.bfloat16):
        loss = model(tokens, torch.arange(64, device=megatron_cpu).expand(2, -1), None, labels=tokens).float().mean()
    loss.backward()
    optimizer.step(1e-3)
    assert where == where_all()
    assert moments == [(m["exp_avg"].data_ptr(), m["exp_avg_sq"].data_ptr()) for m in optimizer.moments()]

    whole, whole_optimizer, _, _ = _train(megatron_cpu, True, True, False, steps=3)
    _, first, _, _ = _train(megatron_cpu, True, True, False, steps=1)
    saved = [{k: v.clone() for k, v in m.items()} for m in first.moments()]
    again, again_optimizer, _, _ = _train(megatron_cpu, True, True, False, steps=2, moments=(saved, 1))
    assert all(again_optimizer.torch.state[p]["step"].item() == 3 for p in again_optimizer.params)
    # not the same weights (the second run started from the first's initial ones), but the moments
    # carried: the bias corrections of steps 2 and 3, not 1 and 2
    fresh, fresh_optimizer, _, _ = _train(megatron_cpu, True, True, False, steps=2)
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


EPS32 = 2.0 ** -23  # float32's epsilon: EPS32 * |x| is 1 to 2 units of the last place of a float32 x


def _adamw_float64(p, grad, exp_avg, exp_avg_sq, s):
    """AdamW's step (torch's formula) in float64 from the float32 inputs → (weight, moments)."""
    p, g, m, v = (t.double() for t in (p, grad, exp_avg, exp_avg_sq))
    m = s.beta1 * m + (1 - s.beta1) * g
    v = s.beta2 * v + (1 - s.beta2) * g * g
    bc1, bc2 = 1 - s.beta1 ** s.step, 1 - s.beta2 ** s.step
    return p * (1 - s.lr * s.weight_decay) - s.lr / bc1 * m / (v.sqrt() / math.sqrt(bc2) + s.eps), m, v


def _torch_adamw(p, grad, exp_avg, exp_avg_sq, s):
    """torch's fused AdamW (its kernel for p's device) one step from these float32 values at step
    `s.step` → (weight, moments)."""
    q = torch.nn.Parameter(p.clone())
    adam = torch.optim.AdamW([q], lr=s.lr, betas=(s.beta1, s.beta2), eps=s.eps, weight_decay=s.weight_decay,
                             fused=True)
    adam.state[q] = {"step": torch.tensor(float(s.step - 1), device=p.device), "exp_avg": exp_avg.clone(),
                     "exp_avg_sq": exp_avg_sq.clone()}
    q.grad = grad.clone()
    adam.step()
    return q.detach(), adam.state[q]["exp_avg"], adam.state[q]["exp_avg_sq"]


def _assert_no_further(what, mine, theirs, exact, allowance):
    """Elementwise |mine - exact| <= |theirs - exact| + allowance: as near the float64 step as torch's
    fused AdamW is, give or take `allowance`."""
    over = (mine.double() - exact).abs() - (theirs.double() - exact).abs() - allowance
    if over.max() > 0:
        i = int(over.argmax())
        pytest.fail(f"{what}: {int((over > 0).sum())} of {over.numel()} further from float64's step than "
                    f"torch's + the allowance; worst: mine {mine.flatten()[i].item()!r}, torch's "
                    f"{theirs.flatten()[i].item()!r}, float64's {exact.flatten()[i].item()!r}, allowance "
                    f"{allowance.flatten()[i].item():.3g}")


def _steps_against_float64(adamw, n, split, device):
    """Five steps of `adamw` (kernels.adamw_'s signature), each against a float64 AdamW step and torch's
    fused AdamW from the same float32 inputs (the weight as the split holds it, the moments, the
    gradient × clipping's factor as _foreach_mul_ makes it), at its step count (bias corrections).
    Gradients log-uniform over 1e-10..1 (× N(0, 1)): where they are near eps = 1e-8, eps's place in
    the denominator decides the step.

    The bound, elementwise, `_assert_no_further`'s allowance:
    - moments: EPS32 · |float64's|. The kernel rounds each moment once from float64 products (1/2 unit
      of the last place); torch's fused multiply-adds in float32 are in |torch - float64|.
    - weight: EPS32 · (|w| + 2 |w'| + 10 |w' - w|), w before the step and w' float64's after: twice the
      worst case of the kernel's float32 roundings (the decayed weight's 1/2 unit of |w|; the result's of
      |w'|; the update's ~10 roundings, each 2^-24 of |update| <= |w' - w| + lr·wd·|w|), and the
      split's tie kept 1 unit lower (optimizer.split_float32). For w ~ 0.05 and an update ~3e-4 that
      is ~2e-8: a wrong bias correction, eps placement or decay moves a weight by 1e-6 or more."""
    from qwen_data_train.optimizer import join_float32, split_float32

    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(n, generator=gen) * 0.05).to(device)
    weight, low = split_float32(w) if split else (w, None)
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for step in range(1, 6):
        magnitude = 10.0 ** -(torch.rand(n, generator=gen) * 10)
        g = (torch.randn(n, generator=gen) * magnitude).to(device)
        coef = torch.tensor(0.7, device=device)
        s = kernels.AdamWStep(3e-4, 0.9, 0.95, 1e-8, 0.1, step)
        before = join_float32(weight, low) if split else weight.clone()
        clipped = g.clone()
        torch._foreach_mul_([clipped], coef)
        want, want_m, want_v = _adamw_float64(before, clipped, m, v, s)
        theirs, their_m, their_v = _torch_adamw(before, clipped, m, v, s)
        if split:  # what torch's AdamW's master becomes: split, as the bf16 weight and its low bits keep it
            theirs = join_float32(*split_float32(theirs))
        grad = g.clone()
        adamw(weight, low, grad, m, v, coef, s, True)
        assert not grad.any()
        mine = join_float32(weight, low) if split else weight
        at = f"step {step}"
        _assert_no_further(f"{at}, exp_avg", m, their_m, want_m, EPS32 * want_m.abs())
        _assert_no_further(f"{at}, exp_avg_sq", v, their_v, want_v, EPS32 * want_v.abs())
        _assert_no_further(f"{at}, weight", mine, theirs, want,
                           EPS32 * (before.double().abs() + 2 * want.abs() + 10 * (want - before.double()).abs()))


@pytest.mark.parametrize("split", [False, True])
def test_reference_is_float64_adamw_within_torch(split):
    """kernels.adamw_reference_ (the CPU's path, the kernel's arithmetic in torch) within torch's
    CPU fused AdamW's distance of a float64 step, five steps."""
    _steps_against_float64(kernels.adamw_reference_, 2048 * 3 + 5, split, "cpu")


@cuda
@pytest.mark.parametrize("n", [1, 2047, 2048 * 3 + 5, 896 * 4864])
@pytest.mark.parametrize("split", [False, True])
def test_triton_adamw_is_float64_adamw_within_torch_fused(n, split):
    """The Triton kernel within torch's fused CUDA AdamW's distance of a float64 step, five steps.
    (Not bitwise torch's: torch 2.11 computes the moments in float32 with fused multiply-adds, the
    kernel from float64 products; one H200: 91% of the weights bitwise, the rest within 3.5e-10.)"""
    assert kernels.enabled(torch.zeros(1, device="cuda"))
    _steps_against_float64(kernels.adamw_, n, split, "cuda")
