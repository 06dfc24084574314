"""Hugging Face checkpoints into the train stage and back out, against transformers itself.

Three small random models built by transformers and saved with `save_pretrained`: a Qwen2 (QKV
bias, tied embeddings, sharded safetensors with an index), a Qwen3 (QK-norm, head_dim unlike
hidden / heads, untied) and a Qwen3-MoE (8 experts, 2 per token, one tensor set per expert).
Every parameter is drawn at random (norm weights and biases too), so a tensor put in the wrong
place cannot go unnoticed.
"""

import glob
import json
import random

import pytest
import torch

from _helpers import write_jsonl
from _train import docs_of, run, run_convert, run_train, torchrun
from qwen_data.cli import main as qwen_data

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

WORDS = "data model token river stone light cloud 北京 数据 Grüße café δεδομένα данные".split()
SEQ = ["--seq-length", "256", "--micro-batch-size", "2", "--global-batch-size", "4", "--num-workers", "0",
       "--log-interval", "1", "--train-iters", "1"]


def _hf_model(kind, directory):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config, Qwen3MoeConfig
    common = dict(vocab_size=151_936, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=3 if kind == "qwen3" else 2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=4096)
    if kind == "qwen2":
        config = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6)
    elif kind == "qwen3":
        config = Qwen3Config(**common, head_dim=32, tie_word_embeddings=False, rope_theta=5e5)
    else:
        config = Qwen3MoeConfig(**common, head_dim=32, tie_word_embeddings=False, rope_theta=5e5, num_experts=8,
                                num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    torch.manual_seed({"qwen2": 0, "qwen3": 1, "qwen3_moe": 2}[kind])
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1 if p.ndim > 1 else 1.0)
    model.save_pretrained(directory, max_shard_size="20MB" if kind == "qwen2" else "1GB")
    return str(directory)


def tensors(directory):
    from safetensors.torch import load_file
    found = {}
    for path in glob.glob(f"{directory}/*.safetensors"):
        found.update(load_file(path))
    return found


def assert_same_tensors(a, b):
    mine, theirs = tensors(a), tensors(b)
    assert sorted(mine) == sorted(theirs)
    for name, tensor in theirs.items():
        assert mine[name].dtype == tensor.dtype and torch.equal(mine[name], tensor), name


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    folders = {kind: _hf_model(kind, d / kind) for kind in ("qwen2", "qwen3", "qwen3_moe")}
    assert (d / "qwen2" / "model.safetensors.index.json").is_file()  # sharded
    assert not (d / "qwen3" / "model.safetensors.index.json").is_file()  # one file
    rng = random.Random(3)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    chats = write_jsonl(d / "chats.jsonl", [
        {"messages": [{"role": "system", "content": words(5)}, {"role": "user", "content": words(rng.randint(2, 30))},
                      {"role": "assistant", "content": words(rng.randint(2, 40))}]} for _ in range(24)])
    assert qwen_data(["sft", chats, "-o", str(d / "chat"), "--template", "qwen2p5", "--seq-length", "256",
                      "--workers", "1", "--quiet"]) == 0
    assert qwen_data(["blend", str(d / "chat"), "-o", str(d / "blend.json")]) == 0
    return dict(folders, blend=str(d / "blend.json"), prefix=str(d / "chat"), dir=d)


def test_logits_equal_transformers_under_tp_1_and_2(hf, tmp_path):
    tokens = [doc[:48] for doc in docs_of(hf["prefix"])[:2]]  # real ids: chat markers, CJK, Cyrillic
    (tmp_path / "tokens.json").write_text(json.dumps(tokens))
    run(torchrun(2) + ["tests/_hf_logits.py", str(tmp_path / "out.json"), str(tmp_path / "tokens.json"),
                       hf["qwen2"], hf["qwen3"], hf["qwen3_moe"]])
    diffs = json.loads((tmp_path / "out.json").read_text())
    for kind in ("qwen2", "qwen3", "qwen3_moe"):
        assert diffs[hf[kind]]["1"] <= 1e-4 and diffs[hf[kind]]["2"] <= 1e-4, diffs


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_lr_0_round_trip_is_bit_identical_and_first_loss_is_transformers(hf, kind, tmp_path):
    out = tmp_path / "out"
    records, stdout = run_train(["--data", hf["blend"], "--hf-model", hf[kind], "--lr", "0", "--save-hf", str(out),
                                 *SEQ], tmp_path / "log.jsonl")
    assert_same_tensors(out, hf[kind])
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(out).chat_template  # the data's tokenizer, with its template
    assert_first_loss_is_transformers(records, out, hf)


