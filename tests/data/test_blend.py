"""`qwen-data blend` on prefixes written by the real `qwen-data pretrain` / `sft` CLIs."""

import json
import math
import os
import random
import subprocess
import sys

import pytest
from _helpers import chats, copy_prefix, corpus, manifest, pretrain, sft, words, write_jsonl

from qwen_data.blend.files import BlendError, load_source, read_blend
from qwen_data.blend.weights import parse_split, weighed_blend
from qwen_data.cli import main


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    d = tmp_path_factory.mktemp("blend")
    web = pretrain([corpus(d / "web.jsonl", 1, 40, 60)], d / "web")
    code = pretrain([corpus(d / "code.jsonl", 2, 12, 30)], d / "code")
    chat_in = chats(d / "chats.jsonl", 3, 30, 40)
    chat = sft([chat_in], d / "chat", "--seq-length", "256", "--pack")
    tools = sft([chats(d / "tools.jsonl", 4, 20, 15)], d / "tools")
    return {"dir": str(d), "web": web, "code": code, "chat": chat, "tools": tools}


def blend(*args):
    return main(["blend", *map(str, args)])


def real_tokens(prefix):
    m = manifest(prefix)
    return m["tokens"] - (m.get("sft") or {}).get("pad_tokens", 0)


def test_ratio_blend_files(prefixes, tmp_path):
    out = tmp_path / "pretrain_blend.json"
    assert blend(f"{prefixes['web']}=0.7", f"{prefixes['code']}=0.3", "--valid", prefixes["code"],
                 "-o", out) == 0
    per_split = json.loads(out.read_text())
    # Megatron-LM's get_blend_and_blend_per_split indexes all three keys; lists of strings.
    assert per_split == {"train": ["0.7", prefixes["web"], "0.3", prefixes["code"]],
                         "valid": [prefixes["code"]], "test": None}
    assert (tmp_path / "pretrain_blend.txt").read_text().split() == ["0.7", prefixes["web"], "0.3", prefixes["code"]]
    record = json.loads((tmp_path / "pretrain_blend.qwen-data.json").read_text())
    assert record["kind"] == "pretrain" and record["eod_id"] == 151643 and record["pad_id"] == 151654
    train = record["splits"]["train"]
    assert [e["fingerprint"] for e in train] == [manifest(prefixes[k])["fingerprint"] for k in ("web", "code")]
    assert record["tokenizer"]["sha256"] == manifest(prefixes["web"])["tokenizer"]["sha256"]
    assert record["megatron_args"] == ["--per-split-data-args-path", str(out)]


def test_by_tokens_and_temperature(prefixes, tmp_path):
    web, code = real_tokens(prefixes["web"]), real_tokens(prefixes["code"])
    b = weighed_blend([prefixes["web"], prefixes["code"]])  # no weights: by tokens
    assert b.by == "tokens"
    assert [e.weight for e in b.splits["train"]] == pytest.approx([web / (web + code), code / (web + code)])
    for t in (0.5, 2.0, 5.0):
        b = weighed_blend([prefixes["web"], prefixes["code"]], temperature=t)
        raw = [web ** (1 / t), code ** (1 / t)]
        assert [e.weight for e in b.splits["train"]] == pytest.approx([r / sum(raw) for r in raw])
    hot = weighed_blend([prefixes["web"], prefixes["code"]], temperature=1000.0)
    assert [e.weight for e in hot.splits["train"]] == pytest.approx([0.5, 0.5], abs=1e-3)


