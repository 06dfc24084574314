"""`--compile layers` traces each transformer layer as one graph: a graph break splits a layer into
pieces that are compiled and launched apart (megatron-core's RowParallelLinear once broke every
layer twice, at a warning it issues on rank 0). Traced here with torch.compile's eager backend,
which runs dynamo's tracing, and its graph breaks, without a compiler."""

import pytest
import torch

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier


@pytest.fixture(scope="module")
def megatron_cpu():
    from qwen_data_train.distributed import distributed
    from qwen_data_train.patches import megatron_core
    with megatron_core(), distributed(1) as device:
        yield device


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_compiled_layers_trace_whole(megatron_cpu, name):
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss
    from torch._dynamo.utils import counters

    if megatron_cpu.type == "cuda":
        pytest.skip("counts graphs on the CPU: on an H100 with megatron-core 0.19 a layer traced as 3 graphs with "
                    "no graph break; GPU runs count recompiles instead (bench/gpu.sh te)")
    torch.manual_seed(3)
    model = build_model(RunPlan.for_model(PRESETS[name], attention="sdpa", max_sequence_length=128)).to(megatron_cpu)
    b, s = 2, 64
    batch = dict(tokens=torch.randint(0, 1000, (b, s)), labels=torch.randint(0, 1000, (b, s)),
                 position_ids=torch.arange(s).repeat(b, 1), segment_ids=torch.zeros(b, s, dtype=torch.long))
    weights = torch.ones(b, s, device=megatron_cpu)
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


def _rows_of(samples_per_row: list[int], s: int) -> dict:
    """A micro-batch of packed rows, row i cut into samples_per_row[i] samples (the last one is padding)."""
    from qwen_data_train.data import boundaries
    rows = []
    for count in samples_per_row:
        cuts = torch.linspace(0, s, count + 1).long()[1:-1]
        segment_ids = torch.zeros(s, dtype=torch.int32)
        segment_ids[cuts] = 1
        rows.append(boundaries(segment_ids.cumsum(0).numpy().astype("int32"), s))
    batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    b = len(samples_per_row)
    batch.update(tokens=torch.randint(0, 1000, (b, s)), labels=torch.randint(0, 1000, (b, s)))
    return batch


def _no_recompiles_across_sample_counts(device, attention, autocast):
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss
    from torch._dynamo.utils import counters

    torch.manual_seed(3)
    s = 64
    model = build_model(RunPlan.for_model(PRESETS["tiny"], attention=attention, max_sequence_length=s)).to(device)
    spec = ForwardSpec(attention, device, autocast=autocast, cross_entropy="fused", seq_length=s)
    torch._dynamo.reset()
    counters.clear()
    for layer in model.decoder.layers:
        layer.compile(backend="eager")
    try:
        for counts in ([2, 3], [5, 1], [7, 4], [1, 2]):
            masked_loss(model, _rows_of(counts, s), torch.ones(2, s, device=device), spec).backward()
            torch._dynamo.config.error_on_recompile = True  # from the second micro-batch on
    finally:
        torch._dynamo.config.error_on_recompile = False
        torch._dynamo.reset()


def test_compiled_layers_never_recompile_across_sample_counts(megatron_cpu):
    """Micro-batches of packed rows holding other numbers of samples run the graphs compiled for
    the first one (a recompile per micro-batch once left packed SFT stuck)."""
    _no_recompiles_across_sample_counts(megatron_cpu, "sdpa", autocast=False)


def test_transformer_engine_layers_never_recompile_across_sample_counts(megatron_cpu):
    from qwen_data_train.attention import have_transformer_engine
    if megatron_cpu.type != "cuda" or not have_transformer_engine():
        pytest.skip("needs CUDA and Transformer Engine")
    _no_recompiles_across_sample_counts(megatron_cpu, "te", autocast=True)