def assert_first_loss_is_transformers(records, folder, hf):
    """The run's first logged loss is transformers' for the model in `folder` on the same batch."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert records[0]["loss"] == pytest.approx(_transformers_loss(model, hf), rel=1e-5)


def _transformers_loss(model, hf):
    """transformers' loss on the run's first global batch: labels = the next tokens where the
    loss mask is 1, -100 elsewhere, as HF shifts them."""
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.loader import build_splits
    config = TrainConfig.parse(["--data", hf["blend"], *SEQ])
    train, _ = build_splits(config, 4)
    batch = [train[i] for i in range(4)]  # one data-parallel rank: samples 0..3
    tokens = torch.stack([s["tokens"] for s in batch])
    trained = torch.stack([torch.where(s["loss_mask"] > 0, s["labels"], -100) for s in batch])
    assert (trained[:, -1] == -100).all()  # HF's shift cannot express the last position
    labels = torch.cat([torch.full((4, 1), -100), trained[:, :-1]], 1)
    with torch.no_grad():
        return model(input_ids=tokens, labels=labels).loss.item()


def test_moe_under_tp2_round_trips_bit_identical_from_transformers_first_loss(hf, tmp_path):
    """Qwen3-MoE: the folder in under TP=2 with sequence parallelism (which megatron-core asks of
    MoE under TP; each expert split like a dense MLP, the router whole),
    the first loss transformers' (the load-balancing loss is not part of the logged loss, as
    transformers leaves it out unless asked for router logits), and every tensor written back."""
    out = tmp_path / "out"
    records, stdout = run_train(["--data", hf["blend"], "--hf-model", hf["qwen3_moe"], "--lr", "0", "--save-hf",
                                 str(out), "--tp", "2", "--sequence-parallel", *SEQ], tmp_path / "log.jsonl", nproc=2)
    assert "TP 2 (sequence parallel)" in stdout
    assert_same_tensors(out, hf["qwen3_moe"])
    assert_first_loss_is_transformers(records, out, hf)


def test_moe_under_ep2_round_trips_bit_identical(hf, tmp_path):
    """The Qwen3-MoE folder with its experts split over two expert-parallel ranks (DP=2, each rank
    reads and writes back its own 4 of the 8 experts, tokens travel to them): the first loss is
    transformers' on the same global batch, and every tensor comes back."""
    out = tmp_path / "out"
    records, stdout = run_train(["--data", hf["blend"], "--hf-model", hf["qwen3_moe"], "--lr", "0", "--save-hf",
                                 str(out), "--ep", "2", *SEQ], tmp_path / "log.jsonl", nproc=2)
    assert "DP 2 (experts over EP 2)" in stdout
    assert_same_tensors(out, hf["qwen3_moe"])
    assert_first_loss_is_transformers(records, out, hf)


@pytest.mark.parametrize("kind, split", [("qwen2", []), ("qwen3", ["--decoder-last-pipeline-num-layers", "1"])])
def test_pipeline_stages_load_and_save_the_same_tensors(hf, kind, split, tmp_path):
    """Two pipeline stages (Qwen2's two layers one each, with tied embeddings: the last stage's output
    layer read from embed_tokens and never written; Qwen3's three split 2 + 1) load the folder, train
    at lr 0 from transformers' first loss, and write it back bit for bit."""
    records, stdout = run_train(["--data", hf["blend"], "--hf-model", hf[kind], "--lr", "0", "--save-hf",
                                 str(tmp_path / "out"), "--pp", "2", *split, *SEQ], tmp_path / "log.jsonl", nproc=2)
    assert f"stages of {'1 + 1' if kind == 'qwen2' else '2 + 1'} layers" in stdout
    assert_same_tensors(tmp_path / "out", hf[kind])
    assert_first_loss_is_transformers(records, hf[kind], hf)


@pytest.fixture(scope="module")
def converted(hf, tmp_path_factory):
    """The Qwen3 folder converted to a checkpoint under TP=2."""
    root = tmp_path_factory.mktemp("converted") / "ck"
    run_convert(["hf-to-mcore", hf["qwen3"], str(root), "--tp", "2"], nproc=2)
    return root


def test_conversion_both_ways_under_any_tp(hf, converted, tmp_path):
    """HF → checkpoint under TP=2 → HF under TP=1, and TP=1 → TP=2, PP=1 → PP=2 (the Qwen2 folder:
    tied embeddings over two stages); a converted checkpoint starts a run with --load alone (its
    model comes with it). (A checkpoint of two stages read by one: test_train_smoke's
    test_checkpoint_from_two_stages_resumes_on_one.)"""
    run_convert(["mcore-to-hf", str(converted), str(tmp_path / "back1")])
    assert_same_tensors(tmp_path / "back1", hf["qwen3"])
    run_convert(["hf-to-mcore", hf["qwen2"], str(tmp_path / "ck1")])
    run_convert(["mcore-to-hf", str(tmp_path / "ck1"), str(tmp_path / "back2"), "--tp", "2"], nproc=2)
    assert_same_tensors(tmp_path / "back2", hf["qwen2"])
    run_convert(["mcore-to-hf", str(tmp_path / "ck1"), str(tmp_path / "back3"), "--pp", "2"], nproc=2)
    assert_same_tensors(tmp_path / "back3", hf["qwen2"])
    records, stdout = run_train(["--data", hf["blend"], "--load", str(converted), "--lr", "0",
                                 "--save-hf", str(tmp_path / "trained"), *SEQ], tmp_path / "log.jsonl")
    assert "loaded the weights of" in stdout
    assert_same_tensors(tmp_path / "trained", hf["qwen3"])


