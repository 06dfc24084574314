"""train/kernels.py: the Triton kernels (CUDA only, skipped elsewhere) equal the torch path they
replace, forward and backward, on random inputs; the custom SwiGLU op is megatron-core's SwiGLU on
the CPU too, and the MLP keeps megatron-core's own function where the kernels do not run; the fused
QKV split + RoPE op is megatron-core's split path, and the model asks for it only where it runs."""

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


@cuda
@pytest.mark.parametrize("parts", [1, 3, 16])
def test_triton_softmax_stats_any_parts(parts, monkeypatch):
    """A row's statistics split over any number of programs (a part may hold no column) join to the same."""
    monkeypatch.setattr(kernels, "STATS_PARTS", parts)
    test_triton_softmax_passes_equal_torch(300, 5000)


def _qkv_case(s, b, groups, q_heads, d, dtype, device="cpu", bias_dtype=None):
    """A projection [s, b, groups, (q_heads + 2)·d] of `dtype`, its bias (of `bias_dtype`; None without),
    the angles and their tables (of the sum's dtype), and the gradients as SDPA's backward hands them
    over: [b, heads, s, d] permuted to [s, b, heads, d]."""
    torch.manual_seed(2)
    mixed = torch.randn(s, b, groups, (q_heads + 2) * d, device=device).to(dtype)
    bias = None if bias_dtype is None else torch.randn(groups * (q_heads + 2) * d, device=device).to(bias_dtype)
    summed = dtype if bias is None else torch.promote_types(dtype, bias_dtype)
    freqs = torch.randn(s, 1, 1, d // 2, device=device).repeat(1, 1, 1, 2) * 30
    cos, sin = (f(freqs).to(summed) for f in (torch.cos, torch.sin))
    dq = torch.randn(b, groups * q_heads, s, d, device=device).to(summed).permute(2, 0, 1, 3)
    dk = torch.randn(b, groups, s, d, device=device).to(summed).permute(2, 0, 1, 3)
    dv = torch.randn(s, b, groups, d, device=device).to(summed)
    return mixed, bias, freqs, cos, sin, (dq, dk, dv)


def _megatron_split_rope(mixed, bias, freqs, q_heads, grads):
    """The linear's bias add, megatron-core's split path (split, the query's heads, each rotated by
    megatron-core's function) and its autograd: the outputs, mixed's and the bias's gradients."""
    from megatron.core.models.common.embeddings import rope_utils
    mixed = mixed.detach().clone().requires_grad_()
    bias = None if bias is None else bias.detach().clone().requires_grad_()
    d = freqs.shape[-1]
    summed = mixed if bias is None else mixed + bias.view(mixed.shape[2], -1)
    query, key, value = torch.split(summed, [q_heads * d, d, d], dim=3)
    query = query.reshape(*query.shape[:2], -1, d)
    outs = tuple(rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False) for t in (query, key))
    torch.autograd.backward((*outs, value), grads)
    return (*(o.detach() for o in outs), value.detach()), mixed.grad, None if bias is None else bias.grad


def _ours_qkv(mixed, bias, cos, sin, q_heads, grads, dtype=None, batch_major=False):
    mixed = mixed.detach().clone().requires_grad_()
    bias = None if bias is None else bias.detach().clone().requires_grad_()
    outs = kernels.qkv_rope(mixed, bias, cos, sin, q_heads, dtype or cos.dtype, batch_major)
    torch.autograd.backward(outs, grads)
    return tuple(o.detach() for o in outs), mixed.grad, None if bias is None else bias.grad


@pytest.mark.parametrize("bias_dtype", [None, torch.float32])
def test_qkv_rope_op_is_megatron_split_path_on_cpu(bias_dtype):
    """float32: the query, key and value and the gradients of the linear's bias add and megatron-core's
    split path; an op autograd and torch.compile accept; bf16 outputs are autocast's cast of them."""
    mixed, bias, freqs, cos, sin, grads = _qkv_case(9, 2, 2, 3, 8, torch.float32, bias_dtype=bias_dtype)
    (q, k, v), grad, bias_grad = _ours_qkv(mixed, bias, cos, sin, 3, grads)
    (rq, rk, rv), ref_grad, ref_bias_grad = _megatron_split_rope(mixed, bias, freqs, 3, grads)
    assert q.shape == (9, 2, 6, 8) and k.shape == v.shape == (9, 2, 2, 8)
    for ours, ref in ((q, rq), (k, rk), (v, rv), (grad, ref_grad), (bias_grad, ref_bias_grad)):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    with_bias = None if bias is None else bias.clone().requires_grad_()
    torch.library.opcheck(kernels.qkv_rope, (mixed.clone().requires_grad_(), with_bias, cos, sin, 3, torch.float32))
    torch.library.opcheck(kernels.qkv_rope_back, (*(g.contiguous() for g in grads), cos, sin, torch.float32,
                                                  bias is not None))
    (bq, bk, bv), bgrad, _ = _ours_qkv(mixed, bias, cos, sin, 3, tuple(g.bfloat16() for g in grads), torch.bfloat16)
    assert bq.dtype == bk.dtype == bv.dtype == torch.bfloat16 and bgrad.dtype == torch.float32  # autocast's cast
    assert torch.equal(bq, rq.bfloat16()) and torch.equal(bv, rv.bfloat16())


