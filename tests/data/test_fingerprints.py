"""The bytes qwen-data writes for the bundled examples, pinned, and the fingerprint that vouches for them.

A fingerprint is a sha256 over each channel's .idx sha256 and .bin hash (both channels for SFT), so
equal fingerprints mean byte-identical outputs. The .bin hash was a sha256 until qwen-data 0.4 and is
now joinable (`formats.digest`): PINNED are the old fingerprints, computed from the files (pinned with
qwen-data 0.2.0, before the pipelines were rebuilt on one core: the bytes have not changed since),
PINNED_JOINABLE the manifests' now. A refactor must leave both unchanged; a change that alters the
data on purpose updates them and says why.
"""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
from _helpers import corpus, manifest, pretrain

from qwen_data.cli import main
from qwen_data.formats import digest
from qwen_data.formats.manifest import fingerprint
from qwen_data.tools.verify import verify

PINNED = {
    ("pretrain",): "7beda94a4f2654a02a9f80bfebc081608614617447f6e164df338d2e62da1fb0",
    ("sft", "--template", "qwen2p5"): "87fbca55639d76a6467fd30c16e6c55bcca82d0ce3aed24522c20c8d4025709a",
    ("sft", "--template", "qwen2p5", "--seq-length", "512", "--pack"):
        "6ae67c3432160a66971550d936e10c5e73fa797793fcf93adeca9e00f985d18d",
    ("sft", "--template", "qwen3"): "085c1187944731219593c4577b550fdfb2f09b3a790b80878b535977014c620b",
    ("sft", "--template", "qwen3", "--seq-length", "512", "--pack"):
        "7a5f2af484b734afe3b2cd08493d44658c6b4fd34c70ae2fb65ada154f5511f9",
}


PINNED_JOINABLE = {
    ("pretrain",): "47cd2970bae557404ebc42f7b3634db271b60dfbab8260b89899a84ee624d8d5",
    ("sft", "--template", "qwen2p5"): "64b675dc870d03cf1971c5df34358928680eef95df40814e557ae39f503fe70b",
    ("sft", "--template", "qwen2p5", "--seq-length", "512", "--pack"):
        "e1f548cdd692a8614b467a9276828dc244cb8eb009f2a72dec5ddd478b8a07d4",
    ("sft", "--template", "qwen3"): "ce3fb9cb987b34a1dc1d43b1700d20ab421e578f7b44aaa9c105722786e399ad",
    ("sft", "--template", "qwen3", "--seq-length", "512", "--pack"):
        "0774d4435e5f1f391870d016cad84997140a1ee7cc3ed4f0afad1853d49e6d6b",
}


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _channels(prefix):
    return [prefix + c for c in ("", ".lossmask") if os.path.exists(prefix + c + ".bin")]


def _old_fingerprint(prefix):
    """The fingerprint qwen-data < 0.4 wrote: a sha256 of every .bin."""
    return fingerprint([(_sha256(c + ".idx"), _sha256(c + ".bin")) for c in _channels(prefix)])


@pytest.mark.parametrize("args", list(PINNED), ids=lambda a: "-".join(x.lstrip("-") for x in a))
def test_bundled_examples_give_the_pinned_bytes(tmp_path, args):
    assert main([args[0], "--quiet", "-o", str(tmp_path / "out"), *args[1:]]) == 0
    with open(tmp_path / "out.json", encoding="utf-8") as f:
        assert json.load(f)["fingerprint"] == PINNED_JOINABLE[args]
    assert _old_fingerprint(str(tmp_path / "out")) == PINNED[args]


def _polynomial(data: bytes) -> str:
    """The joinable hash by its definition, one byte at a time."""
    h = [0, 0]
    for b in data:
        h = [(a * x + b) % digest.P for a, x in zip(h, digest.POINTS)]
    return f"p61x2:{len(data)}:{h[0]:016x}:{h[1]:016x}"


def _block_loops() -> list[str]:
    """The hash's block loops this machine runs (`_native.poly_path`)."""
    from qwen_data._native import poly_path

    now, runs = poly_path(), []
    for name in ("avx2", "sse2", "scalar"):
        try:
            runs.append(poly_path(name))
        except ValueError:
            pass
    poly_path(now)
    return runs


