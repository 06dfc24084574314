"""train/patches: megatron_core() leaves megatron-core and torch exactly as it found them, and each
backport applies below the megatron-core version that fixes it and is deleted once pyproject.toml's
floor reaches that version."""

import pathlib
import re

import pytest
import torch

from qwen_data_train.patches import autocast, compat, cpu, megatron_core, replacing, rope, swiglu, wgrad

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
MISSING = object()


def floor() -> tuple[int, int]:
    """(major, minor) of the `megatron-core>=X` floor in pyproject.toml (the same in every extra)."""
    floors = set(re.findall(r'"megatron-core>=([0-9.]+)', PYPROJECT.read_text()))
    assert len(floors) == 1, f"{PYPROJECT}: expected one megatron-core floor, found {sorted(floors)}"
    return tuple(int(part) for part in floors.pop().split(".")[:2])


@pytest.mark.parametrize("backport", list(compat.FIXED_IN), ids=lambda backport: backport.__name__)
def test_no_backport_outlives_the_floor(backport):
    fixed_in = compat.FIXED_IN[backport]
    assert floor() < fixed_in, (f"{PYPROJECT}: the megatron-core floor {floor()} has the fix of "
                                f"{backport.__name__} ({fixed_in}): delete the backport from train/patches/compat.py")


@pytest.fixture
def replaced(monkeypatch):
    """Every (owner, name, what it was, own or inherited) that the patch modules replace, as they replace it."""
    seen = []

    def recording(owner, name, value):
        seen.append((owner, name, vars(owner).get(name, MISSING), value))
        return replacing.replaced(owner, name, value)

    for module in (cpu, compat, autocast, rope, swiglu, wgrad):
        monkeypatch.setattr(module, "_replaced", recording)
    return seen


def test_megatron_core_restores_everything_on_exit(replaced):
    """Also when the block raises, and nested (the dataset builder enters it again inside train())."""
    def state():
        return [vars(owner).get(name, MISSING) for owner, name, _, _ in replaced]

    with megatron_core():
        assert replaced, "megatron_core() replaced nothing"
        assert all(getattr(owner, name) is value for owner, name, _, value in replaced)
        outer, count = state(), len(replaced)
        with megatron_core():
            pass
        del replaced[count:]
        assert state() == outer
    assert all(was is now for (_, _, was, _), now in zip(replaced, state()))

    with pytest.raises(RuntimeError, match="inside"):
        with megatron_core():
            raise RuntimeError("inside")
    assert all(was is now for (_, _, was, _), now in zip(replaced, state()))
    if not torch.cuda.is_available():
        names = {name for _, name, _, _ in replaced}
        assert {"current_device", "cuda", "checkpoint", "router_gating_linear",
                "linear_with_grad_accumulation_and_async_allreduce"} <= names
        assert "cuda" not in vars(torch.Tensor)  # inherited from torch's C class: removed again, not copied


@pytest.mark.parametrize("version", ["0.16.1", "0.19.2"])
def test_backports_apply_below_the_version_that_fixes_them(monkeypatch, replaced, version):
    import megatron.core
    from megatron.core.transformer.moe.router import TopKRouter

    monkeypatch.setattr(megatron.core, "__version__", version)
    with compat.backports():
        pass
    owners = {(owner, name) for owner, name, _, _ in replaced}
    installed = tuple(int(part) for part in version.split(".")[:2])
    assert ((torch.distributed, "get_rank") in owners) == (installed < compat.FIXED_IN[compat.single_process_rank])
    assert ((TopKRouter, "attach_and_log_load_balancing_loss") in owners) == (
        installed < compat.FIXED_IN[compat.moe_balance_loss_over_tp_cp])


def test_rope_tables_rotate_as_megatron_core():
    """The rotation from rope.py's tables is megatron-core's, bit for bit (bf16 and float32)."""
    from megatron.core.models.common.embeddings import rope_utils

    torch.manual_seed(0)
    freqs = torch.randn(16, 1, 1, 8) * 100
    for dtype in (torch.bfloat16, torch.float32):
        t = torch.randn(16, 2, 3, 8, dtype=dtype)
        cos, sin = rope.rope_tables(freqs, 1.0, dtype)
        ours = t * cos + rope_utils._rotate_half(t, False) * sin
        assert torch.equal(ours, rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False))
        with megatron_core():  # off CUDA the patch hands over to megatron-core's own
            assert torch.equal(rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=False), ours)