def test_qkv_rope_op_writes_batch_major_where_asked():
    """batch_major: the same query, key and value (and gradients) as [b, s, heads, d], contiguous: the
    row-by-row stream Transformer Engine's THD attention takes as it lies; the fake (torch.compile's)
    gives the same shapes and strides."""
    mixed, bias, _, cos, sin, grads = _qkv_case(9, 2, 2, 3, 8, torch.float32, bias_dtype=torch.float32)
    plain = kernels.qkv_rope(mixed, bias, cos, sin, 3, torch.bfloat16)
    rows = kernels.qkv_rope(mixed, bias, cos, sin, 3, torch.bfloat16, True)
    for a, b in zip(plain, rows):
        assert a.is_contiguous() and b.is_contiguous() and b.shape == (2, 9, *a.shape[2:])
        assert torch.equal(a, b.transpose(0, 1))
    with_bias = bias.clone().requires_grad_()
    torch.library.opcheck(kernels.qkv_rope, (mixed.clone().requires_grad_(), with_bias, cos, sin, 3, torch.float32,
                                             True))
    rows_grads = tuple(g.transpose(0, 1).contiguous() for g in grads)
    (_, grad, bias_grad), (_, ref_grad, ref_bias_grad) = (
        _ours_qkv(mixed, bias, cos, sin, 3, g, batch_major=major) for g, major in ((rows_grads, True), (grads, False)))
    assert torch.equal(grad, ref_grad) and torch.equal(bias_grad, ref_bias_grad)


def test_fused_qkv_rope_patch_runs_megatron_split_path_off_cuda():
    """The hook megatron-core calls under fused_single_qkv_rope: off CUDA its own split path (after
    the bias's add, where FusedQKVSelfAttention hands it on), bit for bit."""
    from megatron.core.transformer import attention

    from qwen_data_train.patches import megatron_core, rope
    mixed, bias, freqs, _, _, grads = _qkv_case(9, 2, 2, 3, 8, torch.bfloat16, bias_dtype=torch.float32)
    with megatron_core():
        assert attention.HAVE_FUSED_QKV_ROPE and attention.apply_fused_qkv_rotary_pos_emb is rope.fused_qkv_rope
        ours = rope.fused_qkv_rope((mixed, bias), freqs, freqs, [24, 8, 8])
        plain = rope.fused_qkv_rope(mixed, freqs, freqs, [24, 8, 8])
        rows = rope.fused_qkv_rope((mixed, bias, True), freqs, freqs, [24, 8, 8])  # for TE's THD stream
    assert all(torch.equal(a, r.transpose(0, 1)) for a, r in zip(ours, rows))
    ref, _, _ = _megatron_split_rope(mixed, bias, freqs, 3, tuple(g.float() for g in grads))
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
    ref, _, _ = _megatron_split_rope(mixed, None, freqs, 3, tuple(g.bfloat16() for g in grads))
    assert all(torch.equal(a, b) for a, b in zip(plain, ref))


def test_the_model_fuses_qkv_rope_only_where_it_runs():
    """On CUDA without QK norms, FP8 or context parallelism; never on the CPU. Where it does, the
    layers' attention hands the QKV bias on (FusedQKVSelfAttention)."""
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.model.layers import FusedQKVSelfAttention
    from qwen_data_train.model.spec import layer_spec
    from qwen_data_train.model.transformer import fused_qkv_rope
    from qwen_data_train.plan import Environment, RunPlan
    from qwen_data_train.shapes import PRESETS

    def plan(*args, model="qwen2.5-0.5b", env=Environment(cuda=True, te_installed=True, capability=(9, 0))):
        config = TrainConfig.parse(["--data", "x", "--model", model, "--seq-length", "128", *args])
        return RunPlan.resolve(config, PRESETS[model], env)

    def attention(p):
        return layer_spec(p).submodules.self_attention.module

    assert fused_qkv_rope(plan()) and fused_qkv_rope(plan(model="tiny"))
    assert attention(plan()) is FusedQKVSelfAttention
    assert not fused_qkv_rope(plan("--fp8", "tensorwise"))
    for refused in (plan(env=Environment()), plan(model="tiny-qwen3")):
        assert not fused_qkv_rope(refused)  # the CPU; QK norms (megatron-core splits first)
        assert attention(refused) is not FusedQKVSelfAttention


