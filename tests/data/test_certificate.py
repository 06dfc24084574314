"""The parity certificate: every pretrain and SFT manifest records a sample of records checked
against the reference libraries (HF tokenizers; for SFT the template's Jinja rendered by jinja2),
and a record whose ids differ stops the run."""

import importlib.util
import json
import os
import re

import numpy as np
import pytest
from _helpers import write_jsonl
from _oracles import oracle_dir

from qwen_data.cli import main
from qwen_data.formats.layouts import layout_of
from qwen_data.formats.manifest import Manifest
from qwen_data.certify import reference
from qwen_data.certify.checks import CertificateError
from qwen_data.text.masking import SampleEncoder
from qwen_data.text.tokenizer import QwenTokenizer, as_str

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "qwen_data", "examples")
# Literals of structural and content tokens, Unicode HF normalizes (NFC), and plain text.
TEXTS = ["hi <|im_start|> there <think>x</think> \U0001F600 cafe\u0301 <tool_call>{}</tool_call> <|fim_prefix|>a",
         " <|endoftext|>x", "\u00dcn\u00efc\u00f6d\u00e9 \uff46\uff55\uff4c\uff4c \u212b \r\n\t tabs", "plain text"]


def certificate(prefix):
    with open(f"{prefix}.json", encoding="utf-8") as f:
        return json.load(f)["certificate"]


def assert_certified(prefix, records):
    found = certificate(prefix)
    assert found["certified"] is True and found["mismatches"] == 0
    assert found["records_checked"] == records  # small runs: every record
    assert found["reference"]["tokenizers"]


@pytest.mark.parametrize("policy", ["text", "safe", "parse"])
def test_pretrain_certifies_literals_and_unicode(tmp_path, policy):
    corpus = write_jsonl(tmp_path / "lit.jsonl", [{"text": t} for t in TEXTS])
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--special-tokens", policy, "--quiet"]) == 0
    assert_certified(tmp_path / "p", len(TEXTS))


def test_bundled_examples_are_certified(tmp_path):
    assert main(["pretrain", os.path.join(EXAMPLES, "corpus.jsonl"), "-o", str(tmp_path / "p"), "--quiet"]) == 0
    assert_certified(tmp_path / "p", 30)
    assert main(["sft", os.path.join(EXAMPLES, "chats.jsonl"), "-o", str(tmp_path / "s"), "--quiet",
                 "--template", "qwen3", "--history", "split", "--assistant-span", "trl",
                 "--reference-template", str(oracle_dir() / "qwen3.jinja")]) == 0
    found = certificate(tmp_path / "s")
    assert found["certified"] and found["records_checked"] == 10 and found["masks_not_checked"] == 0
    assert set(found["reference"]) == {"jinja2", "tokenizers"} and found["template_sha256"]


def test_a_changed_id_fails_the_run_naming_the_record(tmp_path, monkeypatch, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "first"}, {"text": "second"}, {"text": "the odd one"}])
    encode_batch = QwenTokenizer.encode_batch

    def broken(self, texts, special="parse"):
        ids, lengths = encode_batch(self, texts, special)
        texts = [as_str(t) for t in texts]  # (a jsonl line's text comes as its UTF-8)
        if "the odd one" in texts:  # one id of that record changed
            ids = ids.copy()
            ids[int(np.sum(lengths[:texts.index("the odd one")]))] += 1
        return ids, lengths

    monkeypatch.setattr(QwenTokenizer, "encode_batch", broken)
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:3: its ids spell other bytes than its text" in error
    assert not [name for name in os.listdir(tmp_path) if name.startswith("p")]  # nothing left
    # --no-certify writes it, recorded as uncertified
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "1", "--quiet", "--no-certify"]) == 0
    assert certificate(tmp_path / "p") == {"certified": False, "why": certificate(tmp_path / "p")["why"]}
    assert "--no-certify" in certificate(tmp_path / "p")["why"]


def test_sft_without_jinja2_says_not_certified(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jinja2"
                        else find_spec(name, *a))
    assert main(["sft", os.path.join(EXAMPLES, "chats.jsonl"), "-o", str(tmp_path / "s"), "--quiet",
                 "--template", "qwen3", "--reference-template", str(oracle_dir() / "qwen3.jinja")]) == 0
    found = certificate(tmp_path / "s")
    assert found["certified"] is False and "jinja2 is not installed" in found["why"]


def test_merged_shards_sum_their_checks(tmp_path):
    corpus = os.path.join(EXAMPLES, "corpus.jsonl")
    for k in range(2):
        assert main(["pretrain", corpus, "-o", str(tmp_path / f"s{k}"), "--shard", f"{k}/2", "--quiet"]) == 0
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "-o", str(tmp_path / "m"), "--quiet"]) == 0
    assert main(["pretrain", corpus, "-o", str(tmp_path / "whole"), "--quiet"]) == 0
    merged = certificate(tmp_path / "m")
    assert merged["certified"] and merged["records_checked"] == certificate(tmp_path / "s0")["records_checked"] + \
        certificate(tmp_path / "s1")["records_checked"]


