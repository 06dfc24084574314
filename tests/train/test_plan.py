"""The train stage's run plan (train/plan.py): every cross-feature rule refuses here, before a
process group or a weight exists, and what `auto` picks is said with its reason. No model is built
and megatron-core is not imported: these run in the fast tier."""

import pytest

from qwen_data_train.config import TrainConfig
from qwen_data_train.plan import (AUTO_TE_PACKED, AUTO_WITH_TE, RULES, Environment, RunPlan, pipeline_split,
                                  resolve_attention, resolve_compile, resolve_fp8, stage_bytes)
from qwen_data_train.shapes import PRESETS

H100 = Environment(cuda=True, te_installed=True, capability=(9, 0))
CPU = Environment()


def plan(*args, model="tiny", env=CPU):
    config = TrainConfig.parse(["--data", "x", "--model", model, "--seq-length", "128", *args])
    return RunPlan.resolve(config, PRESETS[model], env)


def refusal(*args, **kwargs) -> str:
    with pytest.raises(ValueError) as caught:
        plan(*args, **kwargs)
    return str(caught.value)


# (what is asked, where, a phrase of the refusal): one case per rule of RULES, in its order
REFUSED = [
    (["--ep", "3"], dict(model="tiny-qwen3-moe", env=Environment(world_size=4)), "--ep 3 does not divide"),
    (["--global-batch-size", "3"], dict(env=Environment(world_size=2)), "not a multiple of micro batch × DP"),
    (["--distributed-optimizer"], {}, "--distributed-optimizer runs on CUDA"),
    (["--fp8", "tensorwise"], dict(model="tiny-qwen3-moe", env=H100), "--fp8 with a mixture-of-experts"),
    (["--ep", "2"], dict(env=Environment(world_size=2)), "splits experts: tiny has none"),
    (["--tp", "3"], dict(model="qwen2.5-0.5b", env=Environment(world_size=3)),
     "--tp 3 does not split qwen2.5-0.5b evenly (14 attention heads, 2 key/value heads, an MLP 4,864 wide)"),
    (["--tp", "2"], dict(model="tiny-qwen3-moe", env=Environment(world_size=2)), "add --sequence-parallel"),
    (["--sequence-parallel"], {}, "it needs --tp 2 or more"),
    (["--tp", "2", "--sequence-parallel", "--compile", "layers"], dict(env=Environment(world_size=2)),
     "gives wrong gradients"),
    (["--pp", "2", "--moe-balance-loss", "transformers"], dict(model="tiny-qwen3-moe", env=Environment(world_size=2)),
     "every layer's routing in one stage"),
    (["--pp", "3"], dict(env=Environment(world_size=3)), "do not split over --pp 3"),
    (["--cp", "3"], dict(env=Environment(world_size=3)), "not a multiple of 6"),
    (["--cp", "2", "--attention", "te"], dict(env=Environment(cuda=True, te_installed=True, capability=(9, 0),
                                                              world_size=2)), "--cp runs PyTorch's attention"),
    (["--cp", "2", "--distributed-optimizer"], dict(env=Environment(cuda=True, world_size=2)),
     "--cp with --distributed-optimizer is not built yet"),
    (["--bf16-weights"], {}, "--bf16-weights: it computes under bf16 autocast"),
    (["--tensorboard-dir", "tb", "--wandb-project", "p"], dict(env=Environment(installed=frozenset({"wandb"}))),
     "--tensorboard-dir needs the tensorboard package (pip install tensorboard)"),
    (["--cuda-graphs", "on"], {}, "--cuda-graphs on: there is no CUDA here"),
]


@pytest.mark.parametrize("args, where, says", REFUSED, ids=[r.__name__.strip("_") for r in RULES])
def test_every_rule_refuses_before_anything_is_built(args, where, says):
    assert says in refusal(*args, **where)


