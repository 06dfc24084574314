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