def test_without_the_templates_jinja_sft_says_not_certified_and_why(tmp_path):
    """The bundled tokenizer's chat template is Qwen3's older text: not qwen2p5's official Jinja."""
    assert main(["sft", os.path.join(EXAMPLES, "chats.jsonl"), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    found = certificate(tmp_path / "s")
    assert found["certified"] is False and "--reference-template" in found["why"]


def test_checks_run_beside_the_workers_and_a_mismatch_there_fails_the_run(tmp_path, monkeypatch, capsys):
    """Many chunks over two workers, the reference not loaded in this process: the checks run in a
    process of their own, and one changed id in one record's mask stops the run naming its line."""
    monkeypatch.setattr(reference, "_LOADED", {})
    chats = [json.loads(line) for line in open(os.path.join(EXAMPLES, "chats.jsonl"), encoding="utf-8")]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats * 3)
    args = ["sft", corpus, "--workers", "2", "--chunk-mb", "0.002", "--quiet", "--template", "qwen2p5",
            "--reference-template", str(oracle_dir() / "qwen2.5-instruct.jinja")]
    assert main([*args, "-o", str(tmp_path / "ok")]) == 0
    found = certificate(tmp_path / "ok")
    assert found["certified"] and found["records_checked"] > 0 and found["samples_checked"] >= found["records_checked"]
    assert not reference._LOADED  # loaded in the checking process only
    encode = SampleEncoder.encode
    odd = chats[0]["output"]  # the first record's answer: the first records are always checked

    def broken(self, samples):
        encoded = encode(self, samples)
        for k, sample in enumerate(samples):
            if odd in sample.text and not isinstance(encoded[k], Exception):
                ids, mask = encoded[k]
                mask = mask.copy()
                mask[-1] ^= 1
                encoded[k] = (ids, mask)
        return encoded

    monkeypatch.setattr(SampleEncoder, "encode", broken)
    assert main([*args, "-o", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:1:" in error and "loss mask" in error
    assert not [name for name in os.listdir(tmp_path) if name.startswith("bad")]


def _driver_run(tmp_path, monkeypatch, files: int, records: int):
    """A corpus, a local run's certificate of it (this process's reference then forgotten, as a driver's is
    never loaded), and the config, sources and inputs a Ray driver would have for it."""
    from _helpers import corpus, pretrain

    from qwen_data.inputs.files import expand
    from qwen_data.run import pipeline
    from qwen_data.steps.pretrain import PretrainConfig

    data = corpus(tmp_path / "c.jsonl", files, records, 40)
    whole = certificate(pretrain([data], tmp_path / "local"))
    monkeypatch.setattr(reference, "_LOADED", {})
    config = PretrainConfig(inputs=[data], output_prefix=str(tmp_path / "ray"), quiet=True)
    sources = expand([data])
    return whole, config, sources, pipeline.input_list(sources)


def test_records_picked_by_shards_are_checked_in_one_process_of_the_driver(tmp_path, monkeypatch):
    """What `--executor ray` does with the certificate, here without Ray: shards pick records and hand
    them over unchecked; the driver's checking process (forked, the reference loaded there only)
    certifies them as one local run does, and one changed id stops it naming the record."""
    import dataclasses

    from qwen_data.inputs.files import Shard
    from qwen_data.run import pipeline
    from qwen_data.run.ray import _DriverChecks
    from qwen_data.steps.pretrain import Tokenize

    whole, config, sources, inputs = _driver_run(tmp_path, monkeypatch, 3, 400)
    picked, spelled = [], 0
    checks = _DriverChecks(Tokenize(config), inputs, sources)
    try:
        for k in range(2):
            step = Tokenize(dataclasses.replace(config, shard=Shard(k, 2), workers=0, check_here=False,
                                                output_prefix=str(tmp_path / f"shard{k}")))
            shard = pipeline.run(step)[0].certificate
            assert shard["certified"] is False and shard["why"] == pipeline.CHECKED_BY_CALLER["why"]
            spelled += shard["records_spelled"]
            picked += step.picked
            checks.add(step.picked)
        again = checks.certificate({"records_spelled": spelled, "records_kept": whole["records_kept"]},
                                           whole["fingerprint"])
        assert again == whole and whole["records_checked"] == len(picked) >= 100
    finally:
        checks.end()
    assert not reference._LOADED
    where, (number, position, [(text, ids, a, b)]), documents = picked[-1]  # (`Certifier.keeping`)
    changed = ids.copy()
    changed[0] += 1
    checks = _DriverChecks(Tokenize(config), inputs, sources)
    try:
        checks.add(picked[:-1] + [(where, (number, position, [(text, changed, a, b)]), documents)])
        with pytest.raises(CertificateError, match=f"{where}: .*ours \\["):
            checks.certificate({"records_spelled": spelled, "records_kept": whole["records_kept"]},
                                           whole["fingerprint"])
    finally:
        checks.end()


def test_records_a_shard_reports_as_it_runs_are_checked_once(tmp_path, monkeypatch):
    """A Ray task reports its picked records as it goes (checked while the other shards run, not all
    after the last one ends) and then hands them all over with its result: each is checked once, and
    one that comes back unlike its report (a retried task that did not repeat its work) stops the run."""
    import dataclasses

    from qwen_data.inputs.files import Shard
    from qwen_data.run import pipeline
    from qwen_data.run.ray import _DriverChecks
    from qwen_data.run.tally import Tally
    from qwen_data.steps.pretrain import Tokenize

    whole, config, sources, inputs = _driver_run(tmp_path, monkeypatch, 2, 300)
    step = Tokenize(dataclasses.replace(config, shard=Shard(0, 1), workers=0, check_here=False,
                                        output_prefix=str(tmp_path / "shard0")))
    spelled = pipeline.run(step)[0].certificate["records_spelled"]
    picked, half = step.picked, len(step.picked) // 2
    tally = Tally([0])
    assert tally.next(0, tally.start(0))[0] == (0, 1)  # task 0's first attempt takes part 0, its first attempt
    tally.report(0, 1, (0, 0, 0, 0), 0, picked[:half])
    tally.report(0, 2, (0, 0, 0, 0), half, picked[half:])  # an attempt the tally never began: ignored
    assert tally.totals()[2] == [(0, 0, picked[:half])] and tally.totals()[2] == []
    checks = _DriverChecks(Tokenize(config), inputs, sources)
    try:
        checks.shard(0, 0, picked[:half])
        checks.shard(0, 0, picked)  # the task's result: the first half only compared
        checks.shard(0, half, picked[half:])  # its last report, polled after the result
        again = checks.certificate({"records_spelled": spelled, "records_kept": whole["records_kept"]},
                                   whole["fingerprint"])
        assert again == whole and whole["records_checked"] == len(picked) >= 50
    finally:
        checks.end()
    where, (number, position, [(text, ids, a, b)]), documents = picked[0]
    changed = ids.copy()
    changed[0] += 1
    checks = _DriverChecks(Tokenize(config), inputs, sources)
    try:
        checks.shard(0, 0, picked[:half])
        with pytest.raises(CertificateError, match=f"{where}: part 0 picked this record again, unlike"):
            checks.shard(0, 0, [(where, (number, position, [(text, changed, a, b)]), documents)] + picked[1:])
    finally:
        checks.end()


# -- qwen-data verify --certify N ------------------------------------------------------------------
def recheck_corpus(tmp_path):
    records = [{"text": f"document {k}: caf\u00e9 <think>x</think> \u212b"} for k in range(12)]
    records[3] = {"text": ""}  # set aside: it makes no document, and the documents after it shift
    return write_jsonl(tmp_path / "c.jsonl", records)


def test_verify_certify_rechecks_records_against_todays_reference(tmp_path, capsys):
    corpus = recheck_corpus(tmp_path)
    prefix = str(tmp_path / "p")
    assert main(["pretrain", corpus, "-o", prefix, "--quiet"]) == 0
    assert main(["verify", prefix, "--certify", "100"]) == 0  # more than it holds: every record
    recheck = certificate(prefix)["rechecks"][-1]
    assert recheck["records_checked"] == 11 and recheck["mismatches"] == 0 and recheck["reference"]["tokenizers"]
    assert "11 records picked across it" in capsys.readouterr().out
    os.remove(corpus)
    assert main(["verify", prefix, "--certify", "8"]) == 1
    assert f"{corpus} is gone" in capsys.readouterr().out


@pytest.mark.corrupts_outputs  # one id of the .bin edited
def test_verify_certify_finds_an_edited_id_and_train_would_refuse_it(tmp_path, capsys):
    corpus = recheck_corpus(tmp_path)
    prefix = str(tmp_path / "p")
    assert main(["pretrain", corpus, "-o", prefix, "--quiet"]) == 0
    documents = layout_of(Manifest.read(prefix)).open(prefix)
    start = sum(len(documents.document(d)[0]) for d in range(5))
    data = np.memmap(prefix + ".bin", np.int32, "r+")
    data[start + 2] += 1  # a token of the 6th document: line 7 (line 4 made none)
    data.flush()
    assert main(["verify", prefix, "--certify", "20"]) == 1
    out = capsys.readouterr().out
    assert f"{corpus}:7: our ids differ from the reference's" in out
    recheck = certificate(prefix)["rechecks"][-1]
    assert recheck["mismatches"] == 1 and recheck["records_checked"] == 6 and f"{corpus}:7" in recheck["mismatch"]


REFERENCE = ["--reference-template"]  # the official Jinja follows (`reference_template`)
ODD_ANSWER = "The odd record is number seven."


def reference_template():
    return str(oracle_dir() / "qwen2.5-instruct.jinja")


def sft_recheck_corpus(tmp_path):
    """The bundled chats three times, with records set aside whole (unreadable; one sample too long)
    and, under --history split, one sample of a record set aside (its second turn too long)."""
    chats = [json.loads(line) for line in open(os.path.join(EXAMPLES, "chats.jsonl"), encoding="utf-8")] * 3
    chats[6] = {"instruction": "Name the odd record.", "output": ODD_ANSWER}  # line 7
    chats[2] = {"neither": "instruction nor messages"}  # set aside
    chats[11] = {"messages": [{"role": "user", "content": "short?"}, {"role": "assistant", "content": "yes"},
                              {"role": "user", "content": "long?"}, {"role": "assistant", "content": "word " * 400}]}
    return write_jsonl(tmp_path / "chats.jsonl", chats)


SFT_LAYOUTS = {"unpacked": [], "best-fit, split history": ["--pack", "--history", "split"],
               "next-fit": ["--pack", "--packing", "next-fit"], "pai, packed": ["--layout", "pai", "--pack"]}


@pytest.mark.parametrize("layout", SFT_LAYOUTS)
def test_verify_certify_rechecks_sft_samples_in_every_layout(tmp_path, capsys, layout):
    corpus, prefix = sft_recheck_corpus(tmp_path), str(tmp_path / "s")
    assert main(["sft", corpus, "-o", prefix, "--quiet", "--seq-length", "256", *SFT_LAYOUTS[layout],
                 *REFERENCE, reference_template()]) == 0
    rejects = [json.loads(line) for line in open(prefix + ".rejects.jsonl", encoding="utf-8")]
    truncates = "pai" in layout  # line 12 is cut to --seq-length, not set aside
    assert [(r["record"], r.get("sample")) for r in rejects] == [(3, None)] + (
        [] if truncates else [(12, 2 if "split" in layout else None)])
    assert main(["verify", prefix, "--certify", "100", *REFERENCE, reference_template()]) == 0
    recheck, made = certificate(prefix)["rechecks"][-1], certificate(prefix)
    assert recheck["mismatches"] == 0 and set(recheck["reference"]) == {"jinja2", "tokenizers"}
    # the run also checked line 12, which it set aside whole in the unpacked and next-fit layouts
    assert made["records_checked"] - 1 <= recheck["records_checked"] <= made["records_checked"]
    assert recheck["masks_not_checked"] == 0
    assert f"{recheck['records_checked']} records picked across it encoded again" in capsys.readouterr().out


@pytest.mark.corrupts_outputs  # one id of one sample edited
def test_verify_certify_finds_an_edited_id_in_a_packed_sft_row(tmp_path, capsys):
    from tokenizers import Tokenizer
    from _oracles import bundled_tokenizer_dir

    corpus, prefix = sft_recheck_corpus(tmp_path), str(tmp_path / "s")
    assert main(["sft", corpus, "-o", prefix, "--quiet", "--seq-length", "256", "--pack",
                 *REFERENCE, reference_template()]) == 0
    answer = Tokenizer.from_file(str(bundled_tokenizer_dir() / "tokenizer.json")).encode(ODD_ANSWER).ids
    data = np.memmap(prefix + ".bin", np.dtype(Manifest.read(prefix).dtype), "r+")
    at = next(i for i in range(len(data) - len(answer)) if list(data[i:i + len(answer)]) == answer)
    data[at + 2] += 1
    data.flush()
    assert main(["verify", prefix, "--certify", "100", *REFERENCE, reference_template()]) == 1
    out = capsys.readouterr().out
    assert f"{corpus}:7: our ids differ from the reference's" in out and "ours [" in out and "reference [" in out
    recheck = certificate(prefix)["rechecks"][-1]
    assert recheck["mismatches"] == 1 and recheck["records_checked"] == 6 and f"{corpus}:7" in recheck["mismatch"]


def test_verify_certify_of_sft_says_why_it_cannot(tmp_path, capsys, monkeypatch):
    corpus, prefix = sft_recheck_corpus(tmp_path), str(tmp_path / "s")
    assert main(["sft", corpus, "-o", prefix, "--quiet", "--seq-length", "256", *REFERENCE, reference_template()]) == 0
    # the bundled tokenizer's chat template is not qwen2p5's official Jinja
    assert main(["verify", prefix, "--certify", "5"]) == 1
    assert "not certified: no official Jinja of the template qwen2p5" in capsys.readouterr().out
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("\n")
    assert main(["verify", prefix, "--certify", "5", *REFERENCE, reference_template()]) == 1
    assert f"{corpus} changed (then " in capsys.readouterr().out
    os.remove(corpus)
    assert main(["verify", prefix, "--certify", "5", *REFERENCE, reference_template()]) == 1
    assert f"{corpus} is gone" in capsys.readouterr().out
    os.remove(prefix + ".rejects.jsonl")
    assert main(["verify", prefix, "--certify", "5", *REFERENCE, reference_template()]) == 1
    assert ".rejects.jsonl (which records made no data), and it is gone" in capsys.readouterr().out
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jinja2"
                        else find_spec(name, *a))
    assert main(["verify", prefix, "--certify", "5", *REFERENCE, reference_template()]) == 1
    assert "not certified: jinja2 is not installed" in capsys.readouterr().out
    assert "rechecks" not in certificate(prefix)  # nothing was checked: nothing recorded



class _CountingChecks:
    """A checker whose checks leave a line each in `log`, so a test sees them happen."""

    def __init__(self, log) -> None:
        self.log = str(log)

    def reference_loaded(self) -> bool:
        return False

    def load(self) -> None:
        pass

    def check(self, items):
        with open(self.log, "a") as f:
            f.write("checked\n")
        return {"records_checked": len(items)}, None


def test_the_checking_process_keeps_checking_while_the_run_goes_on(tmp_path):
    """Its answers are read as they come: left in the pipe until the end, they fill it after a few
    hundred, and the process stops checking until the run is over (a tail after the workers)."""
    import time

    from qwen_data.certify.checks import check_in_side
    from qwen_data.run import certifier as module
    from qwen_data.run.workers import SideProcess

    log = tmp_path / "checks"
    certifier = module.Certifier(_CountingChecks(log), [SideProcess(check_in_side)])
    try:
        for k in range(2000):  # picked records, as a run's results bring them
            certifier.add([(f"f.jsonl:{k + 1}", "text")])
            time.sleep(0.001)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 2000):
            time.sleep(0.05)
        assert len(log.read_text().splitlines()) == 2000, "the checking process stopped before the run's end"
        assert certifier.finish() == {"records_checked": 2000}
    finally:
        certifier.end()


class _PacedChecks(_CountingChecks):
    """The first process to check claims to be slow (10 ms a batch); each check logs its process."""

    def check(self, items):
        import time

        if not hasattr(self, "slow"):
            try:
                os.close(os.open(self.log + ".slow", os.O_CREAT | os.O_EXCL))
                self.slow = True
            except FileExistsError:
                self.slow = False
        if self.slow:
            time.sleep(0.01)
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return {"records_checked": len(items)}, None


def test_batches_go_to_the_side_with_least_to_check_and_each_answer_to_its_batch(tmp_path):
    """Two checking processes, one slow: the slow one gets fewer batches (a side that imports and
    loads on the run's cores was its tail), and every answer is counted for the batch it answers."""
    import collections
    import time

    from qwen_data.certify.checks import check_in_side
    from qwen_data.run import certifier as module
    from qwen_data.run.workers import SideProcess

    log = tmp_path / "checks"
    certifier = module.Certifier(_PacedChecks(log), [SideProcess(check_in_side), SideProcess(check_in_side)])
    sizes = [1 + k % 5 for k in range(300)]
    try:
        for k, n in enumerate(sizes):
            certifier.add([(f"f.jsonl:{k + 1}", "text")] * n)
            time.sleep(0.002)
        assert certifier.finish() == {"records_checked": sum(sizes)}
    finally:
        certifier.end()
    assert {batch: counts["records_checked"] for batch, counts in certifier.answered.items()} == dict(enumerate(sizes))
    slow, fast = sorted(collections.Counter(log.read_text().split()).values())
    assert slow + fast == len(sizes) and slow < fast / 2, (slow, fast)


# -- faults injected at the encoder's, the mask's and the writer's seams ---------------------------
def _ten_thousand(tmp_path):
    return write_jsonl(tmp_path / "many.jsonl", [{"text": f"record {k} says hello to you"} for k in range(10_000)])


def test_an_id_changed_in_one_record_in_a_thousand_fails_the_run_naming_it(tmp_path, monkeypatch, capsys):
    """Every document is spelled again in its worker: each changed id is found, not a sample of them."""
    corpus = _ten_thousand(tmp_path)
    encode_batch = QwenTokenizer.encode_batch

    def broken(self, texts, special="parse"):
        ids, lengths = encode_batch(self, texts, special)
        ends = np.cumsum(lengths)
        for k, text in enumerate(map(as_str, texts)):
            if text.startswith("record ") and int(text.split()[1]) % 1000 == 999:
                ids = ids.copy()
                ids[ends[k] - 1] += 1
        return ids, lengths

    monkeypatch.setattr(QwenTokenizer, "encode_batch", broken)
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 2
    assert f"{corpus}:1000: its ids spell other bytes than its text" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith("p")]