def test_a_checkpoint_of_another_model_is_refused(hf, converted):
    from qwen_data_train.checkpoint import Checkpointer
    from qwen_data_train.config import CheckpointConfig
    from qwen_data_train.distributed import distributed
    from qwen_data_train.hf.checkpoint import HFExport
    from qwen_data_train.hf.config import read_config, shape_from_config
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.patches import megatron_core
    config = read_config(hf["qwen2"])
    shape = shape_from_config(config, hf["qwen2"])
    with megatron_core(), distributed(1):
        plan = RunPlan.for_model(shape, attention="sdpa")
        checkpointer = Checkpointer(CheckpointConfig(save=None, save_interval=0, load=str(converted), save_hf=None),
                                    plan, build_model(plan), None, HFExport(shape, config, torch.float32, None, {}))
        with pytest.raises(ValueError, match="holds another model: .*qk_norm True .checkpoint. vs False"):
            checkpointer.load()


@pytest.mark.parametrize("field, value, named", [
    ("model_type", "qwen2_moe", "model_type"),
    ("num_experts", 8, "num_experts"),
    ("mlp_only_layers", [0], "mlp_only_layers"),
    ("decoder_sparse_step", 2, "decoder_sparse_step"),
    ("use_sliding_window", True, "use_sliding_window"),
    ("layer_types", ["full_attention", "sliding_attention"], "layer_types"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, "rope_parameters.rope_type"),
    ("hidden_act", "gelu", "hidden_act"),
])
def test_unsupported_checkpoints_are_refused_naming_the_field(hf, field, value, named):
    from qwen_data_train.hf.config import UnsupportedCheckpoint, read_config, shape_from_config
    config = read_config(hf["qwen3_moe" if field in ("mlp_only_layers", "decoder_sparse_step") else "qwen2"])
    shape_from_config(config)  # as saved: supported
    with pytest.raises(UnsupportedCheckpoint, match=named):
        shape_from_config(dict(config, **{field: value}))


@pytest.mark.parametrize("form,padded", [("transformers", False), ("transformers", True), ("per-layer", False)])
def test_moe_balance_loss_takes_transformers_gradients(hf, form, padded):
    """transformers trains Qwen3-MoE on mean cross-entropy + router_aux_loss_coef × one load-balancing
    loss over all layers' routing (coefficient 1 here, so that it weighs). A step of one micro-batch
    gives every router and the embedding transformers' gradients under the default form, also where a
    row ends in pads (transformers' attention mask leaves them out of the loss; ours, the pad id);
    megatron-core's per-layer loss, the control, gives the routers others (the two layers route
    differently)."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from qwen_data_train.distributed import distributed
    from qwen_data_train.hf.checkpoint import load_hf_weights
    from qwen_data_train.hf.config import read_config, shape_from_config
    from qwen_data_train.model import build_model
    from qwen_data_train.plan import RunPlan
    from qwen_data_train.patches import megatron_core
    from qwen_data_train.step import ForwardSpec, forward_backward

    folder = hf["qwen3_moe"]
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 151_643, (2, 48), generator=generator)
    pad, real = 151_654, torch.ones(tokens.shape, dtype=torch.long)
    if padded:
        tokens[1, 30:], real[1, 30:] = pad, 0
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, router_aux_loss_coef=1.0,
                                                  output_router_logits=True).train()
    out = theirs(input_ids=tokens, attention_mask=real, labels=torch.where(real > 0, tokens, -100))
    assert out.aux_loss > 0
    out.loss.backward()

    shape = dataclasses.replace(shape_from_config(read_config(folder), folder), router_aux_loss_coef=1.0)
    mask = torch.cat([real[:, 1:], torch.zeros(2, 1)], 1).float()  # transformers' shift: the last position has no label
    batch = dict(tokens=tokens, labels=torch.cat([tokens[:, 1:], tokens[:, :1]], 1), loss_mask=mask,
                 position_ids=torch.arange(48).expand_as(tokens),
                 segment_ids=torch.zeros_like(tokens, dtype=torch.int32))
    with megatron_core(), distributed(1):
        mine = build_model(RunPlan.for_model(shape, attention="sdpa", initialize=False, balance=form))
        load_hf_weights(mine, folder, shape)
        mine.train()
        spec = ForwardSpec("sdpa", torch.device("cpu"), autocast=False, cross_entropy="megatron", seq_length=48,
                           pad=pad)
        total = forward_backward(mine, [batch], [mask], 1 / mask.sum(), spec)
    assert total[0] / total[1] == pytest.approx(out.loss.item() - out.aux_loss.item(), rel=1e-5)  # the cross-entropy

    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    routers = [rel(mine.decoder.layers[i].mlp.router.weight.grad, theirs.model.layers[i].mlp.gate.weight.grad)
               for i in range(2)]
    embedding = rel(mine.embedding.word_embeddings.weight.grad, theirs.model.embed_tokens.weight.grad)
    if form == "transformers":
        assert max(routers) < 1e-5 and embedding < 1e-5, (routers, embedding)
    else:
        assert min(routers) > 1e-2, routers
