"""What the run reports: one record per log interval (printed, and a JSON line with --log-json,
scalars for TensorBoard and Weights & Biases with --tensorboard-dir / --wandb-project) and the
steady-state summary at the end.

Token counts are the job's (one replica's tokens × data parallel); MFU divides by every GPU's
peak. The first interval (iteration 1) is reported on its own and left out of the summary: its
loss is the starting point, its time holds compilation and warm-up.

MFU is given as the two counts peers publish, which differ only in the attention products
(`ModelShape.attention_flops`); the products with weights count every position fed:
  mfu_causal  Megatron-LM's and Megatron-Bridge's: half of each score matrix (causal), over each
              document of a row on its own (Σ sᵢ² of its lengths, pad positions left out)
  mfu_full    torchtitan's and llm-foundry's: the whole score matrix of every row (rows × s²)
The summary is also the log's last JSON line ("summary": true), with what the run was (`Metrics`'
`run`: model, gpus, fp8, packed, ep), the machine it ran on and, with --profile on a GPU, the share of
a step the GPU's kernels ran (`gpu_busy_share`: `Metrics.measure`) and the SM clock and power over
the run (`ClockWatch`): a run measures nothing it was not asked to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist

from .config import LogConfig
from .distributed import gradient_group, is_rank0, log0
from .plan import RunPlan

T = TypeVar("T")

# Dense bf16 peak of the chips we run on (datasheet), for MFU.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}


def peak_flops(device: torch.device, override_tflops: Optional[float]) -> Optional[float]:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def document_squares(batch: dict, pad: int) -> int:
    """Σ over the rows of a micro-batch of each document's length squared, as attention sees the
    documents (segment_ids, from which the packed-attention masks are built), pad positions left
    out. A row of one document (pretraining) gives s²."""
    segments, real = batch["segment_ids"].long(), batch["tokens"] != pad
    rows, s = segments.shape
    # segment ids are at most s: (s + 1) apart, each row's ids are keys of their own
    keys = segments + (s + 1) * torch.arange(rows).unsqueeze(1)
    lengths = torch.bincount(keys[real], minlength=rows * (s + 1))
    return int(lengths.square().sum())


# nvidia-smi's fields (--query-gpu) behind the numbers `machine` reports
GPU_QUERY = {"power_limit_w": "power.limit", "sm_clock_mhz": "clocks.sm", "max_sm_clock_mhz": "clocks.max.sm",
             "mem_clock_mhz": "clocks.mem", "temperature_c": "temperature.gpu"}


def machine(device: torch.device) -> dict:
    """What a run's speed depends on besides the code: the GPU (its name, UUID, power limit, SM and
    memory clocks against the SM's top, temperature: read now) and the host's CPU model. None where
    unknown (on the CPU, without nvidia-smi). The summary's SM clock is `ClockWatch`'s, the steps'."""
    fields = {"gpu_name": None, "gpu_uuid": None, **dict.fromkeys(GPU_QUERY), **dict.fromkeys(SAMPLED)}
    if device.type == "cuda":
        fields["gpu_name"] = torch.cuda.get_device_name(device)
        uuid = f"GPU-{torch.cuda.get_device_properties(device).uuid}"  # nvidia-smi's numbering may differ
        fields["gpu_uuid"] = uuid
        try:
            query = ",".join(["name", "uuid", *GPU_QUERY.values()])
            answer = subprocess.run(["nvidia-smi", f"--id={uuid}", f"--query-gpu={query}",
                                     "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20,
                                    check=True).stdout
            name, uuid, *numbers = (v.strip() for v in answer.strip().split(","))
            if len(numbers) != len(GPU_QUERY):
                raise ValueError(answer)
            fields.update(gpu_name=name, gpu_uuid=uuid, **{k: _number(v) for k, v in zip(GPU_QUERY, numbers)})
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    cpu = None
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return {**fields, "cpu_model": cpu or platform.processor() or platform.machine() or None}


PROFILED_ITERATION = 5  # past compilation and the recompiles of the first steps
LAUNCH_BOUND = 0.85  # a GPU busy less of the step than this waits on the host's launches


TOP_KERNELS = 12  # the kernels --profile lists, busiest first


def kernel_seconds(run: Callable[[], T]) -> tuple[T, float, float, list[tuple[str, float, int]]]:
    """`run()` under torch's profiler recording the CUDA kernels alone (recording the CPU's ops too
    would slow the host this judges): its result, the seconds its kernels ran, summed (those of
    streams that overlap count twice), the seconds it took, from an idle GPU until the GPU is
    done, and the TOP_KERNELS busiest kernels (name, milliseconds, calls): where the step's GPU time goes."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        result = run()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:TOP_KERNELS]
    return (result, sum(e.self_device_time_total for e in kernels) / 1e6, seconds,
            [(e.key, e.self_device_time_total / 1e3, e.count) for e in top])


def busy_lines(share: float, fp8: Optional[str]) -> list[str]:
    """What the log says of a step whose GPU kernels ran `share` of its time; with --fp8 on a
    launch-bound step, a warning: FP8 shortens the GPU's work only."""
    bound = "GPU-bound" if share >= LAUNCH_BOUND else "launch-bound: the host's CPU sets the pace"
    lines = [f"GPU kernels busy {share:.0%} of step {PROFILED_ITERATION}'s time ({bound})"]
    if fp8 and share < LAUNCH_BOUND:
        lines.append(f"warning: --fp8 {fp8}: the GPU waits on kernel launches for {1 - share:.0%} of each step. "
                     "FP8 shortens the GPU's products, not the host's work (Transformer Engine's linear layers "
                     "cost the CPU more than bf16's), so on this host it gains less than the GPU allows. Fewer "
                     "launches a token help: a larger micro batch, --compile swiglu (docs/performance.md, "
                     "\"FP8 and the host\").")
    return lines


# NVML's clock event reasons (nvidia-smi's clocks_event_reasons.active, a bit mask)
IDLE, POWER_CAP = 0x1, 0x4
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # hardware slowdown, software and hardware thermal, power brake
SAMPLED = ("power_draw_w", "power_capped_share", "slowdown_share")  # `clock_report`'s, besides the SM clock


class ClockWatch:
    """nvidia-smi sampling one GPU's SM clock, power draw and what holds the clock down every
    `period_ms` until `stop`. The power limit lowers the clock of a step bound by its matrix
    products (bf16 at the 3B shape on an H200: 1.64 of 1.98 GHz, capped in 92-99% of the samples);
    one reading at the end of a run, when the GPU has stopped, gives its top clock instead."""

    def __init__(self, uuid: str, period_ms: int = 200) -> None:
        self.samples: list[str] = []
        self.process: Optional[subprocess.Popen] = None
        for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):  # newer, older drivers
            command = ["nvidia-smi", f"--id={uuid}", f"--query-gpu=clocks.sm,power.draw,{reasons}",
                       "--format=csv,noheader,nounits"]
            try:
                if subprocess.run(command, capture_output=True, timeout=20).returncode == 0:
                    self.process = subprocess.Popen([*command, f"--loop-ms={period_ms}"], text=True,
                                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                    break
            except (OSError, subprocess.SubprocessError):
                return
        if self.process:
            self.reader = threading.Thread(target=lambda: self.samples.extend(self.process.stdout), daemon=True)
            self.reader.start()

    def stop(self) -> dict:
        """`clock_report` of the samples taken; {} without nvidia-smi."""
        if not self.process:
            return {}
        self.process.terminate()
        with contextlib.suppress(subprocess.SubprocessError):
            self.process.wait(timeout=20)
        self.reader.join(timeout=20)
        return clock_report(self.samples)


def clock_report(lines: list[str]) -> dict:
    """Over nvidia-smi's busy samples ("clock, power, reasons"; idle ones left out): the mean SM
    clock and power draw, and the share of samples whose clock the power limit held down
    (`power_capped_share`) or a thermal or hardware slowdown (`slowdown_share`). {} without any."""
    rows = []
    for line in lines:
        with contextlib.suppress(ValueError):  # not three fields, or not numbers
            clock, power, reasons = (v.strip() for v in line.split(","))
            bits = int(reasons, 16)
            if not bits & IDLE:
                rows.append((float(clock), _number(power), bits))
    if not rows:
        return {}
    powers = [power for _, power, _ in rows if power is not None]
    return {"sm_clock_mhz": sum(clock for clock, _, _ in rows) / len(rows),
            "power_draw_w": sum(powers) / len(powers) if powers else None,
            "power_capped_share": sum(bool(r & POWER_CAP) for *_, r in rows) / len(rows),
            "slowdown_share": sum(bool(r & SLOWDOWN) for *_, r in rows) / len(rows)}


def _number(text: str) -> Optional[float]:
    """nvidia-smi's value, None for "[N/A]" and the like."""
    try:
        return float(text)
    except ValueError:
        return None


class ScalarSinks:
    """TensorBoard and W&B, on rank 0, as the run's LogConfig asks: each record's fields as
    `train/<field>`, validation losses as `validation/loss`, against the iteration. (The plan refused
    a sink whose package is not installed, before anything was built.)"""

    def __init__(self, config: LogConfig, run_config: Optional[dict] = None) -> None:
        self.tensorboard = self.wandb = None
        if not is_rank0():
            return
        if config.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(config.tensorboard_dir)
        if config.wandb_project:
            import wandb

            self.wandb = wandb.init(project=config.wandb_project, config=run_config)

    def scalars(self, iteration: int, values: dict[str, float]) -> None:
        if self.tensorboard:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, iteration)
            self.tensorboard.flush()
        if self.wandb:
            self.wandb.log(values, step=iteration)

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()