def test_ids_that_spell_the_same_bytes_in_other_pieces_are_found_by_the_reference_sample(tmp_path, monkeypatch,
                                                                                          capsys):
    """" hello" encoded as " hel" + "lo" in 1% of 10,000 records spells the same text: the reference
    sample (about 4,096 records) finds it, naming one of them."""
    corpus = _ten_thousand(tmp_path)
    tokenizer = QwenTokenizer.shared()
    [hello], pieces = tokenizer.encode(" hello").tolist(), np.concatenate([tokenizer.encode(" hel"),
                                                                           tokenizer.encode("lo")])
    encode_batch = QwenTokenizer.encode_batch

    def resegmented(self, texts, special="parse"):
        ids, lengths = encode_batch(self, texts, special)
        out, counts, ends = [], [], np.cumsum(lengths)
        for k, text in enumerate(map(as_str, texts)):
            own = ids[ends[k] - lengths[k]:ends[k]]
            if text.startswith("record ") and int(text.split()[1]) % 100 == 7:
                at = int(np.flatnonzero(own == hello)[0])
                own = np.concatenate([own[:at], pieces, own[at + 1:]]).astype(np.int32)
            out.append(own)
            counts.append(len(own))
        return (np.concatenate(out) if out else ids), np.asarray(counts, dtype=np.int64)

    monkeypatch.setattr(QwenTokenizer, "encode_batch", resegmented)
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 2
    error = capsys.readouterr().err
    line = re.search(rf"{re.escape(corpus)}:(\d+): our ids differ from the reference's", error)
    assert line and int(line.group(1)) % 100 == 8, error
    monkeypatch.undo()
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "1", "--quiet"]) == 0
    found = certificate(tmp_path / "p")
    assert 3000 <= found["records_checked"] <= 5000 and found["detection"]["0.1%"] >= 0.95
    assert found["records_spelled"] == found["records_kept"] == 10_000


