"""MFU as peers count it, and the reports that read it back:

  - a packed row's attention counts each document on its own (Σ sᵢ², pads left out) under
    Megatron's causal count, the whole row under the full count; the products with weights are
    the same in both;
  - the SM clock and power of a run are nvidia-smi's samples over its steps, idle ones left out,
    with the share the power limit held the clock down;
  - a step whose GPU idles waiting on the host's launches is called launch-bound, and with --fp8
    warned of (FP8 shortens the GPU's work only).

The trainer's own records (a CPU run) are checked in test_train_smoke.py; bench/records.py, which reads
them back, in bench/tests/test_records.py.
"""

import os
import time

import numpy as np
import pytest
import torch

from qwen_data_train.data import boundaries
from qwen_data_train.metrics import ClockWatch, busy_lines, clock_report, document_squares, kernel_seconds
from qwen_data_train.shapes import PRESETS

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

PAD = 151643 + 100  # any id the documents do not hold


def packed_row(lengths, seq_length):
    """A one-row micro-batch of documents of `lengths`, padded to seq_length as SFTDataset pads: the
    padding a segment of its own."""
    fill = seq_length - sum(lengths)
    segments = np.repeat(np.arange(len(lengths) + 1), list(lengths) + [fill])
    batch = {k: v.unsqueeze(0) for k, v in boundaries(segments, seq_length).items()}
    tokens = np.concatenate([np.arange(1, sum(lengths) + 1), np.full(fill, PAD)])
    batch["tokens"] = batch["segment_ids"].new_tensor(tokens).long().unsqueeze(0)
    return batch


def test_a_packed_row_counts_the_attention_of_each_document_alone():
    shape, (a, b), s = PRESETS["qwen2.5-0.5b"], (300, 500), 1024
    squares = document_squares(packed_row((a, b), s), PAD)
    assert squares == a * a + b * b  # the padding (224 positions) is no document
    heads_dims = shape.num_layers * shape.num_attention_heads * shape.kv_channels
    # QK^T and scores × V: 2 flops a multiply-add, 2 products, ×3 forward + backward; causal: half
    assert shape.attention_flops(squares, causal=True) == 3 * 2 * 2 * heads_dims * (a * a + b * b) / 2
    assert shape.attention_flops(squares, causal=True) < shape.attention_flops((a + b) ** 2, causal=True)
    assert shape.attention_flops(s * s, causal=False) == 3 * 2 * 2 * heads_dims * s * s
    # A row of one document: s²; Megatron's count of such a row is 6·layers·heads·head_dim·s a token
    whole = document_squares(packed_row((s,), s), PAD)
    assert whole == s * s
    assert shape.attention_flops(whole, causal=True) / s == 6 * heads_dims * s


@pytest.mark.parametrize("lengths", [(1,), (7, 1, 120), (128,), (40, 40, 40, 8)])
def test_full_counts_at_least_twice_causal(lengths):
    """Σ sᵢ² ≤ s²: the full count is at least the causal one, twice it for a row of one document."""
    shape, s = PRESETS["tiny"], 128
    causal = shape.attention_flops(document_squares(packed_row(lengths, s), PAD), causal=True)
    full = shape.attention_flops(s * s, causal=False)
    assert causal <= full / 2 and (causal == full / 2) == (lengths == (s,))


def test_rows_of_a_micro_batch_are_counted_apart():
    first, second = packed_row((10, 20), 64), packed_row((64,), 64)
    batch = {k: torch.cat([first[k], second[k]]) for k in ("segment_ids", "tokens")}
    assert document_squares(batch, PAD) == 10 * 10 + 20 * 20 + 64 * 64


def test_the_clock_is_the_mean_of_the_busy_samples_and_the_power_cap_their_share():
    """nvidia-smi's lines (clocks.sm, power.draw, clocks_event_reasons.active) as --loop-ms prints them."""
    lines = ["1980, 512.40, 0x0000000000000000\n",
             "1755, 699.80, 0x0000000000000004\n",  # held by the power limit
             "1605, 700.10, 0x0000000000000004\n",
             "1410, [N/A], 0x0000000000000024\n",  # power limit and software thermal slowdown
             "345, 80.00, 0x0000000000000001\n",  # idle: not the steps'
             "garbled\n", "1980, 500.0\n"]
    report = clock_report(lines)
    assert report == pytest.approx({"sm_clock_mhz": (1980 + 1755 + 1605 + 1410) / 4,
                                    "power_draw_w": (512.4 + 699.8 + 700.1) / 3,
                                    "power_capped_share": 0.75, "slowdown_share": 0.25})
    assert clock_report(["345, 80.00, 0x0000000000000001\n"]) == {}  # only idle


@pytest.mark.parametrize("share, fp8, bound, warned", [
    (0.71, "tensorwise", "launch-bound", True), (0.71, None, "launch-bound", False),
    (0.97, "delayed", "GPU-bound", False), (1.02, None, "GPU-bound", False)])  # overlapping streams: past 1
def test_a_launch_bound_step_is_named_and_warned_of_under_fp8(share, fp8, bound, warned):
    lines = busy_lines(share, fp8)
    assert f"busy {share:.0%}" in lines[0] and bound in lines[0]
    assert len(lines) == 1 + warned
    if warned:
        assert lines[1].startswith(f"warning: --fp8 {fp8}") and f"{1 - share:.0%} of each step" in lines[1]


FAKE_SMI = """#!/bin/sh
# nvidia-smi of an older driver: no clocks_event_reasons, only clocks_throttle_reasons; --loop-ms prints on
case "$*" in *clocks_event_reasons*) echo "Field clocks_event_reasons.active is not a valid field" >&2; exit 2;; esac
case "$*" in *--loop-ms*) while :; do echo "1755, 699.80, 0x0000000000000004"; sleep 0.05; done;; esac
echo "1980, 80.00, 0x0000000000000001"
"""


def test_the_clock_watch_samples_until_stopped_and_takes_an_older_drivers_field(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    watch = ClockWatch("GPU-0", period_ms=50)
    time.sleep(0.5)
    started = time.perf_counter()
    report = watch.stop()
    assert time.perf_counter() - started < 5 and watch.process.poll() is not None
    assert len(watch.samples) >= 3
    assert report == pytest.approx({"sm_clock_mhz": 1755, "power_draw_w": 699.8, "power_capped_share": 1.0,
                                    "slowdown_share": 0.0})
    monkeypatch.setenv("PATH", str(tmp_path / "none"))  # no nvidia-smi at all
    assert ClockWatch("GPU-0").stop() == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times CUDA kernels")
def test_kernel_seconds_tell_a_busy_gpu_from_one_waiting_on_the_host():
    x = torch.randn(4096, 4096, device="cuda")

    def products(pause: float) -> None:
        for _ in range(50):
            x @ x
            time.sleep(pause)

    _, kernels, seconds, top = kernel_seconds(lambda: products(0))  # launches queue up faster than they run
    assert 0.85 < kernels / seconds <= 1.05
    assert top[0][2] == 50 and top[0][1] / 1e3 > 0.5 * kernels  # the products' kernel: its 50 calls, most of the time
    _, kernels, seconds, _ = kernel_seconds(lambda: products(0.01))  # each product waits on the host
    assert kernels / seconds < 0.5