def test_each_case_is_refused_by_its_own_rule(monkeypatch):
    """REFUSED is in RULES' order: each case breaks its own rule (what it says is that rule's)."""
    import qwen_data_train.plan as plan_module

    assert len(REFUSED) == len(RULES)
    monkeypatch.setattr(plan_module, "check", lambda p: None)  # the plan as resolved, unchecked
    for (args, where, says), rule in zip(REFUSED, RULES):
        unchecked = plan(*args, **where)
        assert says in (rule(unchecked) or ""), rule.__name__


@pytest.mark.parametrize("args, env, says", [
    (["--bf16-weights", "--fp8", "tensorwise"], H100, "not built with --fp8"),
    (["--bf16-weights", "--distributed-optimizer"], Environment(cuda=True), "keeps its own masters"),
])
def test_bf16_weights_say_which_of_their_conditions_fails(args, env, says):
    assert says in refusal(*args, env=env)


def test_bf16_weights_are_built_beside_data_and_context_parallelism():
    """Their float32 gradients are averaged over data × context parallel ranks by reduce_grads."""
    for args in (["--bf16-weights"], ["--bf16-weights", "--cp", "2"]):
        p = plan(*args, env=Environment(cuda=True, world_size=2))
        assert p.bf16_weights and p.dp * p.cp == 2 and p.data_parallel == "torch"


@pytest.mark.parametrize("args, model, env, split, why", [
    ([], "tiny", Environment(cuda=True), True, "the default where they are built"),
    ([], "tiny", Environment(cuda=True, world_size=2), True, "the default where they are built"),
    (["--pp", "2"], "tiny", Environment(cuda=True, world_size=2), True, "the default where they are built"),
    (["--no-bf16-weights"], "tiny", Environment(cuda=True), False, "as asked"),
    (["--bf16-weights"], "tiny", Environment(cuda=True), True, "as asked"),
    ([], "tiny", Environment(), False, "split bf16 weights: it computes under bf16 autocast"),
    (["--fp32"], "tiny", Environment(cuda=True), False, "under bf16 autocast"),
    (["--fp8", "tensorwise"], "tiny", H100, False, "not built with --fp8"),
    ([], "tiny-qwen3-moe", Environment(cuda=True), False, "mixture-of-experts"),
    (["--distributed-optimizer"], "tiny", Environment(cuda=True), False, "keeps its own masters"),
])
def test_bf16_weights_are_the_default_where_they_are_built(args, model, env, split, why):
    """Measured no slower anywhere they are built (scale-h200x2f in bench/results/gpu/2026-11-29-scale.md): split by default there,
    float32 weights elsewhere, and the plan says which and why (the run's first line)."""
    p = plan(*args, model=model, env=env)
    assert p.bf16_weights is split and why in p.bf16_weights_why


@pytest.mark.parametrize("args, model, env, graphed, why", [
    ([], "tiny", Environment(cuda=True), True, "auto: the host launches one graph"),
    (["--cuda-graphs", "off"], "tiny", Environment(cuda=True), False, "as asked"),
    ([], "tiny", Environment(), False, "auto: there is no CUDA here"),
    ([], "tiny", Environment(cuda=True, world_size=2), False, "one GPU, not 2 ranks"),
    ([], "tiny-qwen3-moe", Environment(cuda=True), False, "routes a different number of tokens"),
    (["--fp8", "tensorwise"], "tiny", H100, True, "auto: the host launches one graph"),
    (["--fp8", "blockwise"], "tiny", H100, True, "auto: the host launches one graph"),
    (["--fp8", "delayed"], "tiny", H100, False, "FP8's delayed recipe keeps an amax history"),
    (["--recompute"], "tiny", Environment(cuda=True), False, "RNG states on the host"),
    (["--attention", "te"], "tiny", H100, True, "auto: the host launches one graph"),
    (["--attention", "local"], "tiny", H100, False, "(sdpa) and Transformer Engine's (te) attention are captured"),
    (["--distributed-optimizer"], "tiny", Environment(cuda=True), False, "distributed optimizer"),
])
def test_cuda_graphs_are_the_default_where_they_are_built(args, model, env, graphed, why):
    p = plan(*args, model=model, env=env)
    assert p.cuda_graphs is graphed and why in p.cuda_graphs_why