def test_a_one_token_shift_of_a_qwen3_multi_turn_mask_fails_the_run(tmp_path, monkeypatch, capsys):
    """Under the default --history rendered, Qwen3 strips earlier reasoning, so the reference cannot
    derive those masks; the structure check of every sample does."""
    chats = [{"messages": [{"role": "user", "content": f"q{k}"},
                           {"role": "assistant", "content": f"<think>r{k}</think>a{k}"},
                           {"role": "user", "content": "again"}, {"role": "assistant", "content": "done"}]}
             for k in range(20)]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    encode = SampleEncoder.encode

    def shifted(self, samples):
        encoded = encode(self, samples)
        return [(ids, np.roll(mask, 1)) if "q13" in sample.text else (ids, mask)
                for sample, (ids, mask) in zip(samples, encoded)]

    monkeypatch.setattr(SampleEncoder, "encode", shifted)
    assert main(["sft", corpus, "-o", str(tmp_path / "s"), "--template", "qwen3", "--quiet", "--workers", "1"]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:14: its loss mask differs from the one the template's structure gives" in error


@pytest.mark.parametrize("writer", ["main", "worker"])
def test_a_document_the_writer_corrupts_is_found_in_the_written_files(tmp_path, monkeypatch, capsys, writer):
    """The picked documents are read back from the staged files before the commit, whoever wrote
    them: the main process (one chunk, processed there) or the worker that made them (forked after
    the patch, so it writes the corrupted bytes)."""
    from qwen_data.formats.indexed import IndexedDatasetWriter
    from qwen_data.run import workers

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"document {k}"} for k in range(50)])
    if writer == "main":
        write_at = IndexedDatasetWriter.write_at

        def corrupting(self, data, offset):
            data = np.array(data)
            data[len(data) // 2] ^= 1
            return write_at(self, data, offset)

        monkeypatch.setattr(IndexedDatasetWriter, "write_at", corrupting)
    else:
        def corrupting(fd, arena, start, size, offset):
            data = bytearray(arena[start:start + size])
            if data:
                data[size // 2] ^= 1
            os.pwrite(fd, data, offset)

        monkeypatch.setattr(workers, "_write_range", corrupting)
    chunks = ["--chunk-mb", "0.0002"] if writer == "worker" else []
    assert main(["pretrain", corpus, "-o", str(tmp_path / "p"), "--workers", "2" if chunks else "1", "--quiet",
                 *chunks]) == 2
    assert "the written document differs from what was encoded" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith("p")]


# -- what a certificate claims is true -------------------------------------------------------------
def test_no_record_checked_is_never_certified(tmp_path):
    """Records the reference cannot map are not checked: a run of only those says so instead of
    claiming a certificate over nothing."""
    chats = [{"messages": [{"role": "human", "content": f"role alias {k}"}, {"role": "gpt", "content": "ok"}]}
             for k in range(5)]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    assert main(["sft", corpus, "-o", str(tmp_path / "s"), "--quiet", "--template", "qwen2p5",
                 "--reference-template", str(oracle_dir() / "qwen2.5-instruct.jinja")]) == 0
    found = certificate(tmp_path / "s")
    assert found["records_checked"] == 0 and found["records_not_mappable"] == 5
    assert found["certified"] is False and "no record" in found["why"]


def test_an_empty_first_file_and_every_shard_pick_their_own_records(tmp_path):
    import gzip

    empty = tmp_path / "e.jsonl.gz"
    with gzip.open(empty, "wb"):
        pass
    corpus = write_jsonl(tmp_path / "two.jsonl", [{"text": f"document {k}"} for k in range(30)])
    assert main(["pretrain", str(empty), corpus, "-o", str(tmp_path / "e4"), "--quiet"]) == 0
    assert certificate(tmp_path / "e4")["records_checked"] == 30
    checked = 0
    for k in range(3):
        assert main(["pretrain", corpus, "-o", str(tmp_path / f"cs.{k}"), "--shard", f"{k}/3", "--quiet"]) == 0
        found = certificate(tmp_path / f"cs.{k}")
        assert found["certified"] and found["records_checked"] == found["records_kept"] > 0
        checked += found["records_checked"]
    assert checked == 30


def test_a_merge_refuses_a_part_whose_recheck_found_a_mismatch(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"document {k}"} for k in range(30)])
    for k in range(3):
        assert main(["pretrain", corpus, "-o", str(tmp_path / f"pc.{k}"), "--shard", f"{k}/3", "--quiet"]) == 0
    parts = [str(tmp_path / f"pc.{k}") for k in range(3)]
    assert main(["merge", *parts, "-o", str(tmp_path / "good"), "--quiet"]) == 0
    merged = certificate(tmp_path / "good")
    assert merged["certified"] and merged["records_checked"] == 30 and len(merged["parts"]) == 3
    assert merged["fingerprint"] == json.load(open(tmp_path / "good.json"))["fingerprint"]
    with open(parts[1] + ".json", encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["certificate"]["rechecks"] = [{"records_checked": 5, "mismatches": 1, "mismatch": "c.jsonl:12: ..."}]
    with open(parts[1] + ".json", "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    assert main(["merge", *parts, "-o", str(tmp_path / "bad"), "--quiet"]) == 2
    assert f"{parts[1]}: its certificate records ids that differ" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "bad.json")


def test_verify_certify_of_a_shard_maps_its_own_records(tmp_path, capsys):
    """Shard 1's first document is its own first record, not the file's: no false mismatch."""
    corpus = write_jsonl(tmp_path / "plain.jsonl", [{"text": f"document number {k}"} for k in range(30)])
    for k in range(3):
        assert main(["pretrain", corpus, "-o", str(tmp_path / f"cs.{k}"), "--shard", f"{k}/3", "--quiet"]) == 0
        assert main(["verify", str(tmp_path / f"cs.{k}"), "--certify", "5"]) == 0, capsys.readouterr().out
        recheck = certificate(tmp_path / f"cs.{k}")["rechecks"][-1]
        assert recheck["mismatches"] == 0 and recheck["records_checked"] > 0


def test_verify_certify_picks_across_the_whole_prefix(tmp_path):
    from qwen_data.certify.recheck import recheck
    from qwen_data.certify.sample import numbers

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"document number {k}"} for k in range(300)])
    prefix = str(tmp_path / "p")
    assert main(["pretrain", corpus, "-o", prefix, "--quiet"]) == 0
    problems, done = recheck(prefix, 30, seed=7)
    lines = numbers(done["lines_checked"][corpus])
    assert not problems and 10 <= len(lines) <= 60 and max(lines) > 200 and done["seed"] == 7
    again = recheck(prefix, 30, seed=8)[1]
    assert numbers(again["lines_checked"][corpus]) != lines  # another seed, other records


def test_verify_certify_on_read_only_storage_reports_and_concurrent_rechecks_lose_none(tmp_path, capsys,
                                                                                     monkeypatch):
    import errno
    import subprocess
    import sys

    from qwen_data.certify import recheck

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"document number {k}"} for k in range(40)])
    prefix = str(tmp_path / "p")
    assert main(["pretrain", corpus, "-o", prefix, "--quiet"]) == 0
    command = [sys.executable, "-m", "qwen_data.cli", "verify", prefix, "--certify", "100"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE) for _ in range(4)]
    assert [run.wait() for run in runs] == [0, 0, 0, 0]
    assert len(certificate(prefix)["rechecks"]) == 4
    before = open(prefix + ".json", encoding="utf-8").read()

    def read_only(path, *args, **kwargs):  # as a read-only mount answers
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(recheck, "atomic_file", read_only)
    capsys.readouterr()
    assert main(["verify", prefix, "--certify", "100"]) == 0
    out = capsys.readouterr().out
    assert "40 records picked across it encoded again" in out and "the recheck is not recorded" in out
    assert open(prefix + ".json", encoding="utf-8").read() == before


