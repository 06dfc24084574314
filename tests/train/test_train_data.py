"""train/data.py: megatron-core datasets over prefixes written by the real qwen-data CLIs.

Expected samples are computed here from the raw .bin/.idx bytes (own parser), independently of
megatron-core's reader and of train/data.py.
"""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from _helpers import chats, copy_prefix, corpus, edit_value, manifest, pretrain, refingerprint, sft
from _train import docs_of, raw_documents, stream_check

from qwen_data.blend.build import BlendError
from qwen_data.blend.files import load_source
from qwen_data.cli import main
from qwen_data.formats.layouts import PaiRows

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

pytest.importorskip("megatron.core")
from qwen_data_train import data  # noqa: E402  (imports megatron-core, ~8 s, once for the module)

PAD, EOD = 151654, 151643


def expected_sft(tokens_seqs, mask_seqs, s):
    """The sample one SFT document must give, written out token by token."""
    toks, mask, seg = [], [], []
    for k, (t, m) in enumerate(zip(tokens_seqs, mask_seqs)):
        toks += t.tolist()
        mask += m.tolist()
        seg += [k] * len(t)
    toks, mask, seg = toks[: s + 1], mask[: s + 1], seg[: s + 1]
    while len(toks) < s + 1:
        toks.append(PAD)
        mask.append(0)
        seg.append(-1)  # reader padding
    loss = [1.0 if mask[i + 1] and seg[i + 1] == seg[i] and seg[i + 1] != -1 else 0.0 for i in range(s)]
    positions, starts = [], []
    for i in range(s):
        if i == 0 or seg[i] != seg[i - 1]:
            starts.append(i)
            position = 0
        positions.append(position)
        position += 1
    return {"tokens": toks[:s], "labels": toks[1:], "loss_mask": loss, "position_ids": positions,
            "starts": starts, "same_segment": [seg[i] == seg[i + 1] for i in range(s - 1)]}


def check_sft_epoch(dataset, prefix, s):
    """Every sample is one document exactly as the files say; each document once per epoch."""
    tokens_docs, mask_docs = raw_documents(prefix), raw_documents(prefix + ".lossmask")
    expected = [expected_sft(t, m, s) for t, m in zip(tokens_docs, mask_docs)]
    by_tokens = {}
    for i, e in enumerate(expected):
        by_tokens.setdefault(tuple(e["tokens"]), []).append(i)
    seen = []
    trained = 0.0
    for i in range(len(dataset)):
        sample = dataset[i]
        candidates = by_tokens[tuple(sample["tokens"].tolist())]
        e = expected[candidates[0]]
        seen.append(candidates[0] if len(candidates) == 1 else tuple(candidates))
        assert sample["labels"].tolist() == e["labels"]
        assert sample["loss_mask"].tolist() == e["loss_mask"]
        assert sample["position_ids"].tolist() == e["position_ids"]
        seg = sample["segment_ids"]
        assert (seg[1:] == seg[:-1]).tolist() == e["same_segment"]
        cu = sample["cu_seqlens"].tolist()
        assert cu[: len(e["starts"])] == e["starts"] and set(cu[len(e["starts"]):]) == {s}
        assert int(sample["max_seqlen"]) == max(np.diff(e["starts"] + [s]))
        assert sample["tokens"].dtype == torch.int64 and sample["loss_mask"].dtype == torch.float32
        trained += float(sample["loss_mask"].sum())
    return seen, trained, sum(int(m.sum()) for doc in mask_docs for m in doc)


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_data")
    chat_in = chats(d / "chats.jsonl", 11, 40, 30)
    return {
        "dir": str(d),
        "web": pretrain([corpus(d / "web.jsonl", 5, 60, 80)], d / "web"),
        "code": pretrain([corpus(d / "code.jsonl", 6, 20, 40)], d / "code"),
        "packed": sft([chat_in], d / "packed", "--seq-length", "128", "--pack"),
        "unpacked": sft([chat_in], d / "unpacked"),
    }