def test_sft_weights_are_per_sample(prefixes):
    """Ratios are token shares; Megatron weighs samples: convert by each source's tokens per sample."""
    chat, tools = manifest(prefixes["chat"]), manifest(prefixes["tools"])
    per_sample = [real_tokens(prefixes["chat"]) / chat["documents"], real_tokens(prefixes["tools"]) / tools["documents"]]
    assert per_sample[0] > 2 * per_sample[1]  # packed rows against short single chats: a real difference
    b = weighed_blend([f"{prefixes['chat']}=0.7", f"{prefixes['tools']}=0.3"])
    weights = [e.weight for e in b.splits["train"]]
    raw = [0.7 / per_sample[0], 0.3 / per_sample[1]]
    assert weights == pytest.approx([r / sum(raw) for r in raw])
    # Drawing samples by these weights gives the asked token shares.
    tokens = [w * t for w, t in zip(weights, per_sample)]
    assert [t / sum(tokens) for t in tokens] == pytest.approx([0.7, 0.3])
    # By tokens: every source consumed at the same rate, i.e. samples in proportion to documents.
    b = weighed_blend([prefixes["chat"], prefixes["tools"]], by="tokens")
    docs = [chat["documents"], tools["documents"]]
    assert [e.weight for e in b.splits["train"]] == pytest.approx([d / sum(docs) for d in docs])
    # Unless the ratios are meant as samples.
    b = weighed_blend([f"{prefixes['chat']}=0.7", f"{prefixes['tools']}=0.3"], ratio_unit="samples")
    assert [e.weight for e in b.splits["train"]] == pytest.approx([0.7, 0.3])


def test_split_mode(prefixes, tmp_path):
    out = tmp_path / "b.json"
    assert blend(prefixes["web"], prefixes["code"], "-o", out) == 0  # an earlier blend's per-split file
    assert blend(prefixes["web"], prefixes["code"], "--split", "98,2,0", "-o", out) == 0
    assert not out.exists()  # a per-split file cannot carry a split: a stale one would drop it
    record = read_blend(str(out))
    assert record.split == "98,2,0" and not record.per_split
    assert record.splits["train"][0] == [prefixes["web"], prefixes["code"]]
    txt = read_blend(str(tmp_path / "b.txt"))
    # Megatron reads the split of NAME.txt from its command line; ours keeps the one the blend was made with
    assert txt.splits["train"] == record.splits["train"] and txt.split == "98,2,0"


def test_absolute_and_file_names(prefixes, tmp_path, monkeypatch):
    monkeypatch.chdir(prefixes["dir"])
    assert blend("web.bin", "code", "-o", tmp_path / "rel.json") == 0
    assert json.loads((tmp_path / "rel.json").read_text())["train"][1::2] == ["web", "code"]
    assert blend("web", "code", "--absolute", "-o", tmp_path / "abs.json") == 0
    assert json.loads((tmp_path / "abs.json").read_text())["train"][1::2] == [prefixes["web"], prefixes["code"]]


def test_budget(prefixes, capsys, tmp_path):
    assert blend(f"{prefixes['web']}=0.75", f"{prefixes['code']}=0.25", "-o", tmp_path / "b.json",
                 "--train-iters", 10, "--global-batch-size", 4, "--seq-length", 64) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(prefixes["dir"])}
    for key, share in (("web", 0.75), ("code", 0.25)):
        row = lines[prefixes[key]]
        samples, used, epochs = float(row[-3].replace(",", "")), float(row[-2].replace(",", "")), float(row[-1])
        assert samples == pytest.approx(40 * share, abs=0.5)
        assert used == pytest.approx(40 * share * 64, abs=0.5)
        assert epochs == pytest.approx(40 * share * 64 / real_tokens(prefixes[key]), abs=1e-3)
    assert f"note: {prefixes['web']} is repeated" in out or 40 * 0.75 * 64 <= real_tokens(prefixes["web"])


def test_split_budget_counts_only_the_train_part(prefixes, capsys, tmp_path):
    assert blend(prefixes["chat"], "--split", "90,10", "-o", tmp_path / "b.json", "--train-samples", 7) == 0
    row = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(prefixes["chat"])][-1]
    assert float(row[-1]) == pytest.approx(7 / (manifest(prefixes["chat"])["documents"] * parse_split("90,10")[0]), abs=1e-3)


