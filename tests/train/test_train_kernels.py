"""train/kernels.py: the Triton kernels (CUDA only, skipped elsewhere) equal the torch path they
replace, forward and backward, on random inputs; the custom SwiGLU op is megatron-core's SwiGLU on
the CPU too, and the MLP keeps megatron-core's own function where the kernels do not run."""

import pytest
import torch

from qwen_data_train import kernels, loss

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels run on CUDA only")


def _megatron_swiglu(y, g):
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
    y = y.detach().clone().requires_grad_()
    out = bias_swiglu_impl(y, None)
    out.backward(g)
    return out.detach(), y.grad


def _ours(y, g):
    y = y.detach().clone().requires_grad_()
    out = kernels.swiglu(y)
    out.backward(g)
    return out.detach(), y.grad


def test_swiglu_op_is_megatron_swiglu_on_cpu():
    """float32: the same function and gradient (to float32 rounding); an op autograd and torch.compile accept."""
    y = torch.randn(6, 3, 40, dtype=torch.float32)
    g = torch.randn(6, 3, 20, dtype=torch.float32)
    out, grad = _ours(y, g)
    ref_out, ref_grad = _megatron_swiglu(y.view(18, 40), g.view(18, 20))
    torch.testing.assert_close(out.view(18, 20), ref_out)
    torch.testing.assert_close(grad.view(18, 40), ref_grad, rtol=1e-5, atol=1e-6)
    torch.library.opcheck(kernels.swiglu, (torch.randn(4, 6, requires_grad=True),))
    torch.library.opcheck(kernels.swiglu_back, (torch.randn(4, 3), torch.randn(4, 6)))


def test_mlp_keeps_megatron_swiglu_where_kernels_do_not_run():
    from megatron.core.transformer import mlp

    from qwen_data_train.patches import swiglu
    original = mlp.bias_swiglu_impl
    with swiglu.swiglu_kernels():
        y = torch.randn(5, 2, 16)
        assert torch.equal(mlp.bias_swiglu_impl(y, None), original(y, None))
    assert mlp.bias_swiglu_impl is original


@cuda
@pytest.mark.parametrize("shape", [(4096, 2, 2 * 4864), (37, 3, 2 * 1000), (5, 2 * 7)])
def test_triton_swiglu_equals_torch(shape, monkeypatch):
    """bf16: forward and backward against the float32-rounded-once reference (inductor's
    arithmetic); float32: megatron-core's own function, to float32 rounding."""
    torch.manual_seed(0)
    y = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    g = torch.randn(*shape[:-1], shape[-1] // 2, device="cuda", dtype=torch.bfloat16)
    out, grad = _ours(y, g)
    a, b = (half.float() for half in torch.chunk(y, 2, -1))
    ref_out, ref_grad = (a * torch.sigmoid(a) * b).to(y.dtype), kernels.swiglu_back_reference(g, y)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=8e-3)
    torch.testing.assert_close(grad, ref_grad, atol=0, rtol=8e-3)
    assert (out == ref_out).float().mean().item() > 0.99
    assert (grad == ref_grad).float().mean().item() > 0.99
    y, g = y.float(), g.float()
    out, grad = _ours(y, g)
    flat = (-1, shape[-1])
    ref_out, ref_grad = _megatron_swiglu(y.view(flat), g.view(-1, shape[-1] // 2))
    torch.testing.assert_close(out.view(ref_out.shape), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.view(ref_grad.shape), ref_grad, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(kernels, "TRITON", False)  # the switch: the torch reference again
    assert torch.equal(_ours(y, g)[1], kernels.swiglu_back_reference(g, y))


@cuda
@pytest.mark.parametrize("rows,vocab", [(4096, 151_936), (300, 5000), (7, 4096)])
def test_triton_softmax_passes_equal_torch(rows, vocab):
    """The statistics (maximum exact, sum and target to float32 rounding) and the gradient (bf16,
    to one rounding) against loss.py's torch functions, labels here and on another rank's slice."""
    torch.manual_seed(1)
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16)
    at = torch.randint(0, vocab, (rows,), device="cuda")
    here = torch.rand(rows, device="cuda") > 0.2
    c = (torch.rand(rows, device="cuda") > 0.1).float() * 0.7
    peak, sums, target = kernels.softmax_stats(logits, at, here)
    ref_peak, ref_sums, ref_target = loss._softmax_stats(logits, at, here)
    assert torch.equal(peak, ref_peak)
    torch.testing.assert_close(sums, ref_sums, rtol=1e-5, atol=0)
    torch.testing.assert_close(target, ref_target, rtol=1e-6, atol=1e-6)
    ref_grad = loss._logit_grad(logits, ref_peak, ref_sums, at, here, c)
    grad = kernels.logit_grad_(logits.clone(), peak, sums, at, here, c)
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=8e-3, atol=1e-9)
    assert (grad != ref_grad).float().mean().item() < 0.01