@pytest.mark.parametrize("kind", ["packed", "unpacked"])
def test_sft_samples_equal_the_files(prefixes, kind):
    prefix = prefixes[kind]
    lengths = [sum(len(s) for s in doc) for doc in raw_documents(prefix)]
    s = 128 if kind == "packed" else max(lengths) - 1  # the longest document: last token label-only
    train, valid, test = data.build_datasets({"train": [prefix], "valid": None, "test": None}, s, None)
    assert isinstance(train, data.SFTDataset) and valid is None and test is None
    seen, trained, targets = check_sft_epoch(train, prefix, s)
    assert sorted(seen) == list(range(len(lengths)))  # one epoch: every document once
    assert trained == targets > 0  # no trained target lost or counted twice
    if kind == "packed":  # the fixture does have rows ending in a pad sequence
        assert any((doc[-1] == PAD).all() for doc in raw_documents(prefix))


def write_sft_prefix(prefix, documents, like):
    """An SFT prefix from [(tokens, mask, sequence lengths)], with `like`'s manifest fields."""
    from qwen_data.formats.indexed import IndexedDatasetWriter
    from qwen_data.formats.manifest import fingerprinted

    ids = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", np.int32)
    mask = IndexedDatasetWriter(prefix + ".lossmask.bin", prefix + ".lossmask.idx", np.uint8)
    for tokens, m, lengths in documents:
        ids.add_document(tokens, lengths)
        mask.add_document(m, lengths)
    ids.finalize()
    mask.finalize()
    m = manifest(like)
    m.update(documents=ids.documents, sequences=ids.sequences, tokens=ids.tokens,
             **fingerprinted([ids.digests, mask.digests]))
    m["sft"].update(pad_tokens=0)
    with open(prefix + ".json", "w") as f:
        json.dump(m, f)
    return prefix


@pytest.mark.corrupts_outputs
def test_sft_never_trains_across_sequences(prefixes, tmp_path):
    """Targets at a sequence's first token (never written by qwen-data sft, but possible in the
    format) are not trained: predicting them would cross into another sample."""
    docs = [([1, 2, 3, 4, 5, 6, PAD, PAD], [1, 1, 1, 1, 1, 1, 0, 0], [3, 3, 2]),
            ([7, 8, 9], [0, 1, 1], [3]),
            ([10, 11, 12, 13, 14], [1, 1, 1, 1, 1], [1, 1, 3])]
    prefix = write_sft_prefix(str(tmp_path / "synthetic"), docs, prefixes["packed"])
    train, _, _ = data.build_datasets({"train": [prefix], "valid": None, "test": None}, 8, None)
    seen, trained, _ = check_sft_epoch(train, prefix, 8)
    assert sorted(seen) == [0, 1, 2]
    # doc 0: targets 2,3 | 5,6 (not 4: it starts the second sequence); doc 1: 8, 9; doc 2: 13, 14
    assert trained == 2 + 2 + 2 + 2


def test_sft_overlong(prefixes):
    prefix = prefixes["unpacked"]
    longest = max(sum(len(s) for s in doc) for doc in raw_documents(prefix))
    with pytest.raises(ValueError, match="exceed seq_length") as err:
        data.build_datasets([prefix], longest - 2, 4, 1, 1, split="80,10,10")
    # options that exist: the train stage's, and sft's
    assert f"train with --seq-length {longest - 1} or more" in str(err.value)
    assert f"`qwen-data sft --seq-length {longest - 2}` (--overlong" in str(err.value)
    blend = {"train": [prefix], "valid": None, "test": None}
    with pytest.warns(UserWarning, match="truncated"):
        train, _, _ = data.build_datasets(blend, longest - 2, None, overlong="truncate")
    seen, trained, targets = check_sft_epoch(train, prefix, longest - 2)
    assert trained < targets  # the cut document lost its final target(s)


