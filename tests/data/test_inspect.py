"""`qwen-data inspect`, `stats` and the HTML report, against the real readers: megatron-core's
IndexedDataset for rows and masks, HF `tokenizers` for decoded text, the blend command's own budget,
and headless Chromium for the report as a browser shows it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from _helpers import chats, pretrain, sft, write_jsonl
from multilingual import corpus as multilingual_corpus

from qwen_data.cli import main
from qwen_data.tools.samples import Samples

WORKED = {"instruction": "Translate the sentence into French.", "input": "The library opens at nine.",
          "output": "La bibliothèque ouvre à neuf heures."}
WORKED_PLAIN = """⟨<|im_start|>⟩system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.⟨<|im_end|>⟩
⟨<|im_start|>⟩user
Translate the sentence into French.
The library opens at nine.⟨<|im_end|>⟩
⟨<|im_start|>⟩assistant
[[La bibliothèque ouvre à neuf heures.⟨<|im_end|>⟩
]]
"""
TRAINED_TEXT = "La bibliothèque ouvre à neuf heures."
PAI_LIKE = ("--assistant-span", "turn", "--input-separator", "", "--overlong", "truncate")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    records = chats(d / "chats.jsonl", seed=3, count=60, longest=40)
    worked = write_jsonl(d / "worked.jsonl", [WORKED])
    return {
        "dir": d,
        "worked": sft([worked], d / "worked"),
        "worked_all": sft([worked], d / "worked_all", "--mask", "all"),
        "chat": sft([records], d / "chat"),
        "packed": sft([records], d / "packed", "--seq-length", 256, "--pack"),
        "pai": sft([records], d / "pai", "--layout", "pai", "--seq-length", 256, "--pack", "--packing", "next-fit"),
        "pai_samples": sft([records], d / "pai_samples", "--seq-length", 256, *PAI_LIKE),
        "web": pretrain([write_jsonl(d / "web.jsonl", [{"text": t} for t in multilingual_corpus(60, specials=False)])],
                        d / "web"),
    }


def run(capsys, *argv) -> str:
    assert main(list(map(str, argv))) == 0
    return capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Rows read back


def test_rows_are_what_megatron_reads(data):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = data["packed"]
    ids, mask, samples = IndexedDataset(prefix), IndexedDataset(prefix + ".lossmask"), Samples(prefix)
    assert len(samples) == len(ids.document_indices) - 1 > 1
    padded = 0
    for i in range(len(samples)):
        row = samples.row(i)
        first, last = ids.document_indices[i], ids.document_indices[i + 1]
        assert np.array_equal(row.tokens, np.concatenate([ids[j] for j in range(first, last)]))
        assert np.array_equal(row.trained, np.concatenate([mask[j] for j in range(first, last)]).astype(bool))
        assert len(row.tokens) == 256
        lengths = ids.sequence_lengths[first:last]
        assert list(row.samples) == list(lengths[:len(row.samples)])
        if row.padding:
            padded += 1
            assert (row.tokens[-row.padding:] == samples.pad_id).all() and row.padding == lengths[-1]
        assert samples.pad_id not in row.tokens[:256 - row.padding]
    assert padded  # the check of padding ran
    unpacked = Samples(data["chat"]).sample_lengths()  # no --seq-length: the longest samples are kept there
    assert sorted(samples.sample_lengths()) == sorted(unpacked[unpacked <= 256]) and unpacked.max() > 256


def test_pai_rows_hold_the_samples_in_order(data):
    """Pai rows (next-fit keeps input order) split back into samples: the samples of the same records
    written unpacked in the mask layout with Pai's rendering, ids and trained tokens alike."""
    pai, plain = Samples(data["pai"]), Samples(data["pai_samples"])
    got = [(row.tokens[a:b], row.trained[a:b]) for row in map(pai.row, range(len(pai))) for a, b in row.spans()]
    want = [(row.tokens, row.trained) for row in map(plain.row, range(len(plain)))]
    assert len(got) == len(want) > len(pai)
    for (ids, trained), (want_ids, want_trained) in zip(got, want):
        assert np.array_equal(ids, want_ids)
        assert np.array_equal(trained, want_trained)
    assert np.array_equal(pai.sample_lengths(), plain.sample_lengths())