def refusal(capsys, *args):
    assert blend(*args) == 2
    return capsys.readouterr().err


@pytest.mark.corrupts_outputs
def test_refuses_disagreeing_manifests(prefixes, tmp_path, capsys):
    d = str(tmp_path)
    other_pad = copy_prefix(prefixes["code"], d + "/pad", lambda m: m.update(pad_id=151655))
    err = refusal(capsys, prefixes["web"], other_pad, "-o", d + "/b.json")
    assert "pad id" in err and prefixes["web"] in err and other_pad in err
    other_tok = copy_prefix(prefixes["code"], d + "/tok", lambda m: m["tokenizer"].update(sha256="0" * 64))
    err = refusal(capsys, prefixes["web"], prefixes["code"], other_tok, "-o", d + "/b.json")
    assert "tokenizer sha256" in err and other_tok in err and f"({prefixes['web']}, {prefixes['code']})" in err
    assert "kind" in refusal(capsys, prefixes["web"], prefixes["chat"], "-o", d + "/b.json")
    other_eod = copy_prefix(prefixes["code"], d + "/eod", lambda m: m.update(eod_id=151645))
    assert "eod id" in refusal(capsys, prefixes["web"], "--valid", other_eod, "-o", d + "/b.json")
    qwen3 = copy_prefix(prefixes["tools"], d + "/q3", lambda m: m["sft"].update(template="qwen3"))
    err = refusal(capsys, prefixes["chat"], qwen3, "-o", d + "/b.json")
    assert "chat template" in err and qwen3 in err
    assert not os.path.exists(d + "/b.json") and not os.path.exists(d + "/b.txt")


@pytest.mark.corrupts_outputs
def test_refuses_missing_or_changed_files(prefixes, tmp_path, capsys):
    d = str(tmp_path)
    no_mask = copy_prefix(prefixes["tools"], d + "/nomask")
    os.remove(no_mask + ".lossmask.idx")
    assert "missing" in refusal(capsys, no_mask, "-o", d + "/b.json")
    cut = copy_prefix(prefixes["web"], d + "/cut")
    with open(cut + ".bin", "r+b") as f:
        f.truncate(os.path.getsize(cut + ".bin") - 4)
    assert "changed after" in refusal(capsys, cut, "-o", d + "/b.json")
    assert "no manifest" in refusal(capsys, d + "/nothing", "-o", d + "/b.json")


def test_refuses_bad_arguments(prefixes, tmp_path, capsys):
    o = ["-o", str(tmp_path / "b.json")]
    assert "exclude" in refusal(capsys, prefixes["web"], "--split", "98,2,0", "--valid", prefixes["code"], *o)
    assert "needs a weight" in refusal(capsys, f"{prefixes['web']}=1", prefixes["code"], *o)
    assert "exclude" in refusal(capsys, f"{prefixes['web']}=1", f"{prefixes['code']}=2", "--by", "tokens", *o)
    assert "given twice" in refusal(capsys, prefixes["web"], prefixes["web"], *o)
    assert "positive" in refusal(capsys, f"{prefixes['web']}=0", f"{prefixes['code']}=1", *o)
    # A blend named like a source would replace (or, cut by a split, remove) its manifest.
    for args in ([], ["--split", "98,2,0"]):
        err = refusal(capsys, prefixes["web"], *args, "-o", prefixes["web"] + ".json")
        assert f"over the input {prefixes['web']}.json" in err and os.path.isfile(prefixes["web"] + ".json")
    with pytest.raises(BlendError, match="whitespace"):
        weighed_blend(["a b"])


def test_command_line_entry_point(prefixes, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-m", "qwen_data.cli", "blend", prefixes["web"], "-o", str(tmp_path / "m.json")],
                         cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "m.json").read_text())["train"] == [prefixes["web"]]
    assert math.isclose(json.loads((tmp_path / "m.qwen-data.json").read_text())["splits"]["train"][0]["weight"], 1.0)