@pytest.mark.parametrize("args, env, bf16", [
    ([], Environment(cuda=True), True),
    (["--fp32-residual-connection"], Environment(cuda=True), False),
    (["--fp32"], Environment(cuda=True), False),
    ([], CPU, False),
])
def test_the_residual_stream_is_bf16_under_autocast_unless_asked_otherwise(args, env, bf16):
    """As megatron-core's bf16 runs and transformers' keep it (measured 1.5-1.9% faster at 0.5B; losses within
    two seeds' spread): the float32 embedding table would otherwise make the whole stream float32."""
    assert plan(*args, env=env).residual_bf16 is bf16


@pytest.mark.parametrize("args, env, says", [
    (["--cuda-graphs", "on", "--pp", "2"], Environment(cuda=True, world_size=2), "one GPU, not 2 ranks"),
    (["--cuda-graphs", "on", "--fp8", "delayed"], H100, "FP8's delayed recipe keeps an amax history"),
])
def test_cuda_graphs_asked_where_they_are_not_built_are_refused(args, env, says):
    assert says in refusal(*args, env=env)


def test_bf16_weights_on_a_moe_model_are_refused():
    assert "mixture-of-experts" in refusal("--bf16-weights", model="tiny-qwen3-moe", env=Environment(cuda=True))


def test_the_world_must_hold_the_layout():
    assert "world size 3 is not a multiple of --tp 2" in refusal("--tp", "2", env=Environment(world_size=3))


def test_a_sample_longer_than_the_model_is_refused():
    config = TrainConfig.parse(["--data", "x", "--model", "tiny", "--seq-length", "5000"])
    with pytest.raises(ValueError, match="beyond the 4,096 positions"):
        RunPlan.resolve(config, PRESETS["tiny"], CPU)


def test_a_plan_says_what_runs_and_why():
    p = plan()
    assert (p.attention, p.attention_why, p.compile, p.autocast, p.data_parallel) == (
        "sdpa", "auto: no CUDA", "none", False, "none")
    p = plan(env=H100)
    assert (p.attention, p.te_causal, p.compile, p.autocast) == (AUTO_TE_PACKED[0], False, "layers", True)
    assert plan(env=Environment(world_size=2)).data_parallel == "torch"
    assert plan("--pp", "2", env=Environment(world_size=4)).data_parallel == "none"  # reduce_grads after the schedule
    assert plan("--distributed-optimizer", env=Environment(cuda=True, world_size=2)).data_parallel == "megatron"
    assert plan("--pp", "2", model="tiny-qwen3-moe", env=Environment(world_size=2)).balance == "per-layer"
    assert plan("--fp8", "delayed", env=H100).fp8 == "delayed"


@pytest.mark.parametrize("args, env, attention, why", [
    ([], H100, "te", f"auto: {AUTO_TE_PACKED[1]}"),
    (["--cuda-graphs", "off"], H100, "sdpa", f"auto: {AUTO_WITH_TE[1]}"),
    (["--fp8", "tensorwise"], H100, "sdpa", f"auto: {AUTO_WITH_TE[1]}"),
    (["--fp32"], H100, "sdpa", "auto: float32"),
    ([], Environment(cuda=True, te_installed=True, capability=(8, 0)), "sdpa", f"auto: {AUTO_WITH_TE[1]}"),
    ([], Environment(cuda=True, te_installed=True, capability=(9, 0), world_size=2), "sdpa", "auto: "),
    ([], Environment(cuda=True, capability=(9, 0)), "sdpa", "auto: Transformer Engine is not installed"),
    (["--attention", "te"], H100, "te", "as asked"),
])
def test_auto_takes_te_for_packed_rows_where_they_run_in_cuda_graphs(args, env, attention, why):
    """TE's THD attention captured in the graphs was measured faster on packed rows (an H200); eager it
    was not, and causal rows keep PyTorch's kernel (`te_causal` False) unless te is asked."""
    p = plan(*args, env=env)
    assert p.attention == attention and p.attention_why.startswith(why)
    assert p.te_causal is (args != [] or attention != "te")
    if attention == "te":
        assert p.cuda_graphs