@dataclass
class StepStats:
    """One optimizer step on this rank."""

    loss: torch.Tensor  # [Σ loss × loss_mask, Σ loss_mask]
    tokens: int  # positions fed, padding included
    real_tokens: int  # positions that are not padding
    data_seconds: float  # waiting for the micro-batches
    lr: float
    grad_norm: torch.Tensor
    document_squares: int  # Σ sᵢ² of the rows' documents (`document_squares`)
    row_squares: int  # Σ s² of the rows


@dataclass
class StepRecord:
    """One log interval. MFU is None where the chip's peak is unknown, memory on the CPU; the JSON
    line leaves such fields out."""

    iteration: int
    loss: float
    lr: float
    grad_norm: float
    step_ms: float
    tokens_per_s: float
    real_tokens_per_s: float
    data_share: float  # of the interval's time spent waiting for data
    consumed_samples: int
    mfu_causal: Optional[float] = None  # the module's docstring says how each counts
    mfu_full: Optional[float] = None
    max_memory_gib: Optional[float] = None
    # Mixture of experts: the busiest expert's tokens over the mean (1 = balanced), and the tokens
    # each expert received in the interval, all layers and ranks together.
    expert_load_max: Optional[float] = None
    expert_tokens: Optional[list[int]] = None

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def line(self, total_iters: int) -> str:
        parts = [f"iter {self.iteration:>6}/{total_iters}", f"loss {self.loss:.4f}", f"lr {self.lr:.2e}",
                 f"grad {self.grad_norm:.3f}", f"{self.step_ms:.0f} ms/step",
                 f"{self.tokens_per_s / 1e3:.1f}k tok/s", f"real {self.real_tokens_per_s / 1e3:.1f}k tok/s"]
        if self.mfu_causal is not None:
            parts.append(f"MFU {100 * self.mfu_causal:.1f}% (causal) / {100 * self.mfu_full:.1f}% (full)")
        parts.append(f"data {100 * self.data_share:.2f}%")
        if self.max_memory_gib is not None:
            parts.append(f"mem {self.max_memory_gib:.1f} GiB")
        if self.expert_load_max is not None:
            parts.append(f"experts max/mean {self.expert_load_max:.2f}")
        return " | ".join(parts)