@pytest.mark.parametrize("weights, says", [
    (("1e400", "1"), "web=1e400: a weight must be a positive number below 1.8e+308"),
    (("inf", "1"), "web=inf: a weight must be a positive number"),
    (("nan", "1"), "web=nan: a weight must be a positive number"),
    (("-1", "1"), "web=-1: a weight must be a positive number"),
    (("1e-300", "1e300"), "train: web=1e-300 beside a weight of 1e+300 gives web a Megatron weight of 0, below 2.23e-308"),
    (("1e-320", "1"), "gives web a Megatron weight of 1e-320, below 2.23e-308"),
])
def test_weights_out_of_float_range_are_refused_by_name(prefixes, tmp_path, capsys, weights, says):
    args = [f"{prefixes['web']}={weights[0]}", f"{prefixes['code']}={weights[1]}", "-o", tmp_path / "b.json"]
    assert says.replace("web", prefixes["web"]) in refusal(capsys, *args)
    assert not os.path.exists(tmp_path / "b.json")


@pytest.mark.parametrize("temperature, says", [
    ("1e400", "--temperature inf: must be a positive number"), ("nan", "--temperature nan: must be a positive number"),
    ("1e-308", "train: --temperature 1e-308 gives {code} a Megatron weight of 0"),
])
def test_temperatures_out_of_float_range_are_refused_by_name(prefixes, tmp_path, capsys, temperature, says):
    err = refusal(capsys, prefixes["web"], prefixes["code"], "--temperature", temperature, "-o", tmp_path / "b.json")
    assert says.format(code=prefixes["code"]) in err, err