def test_sft_epochs_splits_and_loader(prefixes, tmp_path):
    prefix = prefixes["unpacked"]
    documents = manifest(prefix)["documents"]
    train, valid, test = data.build_datasets([prefix], 256, 3 * documents, 2, None, split="90,10,0",
                                             cache_dir=str(tmp_path))
    n_train = round(0.9 * documents)
    assert len(train) == 4 * n_train and len(valid) == documents - n_train and test is None
    order = [int(i) for i in train.sample_index]
    for epoch in range(4):  # every epoch a permutation of the train documents
        assert sorted(order[epoch * n_train:(epoch + 1) * n_train]) == list(range(n_train))
    assert set(int(i) for i in valid.sample_index) == set(range(n_train, documents))
    again, _, _ = data.build_datasets([prefix], 256, 3 * documents, 2, None, split="90,10,0", cache_dir=str(tmp_path))
    assert [int(i) for i in again.sample_index] == order  # from the cache, same order
    batch = next(iter(torch.utils.data.DataLoader(train, batch_size=4, num_workers=1)))
    assert batch["tokens"].shape == (4, 256) and batch["cu_seqlens"].shape == (4, 257)
    padding = train[None]
    assert padding["loss_mask"].sum() == 0


@pytest.mark.parametrize("mbs,accumulation,dp", [(1, 4, 1), (2, 3, 2), (1, 2, 4)])
def test_each_rank_reads_megatrons_sample_order_a_step_at_a_time(mbs, accumulation, dp):
    from qwen_data_train.loader import StepBatches

    global_batch, steps, consumed = mbs * accumulation * dp, 3, 2 * mbs * accumulation * dp
    total = consumed + steps * global_batch + mbs  # a partial step at the end is not read
    for rank in range(dp):
        # Megatron-LM's pretraining sampler: runs of mbs × dp samples, rank r takes [r·mbs, (r+1)·mbs)
        runs = range(consumed, consumed + steps * global_batch, mbs * dp)
        micro = [list(range(run + rank * mbs, run + (rank + 1) * mbs)) for run in runs]
        sampler = StepBatches(total, consumed, mbs, accumulation, rank, dp)
        assert len(sampler) == steps
        assert list(sampler) == [sum(micro[s * accumulation:(s + 1) * accumulation], []) for s in range(steps)]


def test_sft_weighted_blend(prefixes, tmp_path):
    out = tmp_path / "sft_blend.json"
    assert main(["blend", f"{prefixes['packed']}=0.5", f"{prefixes['unpacked']}=0.5", "--split", "90,10,0",
                 "-o", str(out)]) == 0
    train, valid, _ = data.build_datasets(str(out), 256, 50, 5, None, cache_dir=str(tmp_path / "cache"))
    assert type(train).__name__ == "BlendedDataset" and len(train) >= 50
    ids = {int(train[i]["dataset_id"]) for i in range(len(train))}
    assert ids == {0, 1}
    record = json.loads((tmp_path / "sft_blend.qwen-data.json").read_text())
    assert train.weights == pytest.approx([e["weight"] for e in record["splits"]["train"]])


def test_pretrain_weighted_blend(prefixes, tmp_path):
    out = tmp_path / "pretrain_blend.json"
    assert main(["blend", f"{prefixes['web']}=0.7", f"{prefixes['code']}=0.3", "--split", "90,10,0",
                 "-o", str(out)]) == 0
    train, valid, test = data.build_datasets(str(out), 32, 200, 20, None, seed=7,
                                             cache_dir=str(tmp_path / "cache"))
    assert type(train).__name__ == "BlendedDataset" and len(train) >= 200 and len(valid) >= 20 and test is None
    assert [type(d).__name__ for d in train.datasets] == ["PretrainDataset"] * 2
    assert isinstance(train.datasets[0], data.GPTDataset)
    sources = [docs_of(prefixes["web"]), docs_of(prefixes["code"])]
    counts = np.zeros(2)
    for i in range(len(train)):
        sample = train[i]
        counts[int(sample["dataset_id"])] += 1
        stream_check(sample, sources[int(sample["dataset_id"])])
        assert sample["tokens"][1:].tolist() == sample["labels"][:-1].tolist()
        # pad (151654) is not eod: a real end of document stays a trained label
        assert sample["loss_mask"].tolist() == [1.0] * 32
        assert sample["segment_ids"].tolist() == [0] * 32  # no reset_attention_mask: one segment
    assert counts[0] / counts.sum() == pytest.approx(0.7, abs=0.01)
    assert train.datasets[0].config.tokenizer.pad == PAD