@dataclass
class Summary:
    iterations: int
    history: list[StepRecord]
    tokens_per_s: Optional[float] = None  # steady state: after iteration 1
    real_tokens_per_s: Optional[float] = None
    data_share: Optional[float] = None
    mfu_causal: Optional[float] = None
    mfu_full: Optional[float] = None
    run: dict = field(default_factory=dict)  # `Metrics`' run
    machine: dict = field(default_factory=dict)  # `machine`


@dataclass
class _Window:
    """What one rank accumulates between two log lines."""

    loss: torch.Tensor
    started: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    real_tokens: int = 0
    data_seconds: float = 0.0
    document_squares: int = 0
    row_squares: int = 0
    steps: int = 0
    last: Optional[StepStats] = None


@dataclass
class _Totals:
    """The job's counts over the steady-state intervals."""

    tokens: int = 0
    real_tokens: int = 0
    document_squares: int = 0
    row_squares: int = 0
    data_seconds: float = 0.0
    seconds: float = 0.0

    def add(self, window: _Window, dp: int, seconds: float) -> None:
        self.tokens += window.tokens * dp
        self.real_tokens += window.real_tokens * dp
        self.document_squares += window.document_squares * dp
        self.row_squares += window.row_squares * dp
        self.data_seconds += window.data_seconds
        self.seconds += seconds