def test_auto_attention_says_what_it_picks_and_why():
    assert resolve_attention("auto", H100) == (AUTO_WITH_TE[0], f"auto: {AUTO_WITH_TE[1]}")
    assert resolve_attention("auto", H100, fp32=True) == (
        "sdpa", "auto: float32 (Transformer Engine's fused attention is bf16/fp16)")
    assert resolve_attention("auto", Environment(te_installed=True)) == ("sdpa", "auto: no CUDA")
    assert resolve_attention("auto", Environment(cuda=True)) == ("sdpa", "auto: Transformer Engine is not installed")
    assert resolve_attention("te", H100) == ("te", "as asked")
    assert resolve_attention("sdpa", H100) == ("sdpa", "as asked")
    with pytest.raises(ValueError, match="runs bf16 on CUDA only"):
        resolve_attention("te", Environment(te_installed=True))
    with pytest.raises(ValueError, match="needs Transformer Engine"):
        resolve_attention("te", Environment(cuda=True))


@pytest.mark.parametrize("recipe, env, fp32, says", [
    ("delayed", Environment(cuda=True, capability=(9, 0)), False, "needs Transformer Engine"),
    ("delayed", Environment(te_installed=True), False, "this machine has no GPU"),
    ("delayed", H100, True, "drop --fp32"),
    ("delayed", Environment(cuda=True, te_installed=True, capability=(8, 0)), False, "no FP8 matrix units"),
    ("blockwise", Environment(cuda=True, te_installed=True, capability=(8, 9)), False, "runs on Hopper"),
])
def test_fp8_is_refused_where_it_cannot_run(recipe, env, fp32, says):
    with pytest.raises(ValueError, match=says):
        resolve_fp8(recipe, env, fp32)


def test_fp8_runs_where_it_can():
    assert resolve_fp8(None, CPU) is None
    assert resolve_fp8("blockwise", H100) == "blockwise"
    assert resolve_fp8("tensorwise", Environment(cuda=True, te_installed=True, capability=(8, 9))) == "tensorwise"


def test_sequence_parallel_never_runs_compiled_layers():
    """A compiled layer lost most of its gradient under sequence parallelism on GPUs: auto compiles
    only the SwiGLU there, nothing on the CPU; a mixture of experts' layers compile around the MoE layer."""
    assert resolve_compile("auto", True, False) == "layers"
    assert resolve_compile("auto", True, True) == "swiglu"
    assert resolve_compile("auto", False, True) == "none"
    assert plan(model="tiny-qwen3-moe", env=Environment(cuda=True)).compile == "layers"


def test_pipeline_stages_split_as_asked():
    assert pipeline_split(28, 2) == [14, 14]
    assert pipeline_split(28, 2, last=13) == [15, 13]  # the last stage also runs the output layer
    assert pipeline_split(28, 4, last=4) == [8, 8, 8, 4]
    assert pipeline_split(28, 4, first=6, last=6) == [6, 8, 8, 6]
    for stages, first, last, says in ((3, None, None, "evenly"), (2, 28, None, "every stage needs a layer"),
                                      (4, 7, 6, "an equal share"), (1, None, 27, "need --pp 2")):
        with pytest.raises(ValueError, match=says):
            pipeline_split(28, stages, first, last)