def test_huge_and_tiny_weights_keep_their_ratio_for_megatron(prefixes, tmp_path):
    """Weights near the float range's ends are scaled, never overflowed; a tiny share is written with its
    digits, and megatron-core's own blend reading and builder give that source its nonzero weight."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list
    from qwen_data_train import data

    huge = weighed_blend([f"{prefixes['web']}=1e308", f"{prefixes['code']}=1.7e308"])
    assert [e.weight for e in huge.splits["train"]] == pytest.approx([1 / 2.7, 1.7 / 2.7])
    out = tmp_path / "b.json"
    assert blend(f"{prefixes['web']}=1e-15", f"{prefixes['code']}=1", "-o", out) == 0
    assert json.loads(out.read_text())["train"] == ["1e-15", prefixes["web"], "1.0", prefixes["code"]]
    per_split = [get_blend_from_list(json.loads(out.read_text())[name]) for name in ("train", "valid", "test")]
    tokenizer = data.ManifestTokenizer([load_source(p) for p in (prefixes["web"], prefixes["code"])])
    config = GPTDatasetConfig(random_seed=1, sequence_length=16, blend_per_split=per_split, tokenizer=tokenizer,
                              reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                              path_to_cache=None)
    train, _, _ = BlendedMegatronDatasetBuilder(data.GPTDataset, [30, 0, 0], lambda: True, config).build()
    assert train.weights[0] == pytest.approx(1e-15, rel=1e-9) and train.weights[1] == pytest.approx(1.0)


@pytest.mark.parametrize("split", ["98,-2,0", "-1,2", "1e3,1", "9,1,0,0", "1.2.3", "98;2", "9" * 400 + ",1"],
                         ids=lambda split: split[:10])
def test_splits_megatron_would_misread_are_refused(prefixes, tmp_path, capsys, split):
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    assert f"--split {split!r}: " in refusal(capsys, prefixes["web"], f"--split={split}", "-o", tmp_path / "b.json")
    if split == "98,-2,0":  # why: Megatron drops the sign and would cut 2% for validation
        assert parse_and_normalize_split(split) == pytest.approx([0.98, 0.02, 0.0])


@pytest.mark.parametrize("split", ["98,2,0", "99,1", "1", ".5,.5", "969,30,1", "0.9,0.1,0", "98, 2"])
def test_splits_read_as_megatron_reads_them(split):
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    assert parse_split(split) == pytest.approx(parse_and_normalize_split(split), abs=0)


# ---------------------------------------------------------------------------------------------
# Shares of trained tokens (--ratio-unit trained-tokens)


def prompt_heavy_and_answer_heavy(d):
    """Two SFT prefixes whose samples train very different parts of themselves: long prompts with short
    answers, and short prompts with long answers (lengths varied within each)."""
    rng = random.Random(5)

    def records(prompt, answer):
        return [{"instruction": words(rng, rng.randint(*prompt)), "input": "", "output": words(rng, rng.randint(*answer))}
                for _ in range(23)]

    asks = sft([write_jsonl(d / "asks.jsonl", records((40, 70), (2, 6)))], d / "asks", "--seq-length", 256)
    answers = sft([write_jsonl(d / "answers.jsonl", records((2, 6), (30, 60)))], d / "answers", "--seq-length", 256)
    return asks, answers


@pytest.fixture(scope="module")
def trained_pair(tmp_path_factory):
    return prompt_heavy_and_answer_heavy(tmp_path_factory.mktemp("trained"))


def trained_per_sample(prefix):
    m = manifest(prefix)
    return m["sft"]["trained_tokens"] / m["documents"]


def test_trained_token_weights(trained_pair, prefixes):
    """Weights = share / trained tokens per sample; by counts, every source is consumed at the same rate;
    pretraining trains every token, so there the unit is `tokens`."""
    asks, answers = trained_pair
    per_sample = [trained_per_sample(asks), trained_per_sample(answers)]
    tokens_per_sample = [real_tokens(p) / manifest(p)["documents"] for p in trained_pair]
    fractions = [t / n for t, n in zip(per_sample, tokens_per_sample)]
    assert fractions[1] > 4 * fractions[0]  # the prompts' parts really differ
    b = weighed_blend([f"{asks}=0.7", f"{answers}=0.3"], ratio_unit="trained-tokens")
    raw = [0.7 / per_sample[0], 0.3 / per_sample[1]]
    assert [e.weight for e in b.splits["train"]] == pytest.approx([r / sum(raw) for r in raw])
    assert b.drawn_shares("train", "trained-tokens") == pytest.approx([0.7, 0.3])
    tokens = weighed_blend([f"{asks}=0.7", f"{answers}=0.3"])  # shares of tokens: the trained shares are far off
    assert tokens.drawn_shares("train", "trained-tokens")[0] < 0.4
    docs = [manifest(p)["documents"] for p in trained_pair]
    for by in ("tokens", None):
        b = weighed_blend([asks, answers], by=by, ratio_unit="trained-tokens")
        assert [e.weight for e in b.splits["train"]] == pytest.approx([d / sum(docs) for d in docs])
    trained = [manifest(p)["sft"]["trained_tokens"] for p in trained_pair]
    b = weighed_blend([asks, answers], temperature=3.0, ratio_unit="trained-tokens")
    assert [e.share for e in b.splits["train"]] == pytest.approx([t ** (1 / 3) / sum(x ** (1 / 3) for x in trained)
                                                                  for t in trained])
    pretraining = [f"{prefixes['web']}=0.7", f"{prefixes['code']}=0.3"], [prefixes["web"], prefixes["code"]]
    for train in pretraining:
        for temperature in (None, 2.0):
            if temperature and "=" in train[0]:
                continue
            same = [weighed_blend(train, temperature=temperature, ratio_unit=unit).splits["train"]
                    for unit in ("tokens", "trained-tokens")]
            assert [(e.weight, e.share) for e in same[0]] == [(e.weight, e.share) for e in same[1]]


def test_trained_token_blend_files_stats_and_help(trained_pair, tmp_path, capsys):
    asks, answers = trained_pair
    out = tmp_path / "b.json"
    assert blend(f"{asks}=0.7", f"{answers}=0.3", "--ratio-unit", "trained-tokens", "-o", out) == 0
    assert "trained 70.00%" in capsys.readouterr().out
    record = json.loads((tmp_path / "b.qwen-data.json").read_text())
    assert record["weighting"]["ratio_unit"] == "trained-tokens"
    train = record["splits"]["train"]
    assert [e["trained_share"] for e in train] == pytest.approx([0.7, 0.3])
    assert [e["trained_tokens"] for e in train] == [manifest(p)["sft"]["trained_tokens"] for p in trained_pair]
    read = read_blend(str(out))
    assert read.ratio_unit == "trained-tokens" and read.asked == pytest.approx({asks: 0.7, answers: 0.3})

    from qwen_data.tools.stats import blend_stats

    stats = blend_stats(str(out))
    assert stats.asked == pytest.approx([0.7, 0.3]) and stats.trained_shares == pytest.approx([0.7, 0.3])
    assert stats.sources[0][1] > 0.85  # the token share that takes: the prompt-heavy source's tokens dominate
    assert main(["stats", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "asked in shares of trained-tokens" in lines[0]
    row = next(line.split() for line in lines if line.strip().startswith(asks + " "))
    assert row[2:5] == ["70.00%", f"{100 * stats.sources[0][1]:.2f}%", "70.00%"]  # asked, tokens%, trained%
    assert blend(f"{asks}=0.7", f"{answers}=0.3", "-o", tmp_path / "t.json") == 0
    tokens = blend_stats(str(tmp_path / "t.json"))
    assert tokens.ratio_unit == "tokens" and tokens.asked == pytest.approx([0.7, 0.3])
    assert tokens.sources[0][1] == pytest.approx(0.7) and tokens.trained_shares[0] < 0.4  # realised ≠ asked

    try:
        main(["blend", "--help"])
    except SystemExit:
        pass
    assert "{tokens,trained-tokens,samples}" in capsys.readouterr().out


@pytest.mark.corrupts_outputs
def test_trained_token_blend_refuses_a_source_with_nothing_trained(trained_pair, tmp_path, capsys):
    untrained = copy_prefix(trained_pair[0], str(tmp_path / "untrained"), lambda m: m["sft"].update(trained_tokens=0))
    err = refusal(capsys, f"{untrained}=1", f"{trained_pair[1]}=1", "--ratio-unit", "trained-tokens",
                  "-o", tmp_path / "b.json")
    assert f"{untrained}: its manifest counts no trained tokens" in err


@pytest.mark.slow  # megatron-core datasets over real prefixes: the slow tier
def test_trained_token_blend_realises_its_shares_in_megatron(trained_pair, tmp_path):
    """Over megatron-core's blend (BlendedMegatronDatasetBuilder, our SFTDataset's loss masks), the trained
    tokens drawn from each source follow the asked shares within 1% with --ratio-unit trained-tokens, and
    miss them with --ratio-unit tokens; each unit's drawn shares are what `stats` reports."""
    from qwen_data_train import data

    from qwen_data.tools.stats import blend_stats

    asks, answers = trained_pair
    measured = {}
    for unit in ("trained-tokens", "tokens"):
        out = tmp_path / f"{unit}.json"
        assert blend(f"{asks}=0.7", f"{answers}=0.3", "--ratio-unit", unit, "-o", out) == 0
        train, _, _ = data.build_datasets(str(out), 256, 4600, seed=3)
        trained = [0.0, 0.0]
        for i in range(len(train)):
            sample = train[i]
            trained[int(sample["dataset_id"])] += float(sample["loss_mask"].sum())
        measured[unit] = [t / sum(trained) for t in trained]
        assert measured[unit] == pytest.approx(blend_stats(str(out)).trained_shares, abs=0.01)
    print("realised shares of trained tokens:", measured)
    assert measured["trained-tokens"] == pytest.approx([0.7, 0.3], abs=0.01)
    assert abs(measured["tokens"][0] - 0.7) > 0.3