def test_pretrain_document_boundaries(prefixes):
    train, _, _ = data.build_datasets({"train": [prefixes["web"]], "valid": None, "test": None}, 64, 30,
                                      reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True)
    eods = 0
    for i in range(len(train)):
        sample = train[i]
        tokens = sample["tokens"]
        after_eod = torch.cat([torch.tensor([False]), tokens[:-1] == EOD])
        expected_segments = torch.cumsum(after_eod.int(), 0)
        assert sample["segment_ids"].tolist() == expected_segments.tolist()
        starts = [0] + [j for j in range(1, 64) if after_eod[j]]
        assert sample["cu_seqlens"].tolist()[: len(starts)] == starts
        positions = [j - max(s for s in starts if s <= j) for j in range(64)]
        assert sample["position_ids"].tolist() == positions
        assert sample["loss_mask"].tolist() == (tokens != EOD).float().tolist()
        eods += int((tokens == EOD).sum())
    assert eods > 0


def test_megatron_lm_reads_our_blend_files(prefixes, tmp_path):
    """Read NAME.json / NAME.txt the way Megatron-LM's get_blend_and_blend_per_split does, then build
    stock GPTDatasets from them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    out = tmp_path / "b.json"
    assert main(["blend", f"{prefixes['web']}=2", f"{prefixes['code']}=1", "--valid", prefixes["code"],
                 "--test", prefixes["web"], prefixes["code"], "-o", str(out)]) == 0
    args = json.loads(out.read_text())
    for name in ("train", "valid", "test"):
        if isinstance(args[name], str):
            args[name] = args[name].split()
    per_split = [get_blend_from_list(args[name]) for name in ("train", "valid", "test")]
    assert per_split[0] == ([prefixes["web"], prefixes["code"]], pytest.approx([2 / 3, 1 / 3]))
    assert per_split[1] == ([prefixes["code"]], None)
    txt = get_blend_from_list(open(tmp_path / "b.txt").read().split())
    assert txt == per_split[0]
    tokenizer = data.ManifestTokenizer([load_source(p) for p in (prefixes["web"], prefixes["code"])])
    config = GPTDatasetConfig(random_seed=1, sequence_length=16, blend_per_split=per_split, tokenizer=tokenizer,
                              reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                              path_to_cache=None)
    train, valid, test = BlendedMegatronDatasetBuilder(data.GPTDataset, [30, 5, 6], lambda: True, config).build()
    assert len(train) >= 30 and len(valid) >= 5 and len(test) >= 6
    assert train.weights == pytest.approx([2 / 3, 1 / 3])


def test_rewritten_prefix_never_reuses_a_stale_cache(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    prefix = pretrain([corpus(tmp_path / "a.jsonl", 21, 30, 40)], tmp_path / "p")

    def build():
        train, _, _ = data.build_datasets([prefix], 16, 40, 4, 0, split="90,10,0", cache_dir=cache)
        return train

    old = build()
    old_samples = [old[i]["tokens"].tolist() for i in range(len(old))]
    descriptions = set(glob.glob(cache + "/*-description.txt"))
    assert build()[0]["tokens"].tolist() == old_samples[0] and set(glob.glob(cache + "/*-description.txt")) == descriptions

    pretrain([corpus(tmp_path / "b.jsonl", 22, 45, 50)], tmp_path / "p")  # same prefix, new data
    new = build()
    assert set(glob.glob(cache + "/*-description.txt")) > descriptions  # fresh indices, not the old ones
    documents = docs_of(prefix)
    for i in range(len(new)):
        stream_check(new[i], documents)
    assert [new[i]["tokens"].tolist() for i in range(len(old_samples))] != old_samples

    # The check above can fail: without the fingerprints in the tokenizer's identifiers,
    # megatron-core's key stays the same and the stale indices of the old data are reused.
    original = data.ManifestTokenizer.__init__

    def without_fingerprints(self, sources):
        original(self, sources)
        self.unique_identifiers["fingerprints"] = {}

    monkeypatch.setattr(data.ManifestTokenizer, "__init__", without_fingerprints)
    stale_cache = str(tmp_path / "stale")
    pretrain([corpus(tmp_path / "a.jsonl", 21, 30, 40)], tmp_path / "p")
    data.build_datasets([prefix], 16, 40, 4, 0, split="90,10,0", cache_dir=stale_cache)
    before = set(glob.glob(stale_cache + "/*"))
    pretrain([corpus(tmp_path / "b.jsonl", 22, 45, 50)], tmp_path / "p")
    data.build_datasets([prefix], 16, 40, 4, 0, split="90,10,0", cache_dir=stale_cache)
    assert set(glob.glob(stale_cache + "/*")) == before  # reused: what our fingerprints prevent


def test_build_datasets_refuses_mismatched_manifests(prefixes, tmp_path):
    other_pad = copy_prefix(prefixes["code"], str(tmp_path / "pad"), lambda m: m.update(pad_id=151655))
    with pytest.raises(BlendError, match="pad id") as err:
        data.build_datasets(["1", prefixes["web"], "1", other_pad], 16, 10, 1, 1, split="80,10,10")
    assert other_pad in str(err.value) and prefixes["web"] in str(err.value)
    with pytest.raises(BlendError, match="kind"):
        data.build_datasets({"train": [prefixes["web"]], "valid": [prefixes["packed"]], "test": None}, 16, 10, 1)


@pytest.mark.corrupts_outputs  # one id of a copy edited
def test_a_certificate_recording_a_mismatch_is_refused_unless_allowed(prefixes, tmp_path, capsys):
    """`verify --certify` records a recheck that found an edited id; the train stage shows each
    prefix's certificate and refuses that one before anything is built, until --allow-uncertified."""
    edited = copy_prefix(prefixes["web"], str(tmp_path / "edited"))
    ids = np.memmap(edited + ".bin", np.int32, "r+")
    ids[3] = (int(ids[3]) + 1) % 1000
    ids.flush()
    assert main(["verify", edited, "--certify", "1000"]) == 1
    with pytest.raises(ValueError, match="certificate records ids that differ") as err:
        data.build_datasets(["1", prefixes["web"], "1", edited], 16, 10, 1, 1, split="80,10,10")
    assert edited in str(err.value) and "web.jsonl:1" in str(err.value)
    train, _, _ = data.build_datasets(["1", prefixes["web"], "1", edited], 16, 10, 1, 1, split="80,10,10",
                                      allow_uncertified=True)
    lines = train.config.tokenizer.certificates
    assert lines[0].startswith(f"data {prefixes['web']}: certified, ") and "tokenizers" in lines[0]
    assert lines[1].startswith(f"data {edited}: certified") and "a mismatch" in lines[1]