def _linear(megatron_cpu_config, main_grad: bool):
    """A megatron-core ColumnParallelLinear [24 → 40] with a bf16 weight (as a split one is), its
    float32 gradient marked `main_grad` or not."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    from qwen_data_train import marks

    torch.manual_seed(0)
    layer = ColumnParallelLinear(24, 40, config=megatron_cpu_config, init_method=torch.nn.init.normal_,
                                 bias=False, gather_output=False)
    layer.weight.data = layer.weight.data.to(torch.bfloat16)
    if main_grad:
        marks.mark_main_grad(layer.weight, torch.zeros(40, 24))
    return layer


@pytest.fixture
def megatron_cpu_config():
    from megatron.core.transformer import TransformerConfig

    from qwen_data_train.distributed import distributed
    with megatron_core(), distributed(1):
        yield TransformerConfig(num_layers=1, hidden_size=24, num_attention_heads=2, transformer_impl="local")


@pytest.mark.parametrize("compiled", [False, True])
def test_a_marked_weight_gradient_is_accumulated_by_the_matmul(megatron_cpu_config, compiled, monkeypatch):
    """With `main_grad` the linear's backward adds gradᵀ·input to it in float32 (two micro-batches:
    twice), returns no weight gradient (autograd accumulates none; the weight's hooks see none)
    and the same input gradient; compiled, in one graph. Unmarked: megatron-core's own function."""
    from megatron.core.tensor_parallel.layers import LinearWithGradAccumulationAndAsyncCommunication as Linear

    from qwen_data_train import marks

    backward = Linear.backward

    def under_autocast(ctx, *grads):  # as torch.amp.custom_bwd does for megatron-core on CUDA only
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return backward(ctx, *grads)

    monkeypatch.setattr(Linear, "backward", staticmethod(under_autocast))

    layer, plain = _linear(megatron_cpu_config, True), _linear(megatron_cpu_config, False)
    hooked = []
    layer.weight.register_post_accumulate_grad_hook(lambda p: hooked.append(p))
    run = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    inputs = [torch.randn(5, 3, 24, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    grads = [torch.randn(5, 3, 40, generator=torch.Generator().manual_seed(9 + i)) for i in range(2)]
    expected = torch.zeros(40, 24)
    for x, g in zip(inputs, grads):
        x, x_plain = x.clone().requires_grad_(), x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = run(x)
            out_plain, _ = plain(x_plain)
        out.backward(g.to(out.dtype))
        out_plain.backward(g.to(out_plain.dtype))
        assert torch.equal(out, out_plain) and torch.equal(x.grad, x_plain.grad)
        expected.addmm_(g.to(torch.bfloat16).reshape(15, 40).t().float(), x.to(torch.bfloat16).reshape(15, 24).float())
    # the weight's hooks run with no gradient (optimizer's add to the float32 one then adds nothing)
    assert layer.weight.grad is None and all(p.grad is None for p in hooked)
    assert torch.equal(marks.main_grad(layer.weight), expected)
    assert plain.weight.grad.dtype == torch.bfloat16  # megatron-core's: the product rounded to bf16
    torch.testing.assert_close(plain.weight.grad.float(), expected, rtol=2e-2, atol=5e-2)  # bf16 sums


def test_the_single_rank_model_marks_its_split_weights_on_cuda_only():
    """data_parallel's "none": a split weight's float32 gradient becomes its `main_grad` on CUDA (where
    no wrapper reduces it on its hook); the CPU keeps autograd's accumulation and the hook."""
    from types import SimpleNamespace

    from qwen_data_train import marks
    from qwen_data_train.distributed import data_parallel

    model = torch.nn.Linear(4, 3, bias=False)
    marks.mark_float32_grad(model.weight, torch.zeros(3, 4))
    assert data_parallel(model, SimpleNamespace(data_parallel="none"), torch.device("cpu")) is model
    assert marks.main_grad(model.weight) is None
    if torch.cuda.is_available():
        model.cuda()
        marks.mark_float32_grad(model.weight, torch.zeros(3, 4, device="cuda"))
        data_parallel(model, SimpleNamespace(data_parallel="none"), torch.device("cuda"))
        assert marks.main_grad(model.weight) is marks.float32_grad(model.weight)