@cuda
@pytest.mark.parametrize("shape", [(4096, 4, 2, 7, 64), (37, 3, 1, 1, 128), (5, 2, 4, 2, 16)])
@pytest.mark.parametrize("dtype, bias_dtype, out", [(torch.bfloat16, torch.float32, torch.bfloat16),
                                                    (torch.float32, None, torch.bfloat16),
                                                    (torch.bfloat16, None, torch.bfloat16)])
def test_triton_qkv_rope_equals_torch(shape, dtype, bias_dtype, out):
    """Under autocast (a bf16 product, its float32 bias, bf16 out), a float32 projection cast for
    attention, bf16 throughout: the float32-rounded-once results (inductor's arithmetic of the bias's
    add, megatron-core's path and autocast's cast) and their backward."""
    s, b, groups, q_heads, d = shape
    mixed, bias, freqs, cos, sin, grads = _qkv_case(*shape, dtype, "cuda", bias_dtype)
    grads = tuple(g.to(out) for g in grads)
    (q, k, v), grad, bias_grad = _ours_qkv(mixed, bias, cos, sin, q_heads, grads, out)
    ref = kernels.qkv_rope_reference(mixed.float(), None if bias is None else bias.float(), cos.float(), sin.float(),
                                     q_heads, out)
    ref_grad, ref_bias_grad = kernels.qkv_rope_back_reference(*grads, cos, sin, dtype, bias is not None)
    assert torch.equal(v, ref[2]) and grad.dtype == dtype
    for ours, want in ((q, ref[0]), (k, ref[1]), (grad, ref_grad)):
        # The kernel's multiply-adds are fused (one rounding, where torch's reference rounds the products):
        # float32 results a rounding apart; bf16 ones a bf16 rounding apart where a float32 product
        # made the difference, and where a rotation cancels (a·c1 ≈ b·s1) a few float32 roundings of
        # its terms (atol).
        if ours.dtype == torch.float32:
            torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(ours, want, rtol=8e-3, atol=1e-5)
            assert (ours == want).float().mean().item() > 0.99
    if bias is not None:
        torch.testing.assert_close(bias_grad, ref_bias_grad, rtol=1e-4, atol=1e-3)


@cuda
@pytest.mark.parametrize("shape", [(4096, 4, 2, 7, 64), (37, 3, 1, 1, 128), (5, 1, 4, 2, 16)])
def test_triton_qkv_rope_batch_major_is_the_same_numbers(shape):
    """The kernel's batch-major outputs: its [s, b] ones bit for bit, as [b, s, heads, d]; the backward
    of their THD stream's gradients (contiguous [b, s, ...]) bit for bit the [s, b] ones'."""
    s, b, groups, q_heads, d = shape
    mixed, bias, _, cos, sin, grads = _qkv_case(*shape, torch.bfloat16, "cuda", torch.float32)
    grads = tuple(g.bfloat16() for g in grads)
    rows_grads = tuple(g.transpose(0, 1).contiguous() for g in grads)
    (q, k, v), grad, bias_grad = _ours_qkv(mixed, bias, cos, sin, q_heads, grads, torch.bfloat16)
    (rq, rk, rv), rgrad, rbias_grad = _ours_qkv(mixed, bias, cos, sin, q_heads, rows_grads, torch.bfloat16, True)
    for a, r in ((q, rq), (k, rk), (v, rv)):
        assert r.is_contiguous() and torch.equal(a, r.transpose(0, 1))
    assert torch.equal(grad, rgrad)
    torch.testing.assert_close(bias_grad, rbias_grad, rtol=1e-6, atol=1e-6)  # the same sums, in other blocks


@cuda
@pytest.mark.parametrize("shape", [(4096, 4, 2, 7, 64), (37, 3, 1, 1, 128)])
def test_triton_qkv_rope_float32_is_megatron_split_path(shape):
    """float32 throughout, with a bias: the linear's add and megatron-core's split path and their
    autograd, to float32 rounding."""
    mixed, bias, freqs, cos, sin, grads = _qkv_case(*shape, torch.float32, "cuda", torch.float32)
    (q, k, v), grad, bias_grad = _ours_qkv(mixed, bias, cos, sin, shape[3], grads)
    (rq, rk, rv), ref_grad, ref_bias_grad = _megatron_split_rope(mixed, bias, freqs, shape[3], grads)
    for ours, want in ((q, rq), (k, rk), (v, rv), (grad, ref_grad)):
        torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bias_grad, ref_bias_grad, rtol=1e-4, atol=1e-3)