def test_a_reference_template_that_is_not_the_official_jinja_is_refused_naming_it(tmp_path, capsys):
    chats = os.path.join(EXAMPLES, "chats.jsonl")
    noise = tmp_path / "noise.jinja"
    noise.write_bytes(bytes(range(128, 256)) * 3)
    assert main(["sft", chats, "-o", str(tmp_path / "s"), "--quiet", "--reference-template", str(noise)]) == 2
    assert f"{noise}: --reference-template is not UTF-8 text" in capsys.readouterr().err
    other = str(oracle_dir() / "qwen3.jinja")
    assert main(["sft", chats, "-o", str(tmp_path / "s"), "--quiet", "--reference-template", other]) == 2
    assert f"{other}: --reference-template is not the official Jinja of the template qwen2p5" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith("s")]


def test_the_official_jinja_is_found_in_a_tokenizer_config_and_in_the_local_hub_cache(tmp_path, monkeypatch, capsys):
    """The Quick start's `sft` (qwen2p5 on the bundled Qwen3 tokenizer) names the file to pass; given
    the model's tokenizer_config.json, or with that model in the local Hub cache, it is certified."""
    chats = os.path.join(EXAMPLES, "chats.jsonl")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["sft", chats, "-o", str(tmp_path / "s")]) == 0
    assert "pass --reference-template with Qwen/Qwen2.5-7B-Instruct's tokenizer_config.json" in capsys.readouterr().out
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": (oracle_dir() / "qwen2.5-instruct.jinja").read_text()}))
    assert main(["sft", chats, "-o", str(tmp_path / "s"), "--quiet", "--reference-template", str(config)]) == 0
    assert certificate(tmp_path / "s")["certified"]
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer_config.json").write_text(config.read_text())
    assert main(["sft", chats, "-o", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("certified: ")


def test_verify_certify_of_a_several_key_prefix_with_rejects(tmp_path, capsys):
    """A run of several --text-keys keeps one rejects file for all its prefixes: each is rechecked."""
    records = [{"a": f"first {k}", "b": f"second {k}"} for k in range(12)]
    records[4] = {"a": "no b here"}  # set aside for both keys
    corpus = write_jsonl(tmp_path / "k.jsonl", records)
    prefix = str(tmp_path / "kk")
    assert main(["pretrain", corpus, "-o", prefix, "--text-key", "a,b", "--quiet"]) == 0
    for key in ("a", "b"):
        assert main(["verify", f"{prefix}_{key}", "--certify", "100"]) == 0, capsys.readouterr().out
        assert certificate(f"{prefix}_{key}")["rechecks"][-1]["records_checked"] == 11


# -- the reference reads each record itself ----------------------------------------------------------
def qwen2p5(*args):
    return [*args, "--quiet", "--template", "qwen2p5", "--reference-template", reference_template()]


def wrapped_parser(monkeypatch, change):
    """`to_conversation` as the SFT step uses it, its conversations changed by `change(record, conversation)`."""
    from qwen_data.steps import sft

    parse = sft.to_conversation

    def changed(record, *args, **kwargs):
        conversation = parse(record, *args, **kwargs)
        change(record, conversation)
        return conversation

    monkeypatch.setattr(sft, "to_conversation", changed)


def test_a_parser_that_drops_system_messages_fails_the_run(tmp_path, monkeypatch, capsys):
    """Both sides rendered our own parse once, so a bug there passed; the reference now maps the
    record itself."""
    chats = [json.loads(line) for line in open(os.path.join(EXAMPLES, "chats.jsonl"), encoding="utf-8")]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "ok"))) == 0

    def drop_system(record, conversation):
        conversation.messages[:] = [m for m in conversation.messages if m["role"] != "system"]

    wrapped_parser(monkeypatch, drop_system)
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "bad"), "--workers", "1")) == 2
    assert f"{corpus}:4: our ids differ from the reference's" in capsys.readouterr().err  # alpaca's system
    assert not [name for name in os.listdir(tmp_path) if name.startswith("bad")]


def test_an_alpaca_input_joined_otherwise_fails_the_run(tmp_path, monkeypatch, capsys):
    chats = [json.loads(line) for line in open(os.path.join(EXAMPLES, "chats.jsonl"), encoding="utf-8")]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)

    def joined_by_space(record, conversation):
        if record.get("input"):
            conversation.messages[-2]["content"] = record["instruction"] + " " + record["input"]

    wrapped_parser(monkeypatch, joined_by_space)
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "bad"), "--workers", "1")) == 2
    assert f"{corpus}:2: our ids differ from the reference's" in capsys.readouterr().err
    # Pai's layout joins with nothing: the reference reads the run's --input-separator
    monkeypatch.undo()
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "pai"), "--layout", "pai", "--seq-length", "512")) == 0
    assert certificate(tmp_path / "pai")["records_checked"] == len(chats)


SHAPES = [  # every documented shape of a record, each read by the reference on its own
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "value": "b"}]},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                      {"name": "g", "arguments": {"y": "é"}}]},
                  {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"},
                  {"role": "assistant", "thinking": "hm", "content": "done", "weight": 1}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"instruction": "I", "input": None, "output": "O", "system": "", "history": [["u", "a"], ["u2", "a2"]]},
    {"instruction": "", "input": "only input", "output": "O", "system": "S"},
    {"conversations": [{"from": "human", "value": "w?"},
                       {"from": "function_call", "value": "<think>t</think>{\"name\": \"f\", \"arguments\": {}}"},
                       {"from": "observation", "value": "sunny"}, {"from": "gpt", "value": "sun"}],
     "system": "field", "tools": json.dumps([{"name": "f", "parameters": {}}])},
    {"conversations": [{"from": "system", "value": "first wins"}, {"from": "user", "value": "q"},
                       {"from": "function_call", "value": [{"name": "a", "arguments": "{}"}, {"name": "b",
                                                                                              "arguments": {}}]},
                       {"from": "tool", "value": [{"type": "text", "text": "x"}]}, {"from": "assistant", "value": "y"}],
     "system": "ignored"},
]
UNMAPPED = [  # what our parser takes and the documented mapping does not: counted, never called checked
    {"messages": [{"role": "human", "content": "alias"}, {"role": "gpt", "content": "a"}]},
    {"messages": [{"from": "user", "value": "sharegpt keys"}, {"from": "assistant", "value": "a"}]},
    {"messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "parameters": {}}]}]},
]


@pytest.mark.parametrize("template,history", [("qwen2p5", "rendered"), ("qwen3", "split"), ("qwen3", "rendered")])
@pytest.mark.parametrize("arguments", [[], ["--parse-tool-arguments"]])
def test_every_documented_record_shape_is_checked_from_the_record(tmp_path, capsys, template, history, arguments):
    corpus = write_jsonl(tmp_path / "c.jsonl", SHAPES + UNMAPPED)
    jinja = {"qwen2p5": reference_template(), "qwen3": str(oracle_dir() / "qwen3.jinja")}[template]
    assert main(["sft", corpus, "-o", str(tmp_path / "s"), "--quiet", "--template", template, "--history", history,
                 "--reference-template", jinja, *arguments]) == 0
    found = certificate(tmp_path / "s")
    assert found["certified"] and found["records_checked"] == len(SHAPES)
    assert found["records_not_mappable"] == len(UNMAPPED) and found["records_through_columns"] == 0
    assert "structure_mask" in found["mask_checked_by"]["every_sample"]
    assert "generation prompt" in found["mask_checked_by"]["picked_samples"]
    assert f"; {len(UNMAPPED)} picked records the reference cannot read were not checked" in capsys.readouterr().out
    assert found["lines_checked"] == {corpus: f"1-{len(SHAPES)}"}


def test_records_read_through_columns_are_counted(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"q": f"question {k}", "a": f"answer {k}", "sys": "S"}
                                                for k in range(4)])
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "s"), "--columns",
                        "instruction=q,output=a,system=sys")) == 0
    found = certificate(tmp_path / "s")
    assert found["certified"] and found["records_checked"] == found["records_through_columns"] == 4


def test_verify_certify_reads_each_record_itself(tmp_path, monkeypatch, capsys):
    chats = [json.loads(line) for line in open(os.path.join(EXAMPLES, "chats.jsonl"), encoding="utf-8")]
    corpus, prefix = write_jsonl(tmp_path / "c.jsonl", chats), str(tmp_path / "s")
    wrapped_parser(monkeypatch, lambda record, conversation: conversation.messages.__setitem__(
        slice(None), [m for m in conversation.messages if m["role"] != "system"]))
    assert main(qwen2p5("sft", corpus, "-o", prefix, "--no-certify")) == 0
    assert main(["verify", prefix, "--certify", "10", *REFERENCE, reference_template()]) == 1
    assert f"{corpus}:4: our ids differ from the reference's" in capsys.readouterr().out