def test_fp8_layers_compile_around_transformer_engines_linears(megatron_cpu):
    """Under --fp8 a compiled layer calls Transformer Engine's linears outside its graph (dynamo
    fails inside them): it gives the eager loss and gradients, and compiles once."""
    from qwen_data_train.attention import have_transformer_engine
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss

    if megatron_cpu.type != "cuda" or not have_transformer_engine() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a GPU with FP8 and Transformer Engine")
    s = 64
    batch = dict(tokens=torch.randint(0, 1000, (2, s)), labels=torch.randint(0, 1000, (2, s)),
                 position_ids=torch.arange(s).repeat(2, 1), segment_ids=torch.zeros(2, s, dtype=torch.long))
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=True, cross_entropy="fused", seq_length=s)
    runs = []
    for compiled in (False, True):
        torch.manual_seed(3)
        model = build_model(RunPlan.for_model(PRESETS["tiny"], attention="sdpa", max_sequence_length=s, fp8="tensorwise",
                            compile="layers" if compiled else "swiglu")).to(megatron_cpu)
        try:
            for _ in range(2):
                model.zero_grad()
                loss = masked_loss(model, batch, torch.ones(2, s, device=megatron_cpu), spec)
                loss.backward()
                torch._dynamo.config.error_on_recompile = True  # the second call runs the first's graphs
        finally:
            torch._dynamo.config.error_on_recompile = False
            torch._dynamo.reset()
        runs.append((loss.item(), [p.grad.float().norm().item() for p in model.parameters()]))
    (eager, eager_grads), (compiled, compiled_grads) = runs
    assert compiled == pytest.approx(eager, rel=1e-2)
    assert compiled_grads == pytest.approx(eager_grads, rel=5e-2)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_attention_around_eager_linears_compiles_rope_once(megatron_cpu, name):
    """Under --fp8 a compiled layer's linears run eagerly (`fp8_linear`), and so does megatron-core's
    attention forward that calls them: RoPE, compiled on its own, sees the query and then the key
    (fewer heads; of Qwen2.5 a strided view). FP8SelfAttention makes the first graph serve both.
    megatron-core's local linears stand in for Transformer Engine's, run eagerly the same way."""
    from qwen_data_train.model import build_model
    from qwen_data_train.model.layers import FP8SelfAttention, outside_graph
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, masked_loss

    s = 64
    batch = dict(tokens=torch.randint(0, 1000, (2, s)), labels=torch.randint(0, 1000, (2, s)),
                 position_ids=torch.arange(s).repeat(2, 1), segment_ids=torch.zeros(2, s, dtype=torch.long))
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=False, cross_entropy="fused", seq_length=s)
    weights = torch.ones(2, s, device=megatron_cpu)
    torch.manual_seed(3)
    model = build_model(RunPlan.for_model(PRESETS[name], attention="sdpa", max_sequence_length=s))
    model = model.to(megatron_cpu)
    eager = masked_loss(model, batch, weights, spec).item()
    torch._dynamo.reset()
    for layer in model.decoder.layers:
        attention, mlp = layer.self_attention, layer.mlp
        for linear in (attention.linear_qkv, attention.linear_proj, mlp.linear_fc1, mlp.linear_fc2):
            linear.__class__ = outside_graph(type(linear))
        attention.__class__ = FP8SelfAttention
        layer.compile(backend="eager")
    torch._dynamo.config.error_on_recompile = True  # RoPE runs twice in every layer's first call
    try:
        for _ in range(2):
            compiled = masked_loss(model, batch, weights, spec)
            compiled.backward()
    finally:
        torch._dynamo.config.error_on_recompile = False
        torch._dynamo.reset()
    assert compiled.item() == pytest.approx(eager, rel=1e-6)


