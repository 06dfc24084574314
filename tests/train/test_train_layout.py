"""Packed rows through Transformer Engine's THD attention lie batch-major ([b, s, ...] memory): the fused
QKV kernel writes them so where the attention takes them (attention.takes_batch_major), and the output
projection multiplies them as they lie (model.layers.GroupedRowParallelLinear): the same numbers as
the [s, b] path, no copy into [s, b] order. Run on the CPU; the kernel's own case is in
test_train_kernels.py."""

import pytest
import torch

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


def test_only_the_thd_stream_is_taken_batch_major():
    from qwen_data_train.attention import DocumentMask, _thd_params, takes_batch_major
    segments = torch.zeros(2, 8, dtype=torch.long)
    thd = DocumentMask(segments, thd=_thd_params(torch.tensor([0, 8, 16], dtype=torch.int32), 8))
    assert takes_batch_major(thd)
    assert not takes_batch_major(None) and not takes_batch_major(DocumentMask(segments))


def _projection(device):
    from megatron.core.transformer import TransformerConfig

    from qwen_data_train.model.layers import GroupedRowParallelLinear
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)
    torch.manual_seed(0)
    return GroupedRowParallelLinear(24, 16, config=config, init_method=torch.nn.init.normal_, bias=False,
                                    input_is_parallel=True, skip_bias_add=True).to(device)


def test_output_projection_multiplies_batch_major_rows_as_they_lie(megatron_cpu):
    """[s, b, h] rows in [b, s, h] memory: the same output (as a view of that order) and gradients as
    the same rows in [s, b] memory, and the input's gradient in the input's order."""
    from qwen_data_train.model.layers import batch_major
    linear = _projection(megatron_cpu)
    s, b = 7, 3
    stream = torch.randn(b * s, 24, device=megatron_cpu)  # TE's [t, h·d] output, t running row by row
    grad = torch.randn(s, b, 16, device=megatron_cpu)
    results = []
    for rows in (stream.view(b, s, 24).transpose(0, 1), stream.view(b, s, 24).transpose(0, 1).contiguous()):
        x = rows.detach().requires_grad_()
        out, _ = linear(x)
        out.backward(grad)
        results.append((out.detach(), x.grad, linear.weight.grad.clone(), out))
        linear.weight.grad = None
    (out, x_grad, w_grad, view), (ref_out, ref_x_grad, ref_w_grad, ref_view) = results
    assert batch_major(view) and not batch_major(ref_view)
    assert torch.equal(out, ref_out) and torch.equal(x_grad, ref_x_grad)
    torch.testing.assert_close(w_grad, ref_w_grad, rtol=1e-5, atol=1e-5)  # the tokens summed in another order
    assert not batch_major(torch.randn(5, 1, 4).transpose(0, 1).transpose(0, 1))
    assert not batch_major(torch.randn(1, 5, 4).transpose(0, 1))  # one row: both orders


def test_thd_stream_takes_batch_major_rows_as_they_lie():
    """TE's THD stream from [s, b] rows (copied) and from [b, s] ones (a view of the kernel's output):
    the same tokens, row after row."""
    from qwen_data_train.attention import thd_stream
    s, b = 7, 3
    rows = [torch.randn(b, s, heads, 4) for heads in (6, 2, 2)]
    q, k, v, b1, s1 = thd_stream(*(t.transpose(0, 1).contiguous() for t in rows), torch.float32, False)
    bq, bk, bv, b2, s2 = thd_stream(*rows, torch.float32, True)
    assert (b1, s1) == (b2, s2) == (b, s)
    for ours, ref, t in zip((bq, bk, bv), (q, k, v), rows):
        assert torch.equal(ours, ref) and ours.shape == (b * s, *t.shape[2:]) and ours.data_ptr() == t.data_ptr()


class _Kept:  # a context manager dynamo cannot resume inside (megatron-core's `core_attn_manager`)
    def __init__(self, x):
        self.x = x

    def __enter__(self):
        return self.x

    def __exit__(self, *exc):
        return False