@pytest.mark.corrupts_outputs  # manifests' certificates edited
def test_a_certificate_must_name_the_data_it_vouches_for(prefixes, tmp_path):
    """A certificate names its data by fingerprint: one naming other data is refused (its claim is about
    other bytes) until --allow-uncertified; one naming none is shown as such."""
    web = prefixes["web"]
    unnamed = copy_prefix(web, str(tmp_path / "unnamed"), lambda m: m["certificate"].pop("fingerprint", None))
    named = copy_prefix(web, str(tmp_path / "named"), lambda m: m["certificate"].update(fingerprint=m["fingerprint"]))
    other = copy_prefix(web, str(tmp_path / "other"), lambda m: m["certificate"].update(fingerprint="0" * 64))
    assert data.describe_certificate(load_source(unnamed)).endswith(
        "; it does not name the data it vouches for (no fingerprint in it)")
    assert "does not name" not in data.describe_certificate(load_source(named))
    data.build_datasets([named], 16, 10, 1, 1, split="80,10,10")
    with pytest.raises(ValueError, match=f"^{other}: its certificate vouches for other data .*--allow-uncertified"):
        data.build_datasets([other], 16, 10, 1, 1, split="80,10,10")
    data.build_datasets([other], 16, 10, 1, 1, split="80,10,10", allow_uncertified=True)


