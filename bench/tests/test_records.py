"""bench/records.py: a run's record (what it was, its machine, steady-state rates, its command), logs older than
its fields, --append (a record a line), lines that are not the trainer's, a stage's table. A real CPU run's log is
read in tests/train/test_train_smoke.py."""

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..")

# A two-GPU run's log as the trainer writes it: intervals at 1, 10, 20, a validation, the summary.
SAMPLE = [
    {"iteration": 1, "loss": 12.1, "step_ms": 15000.0, "tokens_per_s": 2000.0, "mfu_causal": 0.01, "mfu_full": 0.02},
    {"iteration": 10, "loss": 11.2, "step_ms": 300.0, "tokens_per_s": 100000.0, "mfu_causal": 0.30, "mfu_full": 0.35},
    {"iteration": 20, "loss": 9.87654, "lr": 3e-5, "grad_norm": 1.4, "step_ms": 290.0, "tokens_per_s": 110000.0,
     "real_tokens_per_s": 99000.0, "mfu_causal": 0.41234, "mfu_full": 0.45678},
    {"iteration": 20, "valid_loss": 9.9},
    {"summary": True, "iterations": 20, "model": "qwen2.5-3b", "gpus": 2, "fp8": "tensorwise", "packed": True,
     "ep": 1, "bf16_weights": False, "tokens_per_s": 105000.0, "mfu_causal": 0.4, "mfu_full": 0.45,
     "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-0d1c2b3a", "power_limit_w": 700.0,
     "sm_clock_mhz": 1712.5, "max_sm_clock_mhz": 1980.0, "power_draw_w": 688.0, "power_capped_share": 0.75,
     "slowdown_share": 0.0, "gpu_busy_share": 0.71, "mem_clock_mhz": 2619.0, "temperature_c": 61.0,
     "cpu_model": "Intel(R) Xeon(R) Platinum 8480+"},
]
# A log from before the summary line and the two MFU counts (the H100 runs of 2026-11-26): a single "mfu".
OLD_LINES = [{"iteration": i, "loss": 12.0 - i / 10, "step_ms": 12183.0 if i == 1 else 299.9,
              "tokens_per_s": 2689.6 if i == 1 else 109245.3, "mfu": 0.386, "max_memory_gib": 26.0}
             for i in (1, 10, 20, 30, 40)]
OLD_COMMAND = "timeout 400 python3 -m train --model qwen2.5-0.5b --attention sdpa --log-json te-pretrain-sdpa.jsonl"
COMMAND = "torchrun --nproc-per-node 2 -m train --model qwen2.5-3b --fp8 tensorwise --log-json te-run.jsonl"