@torch.compiler.disable
def _attend(q, k, v):  # Transformer Engine's THD attention in the layer: out of the compiled graph
    rep = q.shape[1] // k.shape[1]
    return (q * k.repeat_interleave(rep, 1) + v.repeat_interleave(rep, 1)).flatten(1)


class _Core(torch.nn.Module):
    def forward(self, q, k, v):
        from qwen_data_train.attention import thd_stream
        q, k, v, b, s = thd_stream(q, k, v, torch.float32, True)
        return _attend(q, k, v).view(b, s, -1).transpose(0, 1)


class _Layer(torch.nn.Module):  # megatron-core 0.19's SelfAttention, as far as the break
    def __init__(self):
        super().__init__()
        self.core = _Core()

    def forward(self, mixed, bias, cos, sin):
        from qwen_data_train import kernels
        query, key, value = kernels.qkv_rope(mixed, bias, cos, sin, 3, torch.float32, True)
        with _Kept(query) as query:
            return self.core(query, key, value)


def _copies_at_the_break(prof) -> int:
    """The copies AOTAutograd makes of a compiled piece's incoming gradients (`coerce_tangent`)."""
    return sum(1 for e in prof.events() if e.name == "aten::contiguous" and e.cpu_parent is not None
               and e.cpu_parent.name == "CompiledFunctionBackward")


@pytest.mark.parametrize("dynamic", [True, None])
def test_batch_major_rows_cross_the_compiled_layers_break_without_copies(dynamic):
    """The query, key and value cross the break at TE's call (a compiled layer's pieces) contiguous
    [b, s, ...], as TE's gradients come back: no copy of them into another layout there (under dynamic
    shapes, AOTAutograd's tangents are contiguous: [s, b] views of [b, s] memory were copied), and the
    compiled gradients are the eager ones."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    s, b, groups, q_heads, d = 16, 3, 2, 3, 8
    mixed = torch.randn(s, b, groups, (q_heads + 2) * d, requires_grad=True)
    bias = torch.randn(groups * (q_heads + 2) * d, requires_grad=True)
    angles = torch.randn(s, 1, 1, d)
    layer, grads = _Layer(), []
    for run in (layer, torch.compile(layer, dynamic=dynamic)):
        for _ in range(2):
            mixed.grad = bias.grad = None
            run(mixed, bias, angles.cos(), angles.sin()).square().sum().backward()
        grads.append((mixed.grad.clone(), bias.grad.clone()))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(mixed, bias, angles.cos(), angles.sin()).square().sum().backward()
    assert _copies_at_the_break(prof) == 0
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref)


def test_the_fused_qkv_attention_tells_its_core_attention_rows_come_batch_major(megatron_cpu):
    """FusedQKVSelfAttention hands a THD mask's query, key and value on [b, s, ...]: a core attention
    that asks (TECoreAttention's `thd_batch_major`) is told so; others are left as they are."""
    from megatron.core.transformer.spec_utils import build_module

    from qwen_data_train.attention import SDPACoreAttention
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.model.layers import FusedQKVSelfAttention
    from qwen_data_train.model.spec import layer_spec
    from qwen_data_train.model.transformer import transformer_config
    from qwen_data_train.plan import Environment, RunPlan
    from qwen_data_train.shapes import PRESETS

    class TELike(SDPACoreAttention):
        thd_batch_major = False

    config = TrainConfig.parse(["--data", "x", "--model", "tiny", "--seq-length", "32"])
    plan = RunPlan.resolve(config, PRESETS["tiny"], Environment(cuda=True, te_installed=True, capability=(9, 0)))
    spec = layer_spec(plan).submodules.self_attention
    assert spec.module is FusedQKVSelfAttention
    built = []
    for core in (TELike, SDPACoreAttention):
        spec.submodules.core_attention = core
        built.append(build_module(spec, config=transformer_config(plan), layer_number=1).core_attention)
    assert built[0].thd_batch_major and not TELike.thd_batch_major and not hasattr(built[1], "thd_batch_major")
