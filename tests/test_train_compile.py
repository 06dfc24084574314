"""`--compile layers` traces each transformer layer as one graph: a graph break splits a layer into
pieces that are compiled and launched apart (megatron-core's RowParallelLinear once broke every
layer twice, at a warning it issues on rank 0). Traced here with torch.compile's eager backend,
which runs dynamo's tracing, and its graph breaks, without a compiler."""

import pytest
import torch


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_on_cpu
    with megatron_on_cpu(), distributed(1) as device:
        yield device


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_compiled_layers_trace_whole(megatron_cpu, name):
    from qwen_data_train.model import build_model
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss
    from torch._dynamo.utils import counters

    torch.manual_seed(3)
    model = build_model(PRESETS[name], attention="sdpa", max_sequence_length=128)
    b, s = 2, 64
    batch = dict(tokens=torch.randint(0, 1000, (b, s)), labels=torch.randint(0, 1000, (b, s)),
                 position_ids=torch.arange(s).repeat(b, 1), segment_ids=torch.zeros(b, s, dtype=torch.long))
    weights = torch.ones(b, s)
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=False, cross_entropy="fused", seq_length=s)
    eager = masked_loss(model, batch, weights, spec)
    torch._dynamo.reset()
    counters.clear()
    for layer in model.decoder.layers:
        layer.compile(backend="eager")
    try:
        compiled = masked_loss(model, batch, weights, spec)
        compiled.backward()
        assert dict(counters["graph_break"]) == {}
        assert counters["stats"]["unique_graphs"] == 1  # every layer runs the same graph
        assert compiled.item() == pytest.approx(eager.item(), rel=1e-6)
    finally:
        torch._dynamo.reset()


def test_sequence_parallel_never_runs_compiled_layers():
    """A compiled layer lost most of its gradient through megatron-core's sequence-parallel
    linears on GPUs: auto compiles only the SwiGLU there, and asking for layers is refused."""
    from qwen_data_train.loop import resolve_compile

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert resolve_compile("auto", cuda, False) == "layers"
    assert resolve_compile("auto", cuda, True) == "swiglu"
    assert resolve_compile("auto", cpu, True) == "none"
    with pytest.raises(ValueError, match="sequence-parallel"):
        resolve_compile("layers", cuda, True)