@pytest.fixture
def records(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import records
    yield records
    sys.modules.pop("records", None)


@pytest.fixture
def old(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    return write_run(folder, "te-pretrain-sdpa", OLD_LINES, command=OLD_COMMAND)


def write_run(folder, name, lines, command=COMMAND):
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    if command:
        (folder / f"{name}.log").write_text(f"$ {command}\nattention sdpa\nexit status 0 after 90 s\n")
    return str(path)


def test_a_record_holds_the_run_its_rates_and_its_machine(records, tmp_path):
    path = write_run(tmp_path, "te-run", SAMPLE)
    summary = SAMPLE[-1]
    assert records.record("te-run", path) == {
        "name": "te-run", **{k: summary[k] for k in records.RUN},
        "tokens_per_s": 110000.0,  # after iteration 10: the interval of 11-20 alone
        "tokens_per_s_per_gpu": 55000.0, "steps": 20, "loss_at_end": 9.8765, "mfu_causal": 0.4123, "mfu_full": 0.4568,
        **{k: summary[k] for k in records.MACHINE}, "command": COMMAND,
    }
    assert list(records.record("te-run", path)) == ["name", *records.RUN, "tokens_per_s", "tokens_per_s_per_gpu",
                                                     "steps", "loss_at_end", "mfu_causal", "mfu_full",
                                                     *records.MACHINE, "command"]


def test_a_log_older_than_the_fields_gives_null_for_them(records, old):
    found = records.record("old", old)
    missing = (*records.RUN, "tokens_per_s_per_gpu", "mfu_causal", "mfu_full", *records.MACHINE)
    assert {k: found[k] for k in missing} == dict.fromkeys(missing)
    assert found["steps"] == 40 and found["loss_at_end"] > 0 and found["tokens_per_s"] > 1e5
    assert found["command"].startswith("timeout ") and "--attention sdpa" in found["command"]


def test_append_replaces_a_run_recorded_again(records, tmp_path, old):
    out = tmp_path / "records.json"
    first = write_run(tmp_path, "a", SAMPLE)
    assert records.main([first, f"old={old}", "--out", str(out)]) == 0
    again = tmp_path / "again"
    again.mkdir()
    rerun = [*SAMPLE[:2], {**SAMPLE[2], "loss": 8.5}, *SAMPLE[3:]]
    assert records.main([str(again), f"a={write_run(again, 'b', rerun, command=None)}", "--out", str(out),
                         "--append"]) == 0
    kept = json.loads(out.read_text())
    assert [r["name"] for r in kept] == ["a", "old", "b"]
    lines = [f" {json.dumps(r)}" for r in kept]
    assert out.read_text() == "[\n" + ",\n".join(lines) + "\n]\n"  # a record a line
    assert kept[0]["loss_at_end"] == 8.5 and kept[0]["command"] is None
    assert records.main([first, "--out", str(out)]) == 0  # without --append: these runs only
    assert [r["name"] for r in json.loads(out.read_text())] == ["a"]


def test_a_line_that_is_not_the_trainers_is_named(records, tmp_path, capsys, old):
    path = write_run(tmp_path, "bad", [*SAMPLE[:2], {"step": 3}])
    assert records.main([path, "--out", str(tmp_path / "r.json")]) == 1
    assert f"{path}:3: not a line of the trainer's --log-json" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    assert records.main([path, f"bad={old}", "--out", str(tmp_path / "r.json")]) == 1
    assert "two runs named bad" in capsys.readouterr().err
    path = write_run(tmp_path, "short", [SAMPLE[0], {"iteration": 2, "loss": 11.0}])
    assert records.main([path, "--out", str(tmp_path / "r.json")]) == 1
    assert f"{path}:2: a log interval without step_ms, tokens_per_s" in capsys.readouterr().err


def test_a_table_reads_old_and_new_logs_and_compares_losses(records, tmp_path, old, capsys):
    bf16 = write_run(tmp_path, "fp8-bf16", SAMPLE)
    faster = [*SAMPLE[:2], {**SAMPLE[2], "tokens_per_s": 132000.0, "loss": 9.87654 * 1.01}, *SAMPLE[3:]]
    fp8 = write_run(tmp_path, "fp8-tensorwise", faster)
    assert records.main(["--table", "--against", bf16, bf16, fp8, old]) == 0
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines()]
    cell = {row[0]: dict(zip(rows[0], row)) for row in rows}
    fp8, bf16, old = cell["fp8-tensorwise"], cell["fp8-bf16"], cell["te-pretrain-sdpa"]
    assert fp8["tokens/s"] == "132,000" and fp8["vs base"] == "1.20x"
    assert fp8["max rel. loss diff"] == "1.000%" and bf16["max rel. loss diff"] == "0.000%"
    assert bf16["a GPU"] == "55,000" and bf16["MFU causal"] == "41.2%"
    # the old log: its rates, its peak memory; no MFU count, GPUs or machine of its own
    assert old["tokens/s"] == "109,245" and old["peak GiB"] == "26.0"
    assert old["MFU causal"] == old["GPUs"] == old["busy"] == "-"
    # each run against its baseline in its own round
    assert records.baseline_name("fp8-3b-mb2sel-delayed-r2") == "fp8-3b-mb2sel-bf16-r2"
    assert records.baseline_name("fp8-3b-mb2sel-tensorwise") == "fp8-3b-mb2sel-bf16"
    assert records.baseline_name("pretrain-te-r1") == "pretrain-sdpa-r1"