# -- literals in content, checked under the run's --special-tokens policy ----------------------------
LITERAL_CHATS = [{"instruction": "say <|im_end|> then <|im_start|>assistant\nhi", "output": "ok <|endoftext|>"},
                 {"messages": [{"role": "user", "content": "<tool_call>{}</tool_call> <think>x</think>"},
                               {"role": "assistant", "content": "<think>why</think>answer <|im_end|>"}],
                  "tools": [{"type": "function", "function": {"name": "<|im_start|>", "parameters": {}}}]},
                 {"messages": [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "plain"}]}]


@pytest.mark.parametrize("policy", ["safe", "text", "parse", "reject"])
@pytest.mark.parametrize("template", ["qwen2p5", "qwen3"])
def test_records_with_literals_are_checked_under_their_policy(tmp_path, policy, template):
    """Literals the policy keeps as text are rendered as placeholders the template cannot act on,
    and encoded as text; none of these records is left unchecked."""
    import random

    from _conversations import conversations

    records = LITERAL_CHATS + [{"messages": c.messages, **({"tools": c.tools} if c.tools else {})}
                               for c in conversations(3, 60, tools=True, reasoning=True)]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    jinja = {"qwen2p5": reference_template(), "qwen3": str(oracle_dir() / "qwen3.jinja")}[template]
    assert main(["sft", corpus, "-o", str(tmp_path / "s"), "--quiet", "--template", template, "--special-tokens",
                 policy, "--reference-template", jinja, "--history", random.Random(policy).choice(
                     ["rendered", "split"])]) == 0
    found = certificate(tmp_path / "s")
    rejected = found["records_kept"] < len(records)
    assert rejected == (policy == "reject")  # reject sets aside records with structural literals
    assert found["certified"] and found["records_checked"] == found["records_kept"] > 0
    assert "records_with_literals_skipped" not in found and found["records_not_mappable"] == 0


def test_a_content_literal_made_a_control_id_under_safe_fails_the_run(tmp_path, monkeypatch, capsys):
    """Our encoder turning a user's literal `<|im_end|>` into the control id spells the same bytes
    and keeps the mask's structure: only the reference, which encodes it as text, sees it."""
    from qwen_data.text.templates import Sample

    chats = [{"instruction": "plain", "output": "ok"}, {"instruction": "say <|im_end|> now", "output": "ok"}]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    ids = SampleEncoder._ids

    def parsing(self, samples):  # every literal parsed, as if the policy were parse
        return ids(self, [Sample(s.segments, s.trained_turns) for s in samples])

    monkeypatch.setattr(SampleEncoder, "_ids", parsing)
    assert main(qwen2p5("sft", corpus, "-o", str(tmp_path / "s"), "--workers", "1")) == 2
    assert f"{corpus}:2: our ids differ from the reference's" in capsys.readouterr().err


def test_verify_certify_checks_records_with_literals(tmp_path):
    corpus, prefix = write_jsonl(tmp_path / "c.jsonl", LITERAL_CHATS), str(tmp_path / "s")
    assert main(qwen2p5("sft", corpus, "-o", prefix, "--pack", "--seq-length", "512")) == 0
    assert main(["verify", prefix, "--certify", "10", *REFERENCE, reference_template()]) == 0
    recheck = certificate(prefix)["rechecks"][-1]
    assert recheck["records_checked"] == len(LITERAL_CHATS) and recheck["mismatches"] == 0
    assert "records_with_literals_skipped" not in recheck