# ---------------------------------------------------------------------------------------------
# inspect


def test_worked_example(data, capsys):
    out = run(capsys, "inspect", data["worked"], "--plain")
    assert out.startswith(f"{data['worked']}: SFT, template qwen2p5, mask layout, one sample a row; 1 row, 55 tokens")
    assert WORKED_PLAIN in out
    # The same record trained on everything (the mask over the prompt): seen at once.
    everything = run(capsys, "inspect", data["worked_all"], "--plain")
    assert "[[⟨<|im_start|>⟩system\nYou are Qwen" in everything and "The library opens at nine." in everything
    assert WORKED_PLAIN not in everything


def test_text_is_hfs_decoding(data, capsys):
    """Marks taken away ([[…]] and ⟨…⟩ around control ids), inspect prints exactly what HF decodes the row's
    ids to."""
    from tokenizers import Tokenizer

    from qwen_data.formats.manifest import Manifest
    from qwen_data.text.tokenizer import directory_of

    hf = Tokenizer.from_file(os.path.join(directory_of(Manifest.read(data["web"]).tokenizer), "tokenizer.json"))
    samples = Samples(data["web"])
    for i in range(len(samples)):
        out = run(capsys, "inspect", data["web"], "--index", i, "--plain")
        body = out.split("═\n", 1)[1].rstrip("\n")
        want = hf.decode(samples.row(i).tokens.tolist(), skip_special_tokens=False)
        assert body.replace("⟨", "").replace("⟩", "") == f"[[{want}]]", i
        assert want.endswith("<|endoftext|>") and body.endswith("⟨<|endoftext|>⟩]]")


def test_packed_rows_show_samples_and_padding(data, capsys):
    samples = Samples(data["packed"])
    i = next(i for i in range(len(samples)) if samples.row(i).padding)
    row = samples.row(i)
    out = run(capsys, "inspect", data["packed"], "--index", i, "--plain")
    for n in range(1, len(row.samples) + 1):
        assert f"── sample {n} of {len(row.samples)}: {row.samples[n - 1]:,} tokens" in out
    assert f"── padding: {row.padding:,} tokens" in out
    assert f"⟨<|vision_pad|>⟩×{row.padding}" in out
    assert out.count("[[") == out.count("]]") >= len(row.samples)


def test_colour_marks_the_same_tokens(data):
    """In a terminal the trained tokens are bold green; colour taken away, the text is --plain's
    without its brackets and the ⟨…⟩ around control ids (colour tells those apart)."""
    from qwen_data.tools.inspect import Inspector, terminal

    inspector = Inspector(data["packed"])
    coloured, plain = terminal(inspector, [0], colour=True, ids=False), terminal(inspector, [0], colour=False, ids=False)
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    green = "".join(re.findall(r"\x1b\[1;32m(.*?)\x1b\[0m", coloured, re.S))
    plain = plain.replace("⟨", "").replace("⟩", "")
    bracketed = re.findall(r"\[\[(.*?)\]\]", plain, re.S)
    assert bracketed and ansi.sub("", green) == "".join(bracketed)
    assert ansi.sub("", coloured) == plain.replace("[[", "").replace("]]", "")


@pytest.mark.parametrize("name", ["packed", "pai"])
def test_ids_give_the_row_back(data, capsys, name):
    samples = Samples(data[name])
    out = run(capsys, "inspect", data[name], "--index", 0, "--ids", "--plain")
    ids = []
    for count, token in re.findall(r"(?:×(\d+))?\{(\d+)\}", out):
        ids += [int(token)] * int(count or 1)
    assert ids == samples.row(0).tokens.tolist()


def test_random_rows(data, capsys):
    first = run(capsys, "inspect", data["chat"], "--random", 3, "--seed", 7, "--plain")
    assert first == run(capsys, "inspect", data["chat"], "--random", 3, "--seed", 7, "--plain")
    shown = re.findall(r"══ row (\d+):", first)
    assert len(set(shown)) == 3 and shown == sorted(shown, key=int)


def test_refusals(data, capsys):
    assert main(["inspect", data["chat"], "--index", "100000"]) == 2
    err = capsys.readouterr().err
    assert data["chat"] in err and "no row 100000" in err
    assert main(["stats", str(data["dir"] / "nothing")]) == 2
    assert "no manifest" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# stats