@pytest.mark.parametrize("loop", _block_loops())
def test_the_joinable_hash_is_its_definition_and_joins_at_every_cut(loop):
    from qwen_data._native import poly_path

    rng, before = random.Random(3), poly_path(loop)
    # around the 512-byte blocks of the SIMD loops, and bytes of 255 where a block's sums are largest
    sizes = (0, 1, 7, 8, 9, 15, 16, 17, 33, 300, 511, 512, 513, 1024, 1535, 2600)
    try:
        for data in [bytes(rng.randrange(256) for _ in range(n)) for n in sizes] + [b"\xff" * 2048]:
            _hashes_as_defined(data, cuts=range(0, len(data) + 1, 1 + len(data) // 40))
    finally:
        poly_path(before)


def _hashes_as_defined(data: bytes, cuts) -> None:
    whole = digest.BinDigest()
    whole.update(data)
    assert whole.hexdigest() == _polynomial(data)
    for cut in cuts:
        parts = [digest.BinDigest(), digest.BinDigest()]
        parts[0].update(data[:cut])
        parts[1].update(data[cut:])
        assert digest.join([p.hexdigest() for p in parts]) == whole.hexdigest()


def test_the_c_loops_points_are_the_ones_stated_in_python():
    x = digest.BinDigest()
    x.update(b"\x01\x00")  # 1 * X + 0
    assert [int(h, 16) for h in x.hexdigest().split(":")[2:]] == list(digest.POINTS)


def test_a_file_hashed_by_ranges_in_threads_is_hashed_whole(tmp_path, monkeypatch):
    data = random.Random(4).randbytes(1_000_003)
    (tmp_path / "x.bin").write_bytes(data)
    monkeypatch.setattr(digest, "RANGE_BYTES", 4096)
    assert digest.file_digest(str(tmp_path / "x.bin"), threads=4) == digest.file_digest(str(tmp_path / "x.bin"), threads=1)
    whole = digest.BinDigest()
    whole.update(data)
    assert digest.file_digest(str(tmp_path / "x.bin"), threads=4) == whole.hexdigest()


def _as_before_0_4(prefix):
    """The manifest as qwen-data < 0.4 wrote it: no digests, the fingerprint over each .bin's sha256."""
    m = manifest(prefix)
    for name in ("digests", "fingerprint_scheme"):
        m.pop(name)
    m["fingerprint"] = _old_fingerprint(prefix)
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(m, f)


@pytest.mark.corrupts_outputs  # a part's .bin edited
def test_prefixes_with_a_sha256_of_each_bin_still_verify_and_merge_into_one_runs_fingerprint(tmp_path):
    from qwen_data.formats.integrity import check_prefixes
    from qwen_data.formats.manifest import Manifest

    text = corpus(tmp_path / "c.jsonl", seed=6, documents=40, longest=60)
    shards = [pretrain([text], tmp_path / f"s{k}", "--shard", f"{k}/2") for k in range(2)]
    for shard in shards:
        _as_before_0_4(shard)
        assert verify(shard) == []
        assert check_prefixes([(shard, Manifest.read(shard))])[0].problem is None
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / "m")]) == 0
    assert manifest(tmp_path / "m")["fingerprint"] == manifest(pretrain([text], tmp_path / "one"))["fingerprint"]
    with open(shards[1] + ".bin", "r+b") as f:  # an old part whose .bin changed is refused, as it was
        f.seek(8)
        f.write(b"\x07")
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / "m2")]) == 2


@pytest.mark.corrupts_outputs  # a part's .bin edited
def test_a_merge_reads_no_bin_byte_and_a_part_changed_since_fails_verify_of_the_output(tmp_path):
    """The output's .bin hash is the parts' recorded ones joined: their .bin are moved by the kernel
    (copy_file_range), never read by the process, and a part edited after it was made is not vouched
    for: the merged prefix fails `verify` (and train's check)."""
    text = corpus(tmp_path / "c.jsonl", seed=7, documents=60, longest=80)
    shards = [pretrain([text], tmp_path / f"s{k}", "--shard", f"{k}/3") for k in range(3)]
    command = [sys.executable, "-m", "qwen_data.cli", "merge", "--quiet", *shards, "-o", str(tmp_path / "m")]
    if shutil.which("strace") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is not installed: this test needs it")
        pytest.skip("strace is not installed")
    log = tmp_path / "strace.log"
    done = subprocess.run(["strace", "-f", "-y", "-o", str(log), "-e", "trace=read,pread64,readv,preadv,preadv2,mmap",
                           *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    traced = log.read_text()
    reads_of_bins = [line for line in traced.splitlines() if ".bin>" in line and "(" in line]
    assert reads_of_bins == [], reads_of_bins[:5]
    assert manifest(tmp_path / "m")["fingerprint"] == manifest(pretrain([text], tmp_path / "one"))["fingerprint"]
    assert verify(str(tmp_path / "m")) == []
    with open(shards[1] + ".bin", "r+b") as f:
        f.seek(12)
        byte = f.read(1)
        f.seek(12)
        f.write(bytes([byte[0] ^ 1]))
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / "m3")]) == 0
    problems = verify(str(tmp_path / "m3"))
    assert problems and "m3.bin" in problems[0] and "no longer hash" in problems[0], problems


@pytest.mark.corrupts_outputs  # a manifest edited to another flavour
def test_parts_made_with_a_copied_tokenizer_or_the_hf_backend_merge_into_one_runs_bytes(tmp_path, capsys):
    """A tokenizer is its files' content and flavour: not where the files lay, nor which backend encoded
    (both give the same ids). A merge that refuses names the field that differs and both values."""
    from _helpers import copy_prefix, corpus, manifest, pretrain

    from qwen_data.text.tokenizer import bundled_tokenizer_dir
    from qwen_data.tools.verify import verify

    copied = str(shutil.copytree(bundled_tokenizer_dir(), tmp_path / "tokenizer"))
    text = corpus(tmp_path / "c.jsonl", seed=5, documents=30, longest=30)
    shards = [pretrain([text], tmp_path / "s0", "--shard", "0/2", "--tokenizer", copied),
              pretrain([text], tmp_path / "s1", "--shard", "1/2", "--backend", "hf")]
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / "m")]) == 0
    assert manifest(tmp_path / "m")["fingerprint"] == manifest(pretrain([text], tmp_path / "one"))["fingerprint"]
    assert verify(str(tmp_path / "m")) == []
    other = copy_prefix(shards[1], str(tmp_path / "q25"), lambda m: m["tokenizer"].update(flavour="qwen2.5"))
    capsys.readouterr()
    assert main(["merge", "--quiet", shards[0], other, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{other} and {shards[0]} were made differently: tokenizer.flavour 'qwen2.5' vs 'qwen3'" in err, err
    assert not os.path.exists(tmp_path / "x.json")