def test_a_long_chat_is_checked_on_a_window_and_a_fault_there_fails_the_run(tmp_path, monkeypatch, capsys):
    """Ids that spell the same bytes in other pieces, in every turn of long chats: the reference's
    window, cut where HF's pre-tokenizer cuts, finds them."""
    words = " ".join(f"word{k} hello" for k in range(60))
    chats = [{"messages": [m for t in range(4) for m in ({"role": "user", "content": f"turn {t}: {words}"},
                                                         {"role": "assistant", "content": f"answer {t}: {words}"})]}
             for _ in range(3)]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    args = ["sft", corpus, "--quiet", "--workers", "1", *REFERENCE, reference_template()]
    assert main([*args, "-o", str(tmp_path / "ok")]) == 0
    found = certificate(tmp_path / "ok")
    assert found["certified"] and found["records_checked"] == 3
    tokenizer = QwenTokenizer.shared()
    [hello], pieces = tokenizer.encode(" hello").tolist(), np.concatenate([tokenizer.encode(" hel"),
                                                                           tokenizer.encode("lo")])
    encode = SampleEncoder.encode

    def resegmented(self, samples):
        out = []
        for ids, mask in encode(self, samples):
            at = np.flatnonzero(ids == hello)
            ids = np.insert(np.delete(ids, at), np.repeat(at - np.arange(len(at)), 2), np.tile(pieces, len(at)))
            mask = np.insert(np.delete(mask, at), np.repeat(at - np.arange(len(at)), 2), np.repeat(mask[at], 2))
            out.append((ids.astype(np.int32), mask.astype(np.uint8)))
        return out

    monkeypatch.setattr(SampleEncoder, "encode", resegmented)
    assert main([*args, "-o", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:1 (the window of its tokens" in error and "our ids differ from the reference's" in error


def test_a_run_of_its_own_checks_long_chats_in_its_checking_processes(tmp_path):
    """A command run on its own checks in processes of their own, forked as it starts (not here, where
    HF's tokenizer is loaded already): they read the spelling table from the cache themselves (the
    run hands them none) to compare a long render's spelling whole, and the run is certified."""
    import subprocess
    import sys

    words = " ".join(f"word{k} hello" for k in range(60))
    chats = [{"messages": [m for t in range(4) for m in ({"role": "user", "content": f"turn {t}: {words}"},
                                                         {"role": "assistant", "content": f"answer {t}: {words}"})]}
             for _ in range(3)]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    prefix = str(tmp_path / "s")
    run = subprocess.run([sys.executable, "-m", "qwen_data", "sft", corpus, "--quiet", "--workers", "2", *REFERENCE,
                          str(reference_template()), "-o", prefix], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    found = certificate(prefix)
    assert found["certified"] and found["records_checked"] == 3 and found["masks_not_checked"] == 0  # on windows


def test_a_mask_wrong_in_the_window_of_a_long_chat_fails_the_run(tmp_path, monkeypatch, capsys):
    """The reference derives a long render's mask on its window, as it encodes its ids there: a loss mask
    wrong in the window fails the run when the check every sample gets in its worker is left out (the
    sample taken as one whose literals became control ids, whose structure it does not check)."""
    from qwen_data.certify.spelling import Speller

    words = " ".join(f"word{k} hello" for k in range(60))
    chats = [{"messages": [m for t in range(4) for m in ({"role": "user", "content": f"turn {t}: {words}"},
                                                         {"role": "assistant", "content": f"answer {t}: {words}"})]}]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    args = ["sft", corpus, "--quiet", "--workers", "1", *REFERENCE, reference_template()]
    encode, check = SampleEncoder.encode, Speller.check_samples
    monkeypatch.setattr(Speller, "check_samples", lambda self, texts, encoded, free, *rest:
                        check(self, texts, encoded, [True] * len(free), *rest))
    assert main([*args, "-o", str(tmp_path / "s")]) == 0  # the structure left out: still certified
    assert certificate(tmp_path / "s")["masks_not_checked"] == 0
    monkeypatch.setattr(SampleEncoder, "encode", lambda self, samples: [
        (ids, 1 - mask) for ids, mask in encode(self, samples)])
    assert main([*args, "-o", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:1 (the window of its tokens" in error and "loss mask differ from the reference's" in error


def test_a_long_chat_rendered_otherwise_outside_its_window_fails_the_run(tmp_path, monkeypatch, capsys):
    """The reference encodes a window of a long render, and compares the whole render, as bytes,
    with what our ids spell: a parser's fault anywhere in it is found."""
    words = " ".join(f"word{k} hello" for k in range(60))
    chats = [{"messages": [{"role": "system", "content": "Be brief."}] + [
        m for t in range(4) for m in ({"role": "user", "content": f"turn {t}: {words}"},
                                      {"role": "assistant", "content": f"answer {t}: {words}"})]}]
    corpus = write_jsonl(tmp_path / "c.jsonl", chats)
    args = ["sft", corpus, "--quiet", "--workers", "1", *REFERENCE, reference_template()]

    def drop_system(record, conversation):
        conversation.messages[:] = [m for m in conversation.messages if m["role"] != "system"]

    wrapped_parser(monkeypatch, drop_system)
    assert main([*args, "-o", str(tmp_path / "bad")]) == 2
    error = capsys.readouterr().err
    assert f"{corpus}:1: its ids spell other bytes than the template's render from byte " in error


@pytest.mark.parametrize("writer", ["main", "worker"])
def test_an_sft_sample_the_writer_corrupts_is_found_in_the_written_files(tmp_path, monkeypatch, capsys, writer):
    """Unpacked samples' ids and masks are written by the process that made them (`workers.Placement`),
    or here for a run in this process: a loss mask corrupted by either is found by the read-back."""
    from qwen_data.formats.indexed import IndexedDatasetWriter
    from qwen_data.run import workers

    chats = os.path.join(EXAMPLES, "chats.jsonl")
    if writer == "main":
        write_at = IndexedDatasetWriter.write_at

        def corrupting(self, data, offset):
            if data.dtype == np.uint8:  # the mask's
                data = np.array(data)
                data[len(data) // 2] ^= 1
            return write_at(self, data, offset)

        monkeypatch.setattr(IndexedDatasetWriter, "write_at", corrupting)
    else:
        write_range = workers._write_range

        def corrupting(fd, arena, start, size, offset):
            if size and os.readlink(f"/proc/self/fd/{fd}").endswith(".lossmask.bin.tmp"):
                data = bytearray(arena[start:start + size])
                data[size // 2] ^= 1
                return os.pwrite(fd, data, offset)
            return write_range(fd, arena, start, size, offset)

        monkeypatch.setattr(workers, "_write_range", corrupting)
    spread = ["--workers", "2", "--chunk-mb", "0.001"] if writer == "worker" else ["--workers", "1"]
    assert main(["sft", chats, "--quiet", *spread, *REFERENCE, reference_template(), "-o", str(tmp_path / "s")]) == 2
    assert "the written document differs from what was encoded" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith("s")]


@pytest.mark.parametrize("packing", ["best-fit", "next-fit"])
def test_a_packed_sample_the_row_writer_corrupts_is_found_in_the_written_rows(tmp_path, monkeypatch, capsys, packing):
    """Packed rows are laid out in the main process from windows of samples: each picked sample is
    read back from its sequence of the staged rows, found by the packing plan, before the commit."""
    from qwen_data.formats import layouts

    chats = os.path.join(EXAMPLES, "chats.jsonl")
    args = ["sft", chats, "--quiet", "--workers", "1", "--pack", "--seq-length", "512", "--packing", packing,
            *REFERENCE, reference_template()]
    assert main([*args, "-o", str(tmp_path / "ok")]) == 0  # (every sample read back from its row)
    assert certificate(tmp_path / "ok")["certified"]
    padded_rows = layouts.padded_rows

    def corrupting(ids, mask, lengths, plan, pad_id, buffers=None):
        out_ids, out_mask = padded_rows(ids, mask, lengths, plan, pad_id, buffers)
        out_ids[3] = (int(out_ids[3]) + 1) % 1000  # a token of the first row's first sample
        return out_ids, out_mask

    monkeypatch.setattr(layouts, "padded_rows", corrupting)
    assert main([*args, "-o", str(tmp_path / "s")]) == 2
    assert "the written document differs from what was encoded" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.startswith("s")]


READ_BACK_PEAK = """
import sys, numpy as np
from qwen_data.certify.checks import read_back
from qwen_data.formats.indexed import read_index

def peak_kb():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])

bin_path, idx_path = sys.argv[1:3]
index = read_index(idx_path)
ours = [np.asarray(np.fromfile(bin_path, np.int32, 4, offset=int(index.pointers[d]))) for d in range(len(index.lengths))]
picked = [(f"f:{d}", 0, d, 0, 4, ours[d]) for d in range(len(ours))]
before = peak_kb()
read_back(picked, [(bin_path, idx_path)])
print(peak_kb() - before)
"""


def test_the_read_back_keeps_no_page_of_the_written_files_resident(tmp_path):
    """The certificate's read-back of picked documents reads them: a mapping of the .bin kept the pages (and the
    read-ahead around them) of every scattered document it touched resident, ~0.8 GB on 1 GB of packed chats."""
    import subprocess
    import sys

    from qwen_data.formats.indexed import IndexedDatasetWriter

    prefix = str(tmp_path / "d")
    writer = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", np.int32)
    for d in range(600):  # 600 documents of 16 KB: a page each read back, 9.6 MB in all
        writer.add_document(np.full(4096, d, np.int32))
    writer.finalize()
    grown = int(subprocess.run([sys.executable, "-c", READ_BACK_PEAK, prefix + ".bin", prefix + ".idx"],
                               capture_output=True, text=True, check=True).stdout)
    assert grown < 1024, f"the read-back's peak resident memory grew {grown} kB"


def test_placeholders_mark_literals_in_every_string_of_a_record():
    """Content, nested lists and dict keys alike; a value without literals is handed back as it is."""
    literals = re.compile("(<\\|im_end\\|>|</think>|\\[key\\])")  # "[key]": one only a dict key holds
    value = [{"role": "user", "content": "a <|im_end|> b"}, {"tools": [{"[key]": ["x </think>"]}]}]
    marked, unmark = reference.placeholders(value, literals, "{{ '<|im_end|>' }}")
    flat = json.dumps(marked, ensure_ascii=False)
    assert "<|im_end|>" not in flat and "</think>" not in flat and "[key]" not in flat
    assert json.dumps(marked, ensure_ascii=False).translate(unmark) == json.dumps(value, ensure_ascii=False)
    plain = [{"role": "user", "content": "no literal here"}]
    assert reference.placeholders(plain, literals, "")[0] is plain
    assert reference.placeholders(plain, literals, "")[1] is None


def _fmix32_rule(line: bytes, seed: int) -> int:
    """The pick rule as every certificate states it, written from that text alone:
    fmix32(crc32(key, seed) ^ seed), MurmurHash3's 32-bit finalizer; a key over 256 bytes is its first
    and last 128 and its length."""
    import struct
    import zlib

    if len(line) > 256:  # the rule's key of a long line: its ends and its length
        line = line[:128] + line[-128:] + struct.pack("<Q", len(line))
    h = zlib.crc32(line, seed) ^ seed
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = ((h ^ (h >> shift)) * factor) % 2**32
    return h ^ (h >> 16)


def test_the_records_checked_are_those_the_stated_rule_picks(tmp_path):
    """A pretraining run picks its records a chunk at a time (`sample.record_hashes`): the lines its
    certificate says it checked are exactly those whose hash under the stated seed falls below
    rate × 2³², over several chunks and workers, and the batch hash is the one-record one."""
    from _helpers import manifest, pretrain, write_jsonl as write
    from qwen_data.certify.sample import Sampling, numbers, record_hash, record_hashes, record_key
    from qwen_data.inputs.records import Record

    rng = np.random.default_rng(5)
    path = write(tmp_path / "many.jsonl", [{"text": f"record {i} " + "x" * int(rng.integers(1, 40 if i % 3 else 600))}
                                           for i in range(9000)])
    out = manifest(pretrain([path], tmp_path / "o", "--workers", "2", "--chunk-mb", "0.05"))
    sample, lines = out["certificate"]["sample"], out["certificate"]["lines_checked"]
    assert 0 < sample["rate"] < 1
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")[:-1]
    below = int(sample["rate"] * 2**32)
    expected = [k + 1 for k, line in enumerate(raw) if _fmix32_rule(line, sample["seed"]) < below]
    assert numbers(next(iter(lines.values()))) == expected and len(expected) > 1000
    lines = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 600, 400)]
    records = [Record(1, line, None, len(line)) for line in lines]
    lines += [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in (255, 256, 257, 263, 264, 265, 100_000)]
    records = [Record(1, line, None, len(line)) for line in lines]
    for seed in (0, 1, 12345, 2**32 - 1):  # (C: `_native.key_hashes`, against the rule written here)
        assert record_hashes([record_key("f", r) for r in records], seed).tolist() == [
            record_hash("f", r, seed) for r in records] == [_fmix32_rule(line, seed) for line in lines]
        assert record_hashes(lines, seed, lines=True).tolist() == [_fmix32_rule(line, seed) for line in lines]
    assert record_hash("f", records[0], 2**40) == _fmix32_rule(lines[0], 2**40)  # a recheck's wider seed
    # an SFT worker's picker, a record at a time, picks what the rule picks (its line; a row by file:row)
    sampling = Sampling([], [len(records) * 40])  # (a rate below 1)
    rows = [Record(k + 1, None, {"k": k}, 10) for k in range(400)]
    for path in ("f", "g"):
        picks = sampling.picker(path)
        assert [picks(r) for r in records] == [_fmix32_rule(line, sampling.seed) < sampling.below for line in lines]
        assert [picks(r) for r in rows] == [record_hash(path, r, sampling.seed) < sampling.below for r in rows]
        assert 0 < sum(map(picks, records)) < len(records)


def test_the_runs_line_rounds_the_chance_down():
    """The last line's chance is the certificate's `detection` rounded down: 2,974 records checked give 94.9%,
    which "95%" would overstate."""
    from qwen_data.cli import _certificate_line
    from qwen_data.certify.sample import detection

    found = detection(2974, 100_000)
    line = _certificate_line({"certified": True, "records_spelled": 100_000, "records_checked": 2974,
                              "reference": {"tokenizers": "0"}, "detection": found})
    assert found["0.1%"] < 0.95 and "a chance of 94% or more" in line
    every = dict(found, **{"0.1%": 1.0})
    assert "a chance of 100%)" in _certificate_line({"certified": True, "records_spelled": 10, "records_checked": 10,
                                                    "reference": {"tokenizers": "0"}, "detection": every})


RESEGMENTING = '''
import numpy as np
from qwen_data.text.tokenizer import QwenTokenizer, as_str

encode_batch = QwenTokenizer.encode_batch


def resegmented(self, texts, special="parse"):  # " hello" as " hel" + "lo" in record 57: the same bytes
    if not any(as_str(text).startswith("record 57 ") for text in texts):
        return encode_batch(self, texts, special)
    hello, pieces = encode_batch(self, [" hello"], special)[0][0], encode_batch(self, [" hel", "lo"], special)[0]
    ids, lengths = encode_batch(self, texts, special)  # (last: the tokenizer keeps the texts it encoded last)
    out, ends = [], np.cumsum(lengths)
    for k, text in enumerate(map(as_str, texts)):
        own = ids[ends[k] - lengths[k]:ends[k]]
        if text.startswith("record 57 "):
            at = int(np.flatnonzero(own == hello)[0])
            own = np.concatenate([own[:at], pieces, own[at + 1:]]).astype(np.int32)
        out.append(own)
    return np.concatenate(out), np.asarray([len(o) for o in out], dtype=np.int64)


QwenTokenizer.encode_batch = resegmented
'''


def test_a_run_of_its_own_finds_other_pieces_in_its_checking_processes(tmp_path):
    """A command run on its own hands each chunk's picked records to checking processes of their own, as its
    workers pickled them: ids that spell the same bytes in other pieces, in one record of a run of many
    chunks and two workers, fail it naming that record's file:line (the encoder changed in every process of
    the run by a sitecustomize)."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RESEGMENTING, encoding="utf-8")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"record {k} says hello to you, " + "word " * 80}
                                                for k in range(200)])
    command = [sys.executable, "-m", "qwen_data", "pretrain", corpus, "--quiet", "--workers", "2",
               "--chunk-mb", "0.005"]
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    run = subprocess.run([*command, "-o", str(tmp_path / "bad")], capture_output=True, text=True, env=env)
    assert run.returncode == 2, run.stderr
    assert f"{corpus}:58: our ids differ from the reference's" in run.stderr
    good = subprocess.run([*command, "-o", str(tmp_path / "good")], capture_output=True, text=True)
    assert good.returncode == 0 and certificate(tmp_path / "good")["records_checked"] == 200, good.stderr


HELPING = '''
import os
import time

import numpy as np
from qwen_data.run import certifier
from qwen_data.certify import checks
from qwen_data.text.tokenizer import QwenTokenizer, as_str

certifier.HELPER_RECORDS = 1  # helpers for whatever is left when the workers are done
certifier.PART_RECORDS = 2  # parts the workers hand over: each split between the checking process and a helper
check, encode_batch = checks.TextChecks.check, QwenTokenizer.encode_batch


def slow(self, items):  # a slow reference: the checking process is still behind when the workers are done
    time.sleep(0.005 * len(items))
    with open(os.environ["CHECKED_LOG"], "a") as log:
        log.writelines(f"{os.getppid()} {where}\\n" for where, _ in items)
    return check(self, items)


def resegmented(self, texts, special="parse"):  # " hello" as " hel" + "lo" from record BAD_FROM on: the same bytes
    ids, lengths = encode_batch(self, texts, special)
    bad = [t.startswith("record ") and int(t.split()[1]) >= int(os.environ.get("BAD_FROM", "1000000"))
           for t in map(as_str, texts)]
    if not any(bad):
        return ids, lengths
    hello, pieces = encode_batch(self, [" hello"], special)[0][0], encode_batch(self, [" hel", "lo"], special)[0]
    ids, lengths = encode_batch(self, texts, special)
    out, ends = [], np.cumsum(lengths)
    for k, own in enumerate(ids[ends[k] - lengths[k]:ends[k]] for k in range(len(texts))):
        if bad[k]:
            at = int(np.flatnonzero(own == hello)[0])
            own = np.concatenate([own[:at], pieces, own[at + 1:]]).astype(np.int32)
        out.append(own)
    return np.concatenate(out), np.asarray([len(o) for o in out], dtype=np.int64)


checks.TextChecks.check = slow
QwenTokenizer.encode_batch = resegmented
'''


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="helpers take the cores the workers leave: one has none")
def test_a_checking_process_behind_at_the_end_shares_what_is_left_with_helpers(tmp_path):
    """A checking process still behind when the workers are done forks helpers, which check parts of what is
    left beside it (a slow reference, by a sitecustomize in every process of a run of its own): every record
    is checked, by it or a helper, and a record whose ids differ fails the run, named.
    (`test_helpers_answer_in_the_order_of_the_items`: which record is named.)"""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HELPING, encoding="utf-8")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": f"record {k} says hello to you, " + "word " * 80}
                                                for k in range(200)])
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]

    def run(name: str, **env):
        log = tmp_path / f"{name}.log"
        command = [sys.executable, "-m", "qwen_data", "pretrain", corpus, "--quiet", "--workers", "2",
                   "--chunk-mb", "0.005", "-o", str(tmp_path / name)]
        done = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={
            **os.environ, "PYTHONPATH": os.pathsep.join(paths), "CHECKED_LOG": str(log), **env})
        stderr = done.communicate()[1]
        lines = [line.split() for line in log.read_text().splitlines()]
        return done.returncode, stderr, [where for parent, where in lines if int(parent) != done.pid]

    status, stderr, by_helpers = run("good")
    assert status == 0, stderr
    assert certificate(tmp_path / "good")["records_checked"] == 200  # the helpers' counts summed with its own
    assert by_helpers  # the checking process (the run's child) had helpers (its children)
    status, stderr, by_helpers = run("bad", BAD_FROM="150")  # records 150 on differ, checked once helpers are there
    assert status == 2 and f"{corpus}:151: our ids differ from the reference's" in stderr, stderr
    assert by_helpers and "Traceback" not in stderr  # (the helpers end quietly with the checking process)


def test_helpers_answer_in_the_order_of_the_items(monkeypatch):
    """A checking process with helpers cuts each batch in order, a part for itself and one for each helper,
    sums their counts and answers the first mismatch in the items' order, whichever process found it (a
    checker that marks given items as differing stands for the reference)."""
    import psutil

    from qwen_data.certify import checks

    class Marking:
        def check(self, items):
            bad = [where for where, value in items if value == "bad"]
            return {"records_checked": len(items)}, (f"{bad[0]}: differs" if bad else None)

    monkeypatch.setattr(checks, "_CHECKS", Marking())
    monkeypatch.setattr(checks, "_HELPERS", [])
    before = {p.pid for p in psutil.Process().children()}
    assert checks.check_in_side(("helpers", 2)) is None and len(checks._HELPERS) == 2
    try:
        batch = lambda *bad: [(f"f:{k}", "bad" if k in bad else "good") for k in range(6)]  # noqa: E731
        assert checks.check_in_side(batch()) == ({"records_checked": 6}, None)
        assert checks.check_in_side(batch(3, 5)) == ({"records_checked": 4}, "f:3: differs")  # parts 0-1, 2-3, 4-5
        assert checks.check_in_side(batch(1, 4)) == ({"records_checked": 2}, "f:1: differs")
    finally:
        for helper in checks._HELPERS:
            helper.close()  # each helper ends, and is waited for here (no zombie left to the tests after)
        for forked in [p for p in psutil.Process().children() if p.pid not in before]:
            os.waitpid(forked.pid, 0)