def test_pinned_loader_leaves_compiled_code_valid_in_threads_started_later(megatron_cpu):
    """The loader of a GPU run pins its batches in torch's pin-memory thread, which sets the intra-op
    thread count to 1, the count every thread started after it begins with (autograd's GPU threads,
    where activation recompute runs compiled code again in backward). Code compiled in the training
    thread after the loader started passes its guards there."""
    import threading
    import warnings

    from qwen_data_train.loader import make_loader
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # more than the pin-memory thread's 1, on any machine
    samples = [{"tokens": torch.full((4,), i)} for i in range(4)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a CPU-only torch warns that it pins nothing
            next(make_loader(samples, 0, RunPlan.for_model(PRESETS["tiny"]), 0, torch.device("cuda")))
        graphs = []

        def backend(graph, inputs):  # counts the compiles
            graphs.append(graph)
            return graph.forward

        swiglu = torch.compile(lambda y: torch.nn.functional.silu(y[:, :2]) * y[:, 2:], backend=backend)
        swiglu(torch.ones(3, 4))  # the first forward, in this thread
        # torch's pin-memory loop (torch/utils/data/_utils/pin_memory.py) begins with this
        pinning = threading.Thread(target=torch.set_num_threads, args=(1,))
        pinning.start()
        pinning.join()
        recompute = threading.Thread(target=swiglu, args=(torch.ones(3, 4),))  # as autograd's GPU thread
        recompute.start()
        recompute.join()
        assert len(graphs) == 1
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(threads)


def test_fp8_weights_are_cast_again_each_step_under_torch_ddp(megatron_cpu):
    """Transformer Engine casts an FP8 linear's weights on a step's first micro-batch and reuses
    the casts after; through torch's DDP wrapper (data parallelism) a step after a weight update
    computes with the new weights, as the model run alone does."""
    from qwen_data_train.attention import have_transformer_engine
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.shapes import PRESETS
    from qwen_data_train.step import ForwardSpec, forward_backward, masked_loss
    from torch.nn.parallel import DistributedDataParallel

    if megatron_cpu.type != "cuda" or not have_transformer_engine() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a GPU with FP8 and Transformer Engine")
    s = 64
    batch = dict(tokens=torch.randint(0, 1000, (2, s)), labels=torch.randint(0, 1000, (2, s)),
                 position_ids=torch.arange(s).repeat(2, 1), segment_ids=torch.zeros(2, s, dtype=torch.long))
    mask, one = torch.ones(2, s, device=megatron_cpu), torch.ones((), device=megatron_cpu)
    spec = ForwardSpec("sdpa", megatron_cpu, autocast=True, cross_entropy="fused", seq_length=s)
    torch.manual_seed(3)
    model = build_model(RunPlan.for_model(PRESETS["tiny"], attention="sdpa", max_sequence_length=s, fp8="tensorwise")).to(megatron_cpu)
    ddp = DistributedDataParallel(model, device_ids=[megatron_cpu.index])

    def loss_of(sums):
        return (sums[0] / sums[1]).item()

    forward_backward(ddp, [batch], [mask], one, spec)  # a step: TE casts the weights
    with torch.no_grad():  # an update that changes the loss: every weight well beyond its initial size
        for p in model.parameters():
            p.mul_(4)
    model.set_is_first_microbatch = lambda: None  # the control: a step that does not cast them again
    try:
        stale = loss_of(forward_backward(ddp, [batch], [mask], one, spec, forward_only=True))
    finally:
        del model.set_is_first_microbatch
    after = loss_of(forward_backward(ddp, [batch], [mask], one, spec, forward_only=True))
    model.set_is_first_microbatch()
    alone = masked_loss(model, batch, mask, spec).item() / mask.sum().item()
    assert after == pytest.approx(alone, rel=1e-3)
    assert stale != pytest.approx(alone, rel=1e-2)


def test_thd_rows_are_one_stream_cut_at_every_sample():
    from qwen_data_train.attention import thd_mask
    s = 16
    batch = _rows_of([3, 1, 2], s)
    thd = thd_mask(batch, torch.device("cpu")).thd
    # Row 0: samples at 0, 5, 10; row 1: one; row 2: at 0 and 8, each row's starts offset by its
    # place; 6 samples rounded up to 8 with empty ones at the end.
    assert thd.cu_seqlens_q.tolist() == [0, 5, 10, 16, 32, 40, 48, 48, 48]
    assert thd.cu_seqlens_q.dtype == torch.int32 and thd.cu_seqlens_kv is thd.cu_seqlens_q
    assert thd.max_seqlen_q == thd.max_seqlen_kv == 16 and isinstance(thd.max_seqlen_q, int)
    assert thd.qkv_format == "thd"
    # Every stream position belongs to the sample the segment ids say.
    flat = (batch["segment_ids"] + 100 * torch.arange(3).unsqueeze(1)).flatten()
    for a, b in zip(thd.cu_seqlens_q[:-1].tolist(), thd.cu_seqlens_q[1:].tolist()):
        assert a == b or flat[a:b].unique().numel() == 1 and (a == 0 or flat[a - 1] != flat[a])
    # Other micro-batches of up to 8 samples, the longest of 5 to 8 tokens, share its shape.
    shapes = {(len(t.cu_seqlens_q), t.max_seqlen_q) for t in
              (thd_mask(m, torch.device("cpu")).thd
               for m in (_rows_of(counts, 16) for counts in ([3, 3, 2], [2, 2, 2], [3, 2, 3])))}
    assert shapes == {(9, 8)}


def test_the_graphed_thd_form_is_refilled_where_the_graph_reads_it():
    """`fixed_thd_mask`: a fixed count of samples (empty ones at the end), the longest taken as s, in
    a buffer `refill_thd` rewrites in place; a micro-batch of more samples than it holds is refused."""
    from qwen_data_train.attention import fixed_thd_mask, refill_thd, thd_mask
    s = 16
    mask = fixed_thd_mask(_rows_of([3, 1, 2], s), torch.device("cpu"), 8)
    thd = mask.thd
    buffer, where = thd.cu_seqlens_q, thd.cu_seqlens_q.data_ptr()
    assert buffer.tolist() == [0, 5, 10, 16, 32, 40, 48, 48, 48] and buffer.dtype == torch.int32
    assert thd.cu_seqlens_kv is buffer and thd.max_seqlen_q == thd.max_seqlen_kv == s
    for counts in ([2, 2, 2], [1, 1, 1], [3, 3, 2]):
        batch = _rows_of(counts, s)
        refill_thd(mask, batch)
        assert mask.thd.cu_seqlens_q is buffer and buffer.data_ptr() == where
        exact = thd_mask(batch, torch.device("cpu")).thd.cu_seqlens_q  # the eager form, rounded to a power of 2
        assert buffer[: sum(counts)].tolist() == exact[: sum(counts)].tolist()
        assert (buffer[sum(counts):] == 3 * s).all()
    last = buffer.tolist()
    with pytest.raises(ValueError, match="9 samples do not fit a THD form of 8"):
        refill_thd(mask, _rows_of([3, 3, 3], s))
    assert buffer.tolist() == last == [0, 5, 10, 16, 21, 26, 32, 40, 48]  # the last micro-batch's, untouched


def test_num_layers_cuts_a_preset_and_nothing_else():
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.loop import model_of

    shape, _, _ = model_of(TrainConfig.parse(["--data", "d", "--model", "qwen2.5-7b", "--num-layers", "8"]))
    assert shape.num_layers == 8 and shape.hidden_size == 3584 and "8 of 28 layers" in shape.name
    for argv in (["--num-layers", "8"], ["--model", "tiny", "--num-layers", "0"]):
        with pytest.raises(SystemExit):
            TrainConfig.parse(["--data", "d", *argv])