H200 = 150_121_070_592  # bytes of an H200's memory, as torch reports them (139.8 GiB)
H100_80GB = 85_031_714_816


def seven_b(*args, memory=H200, stages=2):
    return plan("--pp", str(stages), "--seq-length", "4096", "--global-batch-size", "128", *args, model="qwen2.5-7b",
                env=Environment(cuda=True, capability=(9, 0), world_size=stages, gpu_memory=memory))


def test_the_last_stage_sheds_layers_for_the_output_layer_where_they_fit():
    """Qwen2.5-7B's output layer is 2.2 layers' work: 15 + 13 on an H200 (measured 1.07× 14 + 14 there),
    14 + 14 on an 80 GB H100 (15 + 13 ran out of memory there in step 2), even on the CPU, as asked
    when asked."""
    p = seven_b()
    assert (p.stage_layers, p.first_stage_layers, p.last_stage_layers) == ([15, 13], 15, 13)
    assert p.stages_why.startswith("balanced: the output layer is 2.2 layers' work")
    p = seven_b(memory=H100_80GB)
    assert (p.stage_layers, p.stages_why) == ([14, 14], "even: a more balanced split would not fit the GPU by "
                                                          "the estimate")
    assert plan("--pp", "2", env=Environment(world_size=2)).stages_why.startswith("even: no GPU's memory")
    p = seven_b("--decoder-last-pipeline-num-layers", "14")
    assert (p.stage_layers, p.stages_why) == ([14, 14], "as asked")
    # four stages: the middle ones even (megatron-core's first/last sizes), the slowest stage 8 layers' work
    assert seven_b(memory=H100_80GB, stages=4).stage_layers == [7, 8, 8, 5]


@pytest.mark.parametrize("args, first, last, measured_gib", [
    ((), 14, 14, 73.7), ((), 15, 13, 78.3), (("--micro-batch-size", "2"), 15, 13, 96.1)])
def test_the_stage_memory_estimate_counts_a_little_over_the_measured_peaks(args, first, last, measured_gib):
    """Qwen2.5-7B over two H200s, global batch 128, the first stage's peak (records.json: 7b-pp2-gb128-default
    and the 15 + 13 runs of 2026-11-29): the estimate is over it, by under 2%."""
    p = seven_b(*args, "--decoder-first-pipeline-num-layers", str(first))
    estimate = max(stage_bytes(p, stage, layers) for stage, layers in enumerate(p.stage_layers)) / 2**30
    assert measured_gib < estimate < 1.02 * measured_gib


def test_a_plan_for_building_a_model_alone_is_checked_by_the_build_rules():
    RunPlan.for_model(PRESETS["tiny"], attention="sdpa", initialize=False)
    RunPlan.for_model(PRESETS["tiny-qwen3-moe"], tp=2)  # a forward pass under TP needs no sequence parallelism
    with pytest.raises(ValueError, match="it needs --tp 2"):
        RunPlan.for_model(PRESETS["tiny"], sequence_parallel=True)
    with pytest.raises(ValueError, match="do not split over --pp 2"):
        RunPlan.for_model(PRESETS["tiny"], pp=2, first_stage_layers=2)


def test_the_plan_holds_the_layout_of_a_step():
    """World, batches, accumulation and the gradient's ranks: the plan's, read by every builder."""
    p = plan("--tp", "2", "--micro-batch-size", "2", "--global-batch-size", "16", env=Environment(world_size=8))
    assert (p.tp, p.dp, p.world, p.global_batch, p.accumulation, p.gradient_ranks) == (2, 4, 8, 16, 2, 4)
    p = plan("--cp", "2", env=Environment(world_size=4))
    assert (p.dp, p.global_batch, p.accumulation, p.gradient_ranks) == (2, 2, 1, 4)
    assert plan("--pp", "2", env=Environment(world_size=2)).stage_layers == [1, 1]
    assert RunPlan.for_model(PRESETS["tiny"], tp=2).world == 2