def test_stats_of_a_prefix(data, capsys):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from qwen_data.tools.stats import prefix_stats

    prefix = data["packed"]
    ids, mask = IndexedDataset(prefix), IndexedDataset(prefix + ".lossmask")
    pad = Samples(prefix).pad_id
    lengths = np.array([len(ids[j]) for j in range(len(ids)) if ids[j][0] != pad])
    s = prefix_stats(prefix)
    assert (s.documents, s.samples) == (len(ids.document_indices) - 1, len(lengths))
    assert s.tokens == lengths.sum() and s.pad_tokens == len(ids) * 0 + ids.sequence_lengths.sum() - lengths.sum()
    assert s.trained == sum(int(mask[j].sum()) for j in range(len(mask)))
    assert s.percentiles[50] == int(np.percentile(lengths, 50, method="inverted_cdf"))
    assert s.percentiles[100] == lengths.max() and s.histogram[0].sum() == len(lengths)
    out = run(capsys, "stats", prefix)
    assert f"trained {s.trained:,} ({s.trained / s.tokens:.1%})" in out and f"packed: {s.documents:,} rows of 256" in out


@pytest.mark.parametrize("n", [1, 2, 7, 30, 1001, 250_000])
def test_stats_lengths_are_numpys_counted_a_chunk_at_a_time(n, monkeypatch):
    """Counted by length a chunk at a time (no list of every length), the percentiles, mean and histogram
    are numpy's over all the lengths at once, lengths beyond the dense counts included."""
    from qwen_data.tools import stats

    monkeypatch.setattr(stats, "DENSE", 1000)
    rng = np.random.default_rng(n)
    lengths = np.where(rng.random(n) < 0.05, rng.integers(1000, 5000, n), rng.integers(0, 1000, n))
    counts = stats.LengthCounts()
    for start in range(0, n, 977):
        counts.add(lengths[start:start + 977])
    percents = list(range(101)) + [99.9, 0.1, 33.3]
    assert counts.percentiles(percents) == [int(v) for v in np.percentile(lengths, percents, method="inverted_cdf")]
    assert (counts.samples, counts.tokens) == (n, lengths.sum())
    binned, edges = counts.histogram(6000)
    width = edges[1]
    assert width == 300 and np.array_equal(binned, np.bincount(lengths // width, minlength=stats.BINS))


def test_stats_of_what_is_not_a_prefix_says_what_to_give(capsys, tmp_path):
    text = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    (tmp_path / "notes.txt").write_text("hello world\n")
    (tmp_path / "bad.json").write_text("{")
    for target, says in ((text, "neither a prefix (PREFIX.bin/.idx/.json) nor a blend file"),
                         (str(tmp_path), "a directory, not a prefix"),
                         (str(tmp_path / "notes.txt"), "not a blend of qwen-data prefixes: hello: no manifest"),
                         (str(tmp_path / "bad.json"), "not a per-split blend (JSON)"),
                         (str(tmp_path / "none"), "no manifest")):
        assert main(["stats", target]) == 2
        err = capsys.readouterr().err
        assert f"qwen-data stats: error: {target}" in err and says in err, err


def test_stats_count_rejects_by_reason(data, capsys):
    records = write_jsonl(data["dir"] / "mixed.jsonl", [WORKED, WORKED | {"output": "word " * 300}, {"nothing": 1}])
    prefix = sft([records], data["dir"] / "mixed", "--seq-length", 128)
    out = run(capsys, "stats", prefix)
    assert re.search(r"rejects: 2 \((?=.*too-long 1)(?=.*\S+ 1)", out), out


def test_stats_of_a_blend_with_a_budget(data, capsys):
    from qwen_data.blend.weights import Budget, budget_rows, weighed_blend
    from qwen_data.tools.stats import blend_stats

    blend = str(data["dir"] / "blend.json")
    train = [f"{data['chat']}=0.3", f"{data['packed']}=0.7"]
    run(capsys, "blend", *train, "-o", blend)
    budget = Budget(tokens=50_000)
    want = budget_rows(weighed_blend(train), budget)
    got = blend_stats(blend, budget)
    assert [r.prefix for r in got.budget] == [r.prefix for r in want]
    for g, w in zip(got.budget, want):
        assert g.tokens == pytest.approx(w.tokens, rel=1e-9) and g.epochs == pytest.approx(w.epochs, rel=1e-9)
    out = run(capsys, "stats", blend, "--train-tokens", 50_000)
    assert "blend of 2 train source(s)" in out and "30.00%" in out and f"{want[1].epochs:.3f} epochs" in out


def test_png(data, capsys, tmp_path):
    from PIL import Image

    run(capsys, "stats", data["chat"], data["web"], "--png", tmp_path / "h.png")
    with Image.open(tmp_path / "h.png") as image:
        assert image.format == "PNG" and image.height > image.width / 2  # two panels


# ---------------------------------------------------------------------------------------------
# The report


class _Trained(HTMLParser):
    """The text inside <span class="t"> (trained) and outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.inside, self.outside = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "span" and (self.depth or ("class", "t") in attrs):
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "span" and self.depth:
            self.depth -= 1

    def handle_data(self, text):
        (self.inside if self.depth else self.outside).append(text)


def _spans(page: str) -> tuple[str, str]:
    parser = _Trained()
    parser.feed(page)
    return "".join(parser.inside), "".join(parser.outside)


def test_report_is_self_contained(data, capsys, tmp_path):
    blend = str(tmp_path / "b.json")
    run(capsys, "blend", data["chat"], data["packed"], "-o", blend)
    for target in (blend, data["pai"], data["worked"]):
        page_path = tmp_path / "r.html"
        run(capsys, "stats", target, "--html", page_path, *(["--train-tokens", 9000] if target == blend else []))
        page = page_path.read_text(encoding="utf-8")
        assert not re.search(r"(?:src|href)=\"(?!data:)", page) and "http" not in page.replace(
            "http-equiv", "")
        assert "<img" in page and '"fingerprint"' in page
        if target == blend:  # the shares of tokens and of trained tokens the weights draw, as `stats` gives them
            from qwen_data.tools.stats import blend_stats

            drawn = blend_stats(blend)
            assert "share of trained tokens" in page
            assert all(f"<td>{share:.2%}</td>" in page for share in drawn.trained_shares)
    inside, outside = _spans((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert inside and outside


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser(page: str, tmp_path, *args) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([_chromium(), *flags, *args, f"file://{page}"], capture_output=True, text=True,
                          timeout=120, check=True)


def _highlight_pixels(png: str) -> int:
    from PIL import Image

    from qwen_data.tools.report import TRAINED_BACKGROUND

    colour = tuple(int(TRAINED_BACKGROUND[i:i + 2], 16) for i in (1, 3, 5))
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"))
    return int((pixels == colour).all(axis=-1).sum())


def test_report_in_chromium(data, capsys, tmp_path):
    """The worked example's report as headless Chromium renders it: the page's text holds the sample,
    the trained answer inside the highlight and the prompt outside it, and the screenshot shows the
    highlight's colour (which a page without the highlight does not)."""
    if _chromium() is None:
        message = "headless Chromium is not installed (Debian package chromium): the report is not rendered"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (required under CI=true)", pytrace=False)
        pytest.skip(message)
    page = tmp_path / "report.html"
    run(capsys, "inspect", data["worked"], "--html", page)
    dom = _browser(page, tmp_path, "--dump-dom").stdout
    inside, outside = _spans(dom)
    assert TRAINED_TEXT in inside and "<|im_end|>" in inside
    assert "Translate the sentence into French." in outside and "Translate" not in inside
    shot = tmp_path / "shot.png"
    _browser(page, tmp_path, "--window-size=1280,1400", f"--screenshot={shot}")
    assert _highlight_pixels(shot) > 2000
    # The control: the same page with the highlight's style taken out shows none of its colour.
    from qwen_data.tools.report import TRAINED_BACKGROUND

    bare = tmp_path / "bare.html"
    bare.write_text(page.read_text(encoding="utf-8").replace(TRAINED_BACKGROUND, "transparent"), encoding="utf-8")
    _browser(bare, tmp_path, "--window-size=1280,1400", f"--screenshot={shot}")
    assert _highlight_pixels(shot) == 0