class ExpertLoad:
    """The tokens each expert of a mixture-of-experts model is routed in training, counted from
    megatron-core's routers (their routing map) over all layers; `take` sums them over every rank
    (sequence, data and expert parallel ranks route different tokens; pipeline stages, different
    layers) and starts again."""

    def __init__(self, model: torch.nn.Module, num_experts: int, device: torch.device) -> None:
        from megatron.core.transformer.moe.router import TopKRouter

        self.counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
        for module in model.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_hook(self._count)

    def _count(self, router, inputs, output) -> None:
        if router.training:
            _, routing_map = output
            self.counts += routing_map.sum(0)

    def take(self) -> list[int]:
        counts = self.counts.clone()
        dist.all_reduce(counts)
        self.counts.zero_()
        return counts.tolist()


class Metrics:
    """The run's records: steps are added, every `log_interval` iterations an interval is closed.
    `run`: what the run was ({model, gpus, fp8, packed, ep}), for the summary line, so that a log
    names its run without its command line."""

    def __init__(self, config: LogConfig, device: torch.device, plan: RunPlan, total_iters: int,
                 run_config: Optional[dict] = None, expert_load: Optional[ExpertLoad] = None,
                 run: Optional[dict] = None) -> None:
        """`plan`: the run's (`plan.RunPlan`): its model's shape, its ranks."""
        self.expert_load, self.run = expert_load, run or {}
        self.device, self.plan, self.shape, self.total_iters = device, plan, plan.shape, total_iters
        self.log_interval, self.json_path = config.log_interval, config.log_json
        self.profiled = config.profile and device.type == "cuda"  # --profile: `measure`, `ClockWatch`
        self.peak = peak_flops(device, config.peak_tflops)
        self.history: list[StepRecord] = []
        self.totals = _Totals()
        self.sinks = ScalarSinks(config, run_config)
        self.watch: Optional[ClockWatch] = None
        self.gpu_busy_share: Optional[float] = None  # `measure`'s
        self.restart_clock()

    def restart_clock(self) -> None:
        """A new interval from now."""
        self.window = _Window(loss=torch.zeros(2, device=self.device))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent in the block (evaluation, a save) is not counted as the steps' time."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.window.started += time.perf_counter() - started

    def measure(self, iteration: int, step: Callable[[], StepStats]) -> StepStats:
        """`step()`, iteration `iteration`'s; with --profile on a GPU, PROFILED_ITERATION's kernels
        are timed (`kernel_seconds`): their share of the step's time says whether the GPU or the
        host's kernel launches set the pace (FP8 saves GPU time only)."""
        if iteration != PROFILED_ITERATION or not self.profiled:
            return step()
        stats, kernels, seconds, top = kernel_seconds(step)
        if kernels > 0:  # none recorded: the profiler could not trace this GPU
            self.gpu_busy_share = kernels / seconds
            for line in busy_lines(self.gpu_busy_share, self.run.get("fp8")):
                log0(line)
            for name, ms, calls in top:
                log0(f"  {ms:9.2f} ms {calls:6} calls  {name[:100]}")
        return stats

    def add(self, step: StepStats) -> None:
        w = self.window
        w.loss += step.loss
        w.tokens += step.tokens
        w.real_tokens += step.real_tokens
        w.data_seconds += step.data_seconds
        w.document_squares += step.document_squares
        w.row_squares += step.row_squares
        w.steps += 1
        w.last = step

    def due(self, iteration: int) -> bool:
        return iteration % self.log_interval == 0 or iteration in (1, self.total_iters)

    def log(self, iteration: int, consumed_samples: int) -> StepRecord:
        """Close the interval (a collective: every rank calls it), print and keep its record."""
        w = self.window
        loss = w.loss.clone()
        dist.all_reduce(loss, group=gradient_group())  # [Σ loss × mask, Σ mask] of every part of the batch
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - w.started
        if self.history:  # not the first interval
            self.totals.add(w, self.plan.dp, elapsed)
        record = self._record(iteration, consumed_samples, loss, elapsed)
        self.history.append(record)
        log0(record.line(self.total_iters))
        self._json(record.as_dict())
        self.sinks.scalars(iteration, {f"train/{k}": v for k, v in record.as_dict().items()
                                       if k not in ("iteration", "expert_tokens")})
        if len(self.history) == 1 and self.profiled and is_rank0():
            # over the steady state, as the summary's rates
            self.watch = ClockWatch(f"GPU-{torch.cuda.get_device_properties(self.device).uuid}")
        self.restart_clock()
        return record

    def validation(self, iteration: int, loss: Optional[float]) -> None:
        """Report a validation loss (None: its batches held no trained token); JSON: {iteration, valid_loss}."""
        shown = "n/a (no trained tokens in its batches)" if loss is None else f"{loss:.4f}"
        log0(f"validation at iteration {iteration}: loss {shown}")
        self._json({"iteration": iteration, "valid_loss": loss})
        if loss is not None:
            self.sinks.scalars(iteration, {"validation/loss": loss})

    def _json(self, record: dict) -> None:
        if self.json_path and is_rank0():
            with open(self.json_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _record(self, iteration: int, consumed_samples: int, loss: torch.Tensor, elapsed: float) -> StepRecord:
        w, dp = self.window, self.plan.dp
        cuda = self.device.type == "cuda"
        experts = self.expert_load.take() if self.expert_load else None
        return StepRecord(
            iteration=iteration, loss=(loss[0] / loss[1]).item() if loss[1] > 0 else math.nan,
            lr=w.last.lr, grad_norm=w.last.grad_norm.item(), step_ms=1000 * elapsed / w.steps,
            tokens_per_s=w.tokens * dp / elapsed, real_tokens_per_s=w.real_tokens * dp / elapsed,
            data_share=w.data_seconds / elapsed, consumed_samples=consumed_samples,
            **self._mfu(w.tokens * dp, w.document_squares * dp, w.row_squares * dp, elapsed),
            max_memory_gib=self._peak_memory_gib() if cuda else None,
            expert_load_max=max(experts) * len(experts) / max(1, sum(experts)) if experts else None,
            expert_tokens=experts,
        )

    def _peak_memory_gib(self) -> float:
        """The most memory any GPU of the job has held (a collective): pipeline stages hold different
        parts, and the one with the output layer's logits is not rank 0."""
        peak = torch.tensor(float(torch.cuda.max_memory_allocated(self.device)), device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return peak.item() / 2**30

    def _mfu(self, tokens: int, document_squares: int, row_squares: int, seconds: float) -> dict:
        """{mfu_causal, mfu_full} of the job's counts over `seconds`; {} without a peak."""
        if not self.peak:
            return {}
        matmul = tokens * self.shape.matmul_flops_per_token()
        per_second = seconds * self.plan.world * self.peak
        return {"mfu_causal": (matmul + self.shape.attention_flops(document_squares, causal=True)) / per_second,
                "mfu_full": (matmul + self.shape.attention_flops(row_squares, causal=False)) / per_second}

    def summary(self, iterations: int) -> Summary:
        """The steady-state rates (printed) and every record; the rates and the machine as the
        JSON log's last line."""
        t = self.totals
        rates = {}
        if t.seconds > 0:
            rates = {"tokens_per_s": t.tokens / t.seconds, "real_tokens_per_s": t.real_tokens / t.seconds,
                     "data_share": t.data_seconds / t.seconds,
                     **self._mfu(t.tokens, t.document_squares, t.row_squares, t.seconds)}
            log0("steady state (after iteration 1): " + ", ".join(f"{k} {v:.4g}" for k, v in rates.items()))
        where = {**machine(self.device), **(self.watch.stop() if self.watch else {})}
        if self.device.type == "cuda":
            log0(f"peak memory {self._peak_memory_gib():.1f} GiB (the most of any GPU)")
        self._json({"summary": True, "iterations": iterations, **self.run, **rates,
                    "gpu_busy_share": self.gpu_busy_share, **where})
        self.sinks.close()
        return Summary(iterations, self.history, **rates, run=self.run, machine=where)