def _refused(args) -> str:
    """`qwen-data train ARGS`, refused: → its one line, after checking nothing was built (no line on stdout)."""
    done = subprocess.run([sys.executable, "-m", "qwen_data.cli", "train", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 2 and not done.stdout, done.stdout + done.stderr[-3000:]
    assert len(done.stderr.splitlines()) == 1, done.stderr[-3000:]
    return done.stderr


@pytest.mark.corrupts_outputs  # ids of copies edited
def test_train_checks_every_byte_before_building_anything(prefixes, tmp_path):
    """Flipped ids (the fingerprint no longer the data's) trained silently, and an id beyond the model's
    embedding ended in an IndexError's traceback: both are refused in one line naming the prefix (and the
    document), before the model is built, whatever --allow-uncertified says."""
    flipped = copy_prefix(prefixes["web"], str(tmp_path / "flipped"))
    edit_value(flipped, 7, int(np.memmap(flipped + ".bin", np.int32, "r")[7]) ^ 4)
    beyond = copy_prefix(prefixes["web"], str(tmp_path / "beyond"))
    documents = raw_documents(beyond)
    edit_value(beyond, sum(len(d[0]) for d in documents[:2]) + 1, 200_000)  # document 2's second id
    refingerprint(beyond)
    run = ["--seq-length", "16", "--train-iters", "1", "--num-workers", "0", "--split", "90,10,0",
           "--allow-uncertified"]
    said = _refused(["--data", flipped, *run])
    assert said.startswith(f"qwen-data train: error: {flipped}.json: fingerprint ") and "changed after" in said
    said = _refused(["--data", beyond, *run])
    assert said.startswith(f"qwen-data train: error: {beyond}: document 2 (counting from 0) holds id 200000, ")


@pytest.mark.corrupts_outputs  # an id of a copy edited
def test_the_data_check_runs_once_a_node_and_states_its_cost(prefixes, tmp_path, monkeypatch, capsys):
    """Local rank 0 of each node checks (a node's ranks read the same files), global rank 0 says so;
    --no-data-check skips it."""
    from qwen_data_train.config import TrainConfig
    from qwen_data_train.loader import check_inputs

    flipped = copy_prefix(prefixes["web"], str(tmp_path / "flipped"))
    edit_value(flipped, 7, int(np.memmap(flipped + ".bin", np.int32, "r")[7]) ^ 4)

    def config(prefix, check=True):
        return TrainConfig.parse(["--data", prefix, "--split", "90,10,0"] + ([] if check else ["--no-data-check"])).data

    check_inputs(config(prefixes["web"]))
    assert re.fullmatch(r"data: 1 prefix, \d+\.\d MB checked against its manifest in \d+\.\d\d s\n",
                        capsys.readouterr().out)
    check_inputs(config(flipped, check=False))
    monkeypatch.setenv("LOCAL_RANK", "1")
    check_inputs(config(flipped))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "8")  # the second node's first rank: checks, says nothing
    with pytest.raises(ValueError, match="fingerprint"):
        check_inputs(config(flipped))
    check_inputs(config(prefixes["web"]))
    assert capsys.readouterr().out == ""


@pytest.mark.corrupts_outputs
def test_what_the_train_stage_refuses_is_refused_when_made_and_by_verify(prefixes, tmp_path, capsys):
    """A pad id equal to the eod id: pretrain refuses up front naming its option, and a prefix made
    so anyway (by hand, or an older qwen-data) fails `verify` as it fails the train stage."""
    out = str(tmp_path / "vision")
    assert main(["pretrain", "--quiet", os.path.join(prefixes["dir"], "web.jsonl"), "-o", out,
                 "--eod-token", "<|vision_pad|>"]) == 2
    assert "pad id equals the eod id 151654" in capsys.readouterr().err and not glob.glob(out + "*")
    pad_is_eod = copy_prefix(prefixes["code"], str(tmp_path / "padeod"), lambda m: m.update(pad_id=EOD))
    assert main(["verify", pad_is_eod]) == 1
    said = capsys.readouterr().out
    assert f"{pad_is_eod}: pad id equals the eod id {EOD}" in said and "another --eod-token" in said
    with pytest.raises(BlendError, match="pad id equals the eod id .* another --eod-token"):
        data.build_datasets([pad_is_eod], 16, 10, 1, 1, split="80,10,10")


def test_without_evaluation_a_small_sft_prefix_needs_no_validation_part(tmp_path):
    """Evaluation off asks no validation samples; evaluation on, the refusal names options that exist."""
    from qwen_data_train.config import TrainConfig, build_parser
    from qwen_data_train.loader import build_splits

    prefix = sft([chats(tmp_path / "c.jsonl", 3, 4, 10)], tmp_path / "small")  # 969,30,1: no valid document

    def config(*extra):
        return TrainConfig.parse(["--data", prefix, "--train-iters", "3", "--seq-length", "128", *extra])

    train, valid = build_splits(config(), 1)
    assert len(train) >= 3 and valid is None
    with pytest.raises(BlendError, match="valid part .* is empty") as err:
        build_splits(config("--eval-interval", "2"), 1)
    named = set(re.findall(r"--[a-z-]+", str(err.value)))
    train_options = {o for action in build_parser()._actions for o in action.option_strings}
    assert {"--split", "--eval-interval", "--valid"} == named and "qwen-data blend --valid" in str(err.value)
    assert named - {"--valid"} <= train_options  # --valid: `qwen-data blend`'s


@pytest.mark.corrupts_outputs
def test_ids_beyond_the_models_embedding_are_refused_at_start(prefixes, tmp_path):
    """A pad id the data may hold (sft --pad-id up to 151935) that a custom model has no embedding row for."""
    import dataclasses

    from qwen_data_train.config import TrainConfig
    from qwen_data_train.distributed import distributed
    from qwen_data_train.hf.config import config_of_shape
    from qwen_data_train.loop import Trainer
    from qwen_data_train.patches import megatron_core
    from qwen_data_train.shapes import PRESETS

    high_pad = copy_prefix(prefixes["unpacked"], str(tmp_path / "high"), lambda m: m.update(pad_id=151900))
    folder = tmp_path / "model"
    folder.mkdir()
    shape = dataclasses.replace(PRESETS["tiny"], vocab_size=151_680)  # more rows than the data's 151,665 token ids
    (folder / "config.json").write_text(json.dumps(config_of_shape(shape, torch.bfloat16)))
    config = TrainConfig.parse(["--data", high_pad, "--hf-model", str(folder), "--train-iters", "1",
                                "--seq-length", "512", "--num-workers", "0"])
    with megatron_core(), distributed(1) as device:
        with pytest.raises(ValueError) as err:
            Trainer(config, device)
    message = str(err.value)
    assert all(f"{n}" in message for n in ("pad id 151900", "eod id 151643", "tokenizer's 151665", "151680 embedding rows"))
    assert "--pad-id below 151680" in message
    data.ManifestTokenizer([load_source(prefixes["unpacked"])]).check_embedding(151_680, "custom")  # fits


def test_boundary_helpers():
    from qwen_data_train.attention import document_mask
    tokens = torch.tensor([[5, EOD, 7, 8, EOD, 9], [EOD, 1, 2, 3, 4, 5]])
    segments = data.segment_ids_from_eod(tokens, EOD)
    assert segments.tolist() == [[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]]
    may_attend = document_mask(segments).dense()  # what SDPA (and, negated, megatron's local attention) gets
    assert may_attend.shape == (2, 1, 6, 6)
    for b in range(2):
        for q in range(6):
            for k in range(6):
                allowed = k <= q and segments[b, q] == segments[b, k]
                assert bool(may_attend[b, 0, q, k]) == allowed


def test_txt_blend_split_and_empty_parts(tmp_path):
    """A NAME.txt blend keeps the split it was made with, and a part of the split that holds no
    documents never hangs megatron-core: unasked it is left unbuilt, asked for it is refused."""
    from qwen_data.blend.files import read_blend

    small = [pretrain([corpus(tmp_path / f"{n}.jsonl", seed, 20, 30)], tmp_path / n)
             for n, seed in (("a", 31), ("b", 32))]
    out = tmp_path / "mix.json"
    assert main(["blend", f"{small[0]}=1", f"{small[1]}=1", "--split", "90,10,0", "-o", str(out)]) == 0
    assert read_blend(str(tmp_path / "mix.txt")).split == "90,10,0"
    # megatron-core builds parts in worker threads and its hang cannot be interrupted: a child process
    check = f"""
import pytest
from qwen_data.blend.build import BlendError
from qwen_data.blend.files import load_source
from _train import docs_of, stream_check
from qwen_data_train import data
small = {small!r}
train, valid, test = data.build_datasets({str(tmp_path / "mix.txt")!r}, 16, 20, 4, 0)
assert len(valid) >= 4 and test is None
# documents 18 and 19 of each: the blend's 90,10,0, not the default 969,30,1 (document 19 only)
assert [d.indices.tolist() for d in valid.datasets] == [[18, 19], [18, 19]]
for i in range(len(valid)):
    stream_check(valid[i], docs_of(small[int(valid[i]["dataset_id"])])[18:])
# 969,30,1 of 20 documents leaves the test part empty; no test samples are asked for
weighted = ["1", small[0], "1", small[1]]
train, valid, test = data.build_datasets(weighted, 16, 20, 4, 0, split="969,30,1")
assert len(train) >= 20 and len(valid) >= 4 and test is None
with pytest.raises(BlendError, match="test part .* is empty"):
    data.build_datasets(weighted, 16, 20, 4, 2, split="969,30,1")
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()]))
    try:
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("building datasets with an empty part of the split hangs")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_pai_layout_trains_on_the_samples_of_the_mask_layout(tmp_path, packed):
    """A pai-layout prefix gives, sample for sample, what the mask layout made with the settings
    --layout pai implies gives: its rows are decoded, end marks and shifted labels included."""
    records = chats(tmp_path / "chats.jsonl", seed=5, count=40, longest=30)
    s, extra = 96, (["--pack", "--packing", "next-fit"] if packed else [])
    rows = sft([records], tmp_path / "pai", "--layout", "pai", "--seq-length", s, *extra)
    mask = sft([records], tmp_path / "mask", "--seq-length", s, "--assistant-span", "turn", "--overlong", "truncate",
               "--input-separator", "", "--pad-id", manifest(rows)["pad_id"], *extra)
    assert manifest(rows)["sft"]["truncated"] > 0 and (not packed or manifest(rows)["sft"]["rows"] < 40)
    built = [data.build_datasets({"train": [p], "valid": None, "test": None}, s, None, shuffle_sft=False)[0]
             for p in (rows, mask)]
    assert isinstance(built[0].dataset, PaiRows) and len(built[0]) == len(built[1]) > 0
    for i in range(len(built[0])):
        a, b = built[0][i], built[1][i]
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (i, key)


def test_the_train_stage_never_writes_beside_its_data(prefixes, tmp_path, caplog):
    """Without --data-cache, every dataset kind (GPTDataset, SFTDataset, blended or not, .txt blends) builds
    its indices in memory: nothing is written beside the data (which may be read-only, and whose prefix a
    folder of the same name shadows); megatron-core's notices of that, and of one-source blends, are not
    shown. A --data-cache that is one of the run's inputs is refused."""
    import logging

    d = tmp_path / "data"
    d.mkdir()
    web, code, chat = (copy_prefix(prefixes[name], str(d / name)) for name in ("web", "code", "packed"))
    assert main(["blend", web, code, "-o", str(d / "pre.json")]) == 0
    assert main(["blend", chat, "-o", str(d / "chat.json")]) == 0
    before = sorted(os.listdir(d))
    with caplog.at_level(logging.WARNING):
        for blend, seq, split in ((web, 32, "90,10,0"), ([web, code], 32, "90,10,0"), (str(d / "pre.txt"), 32, "90,10,0"),
                                  (str(d / "pre.json"), 32, None), (str(d / "chat.json"), 128, None)):
            data.build_datasets(blend, seq, 8, 4 if split else None, 0 if split else None, split=split)
    assert sorted(os.listdir(d)) == before
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("megatron")]
    for cache in (web + ".bin", str(d / "pre.json")):
        with pytest.raises(ValueError, match="an input of this run"):
            data.build_datasets(str(d / "pre.json"), 32, 8, cache_dir=cache)
