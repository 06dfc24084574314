"""train/patches: megatron_core() leaves megatron-core and torch exactly as it found them, and each
backport applies below the megatron-core version that fixes it and is deleted once pyproject.toml's
floor reaches that version."""

import pathlib
import re

import pytest
import torch

from qwen_data_train.patches import autocast, compat, cpu, megatron_core, replacing, rope, swiglu

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

    for module in (cpu, compat, autocast, rope, swiglu):
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
        assert {"current_device", "cuda", "checkpoint", "router_gating_linear"} <= names
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
