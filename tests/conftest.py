import glob
import json
import os
import re
import sys

import pytest

# Tests import their helpers (multilingual.py ...) by plain name.
sys.path.insert(0, os.path.dirname(__file__))

CORRUPTS = "corrupts_outputs"
SLOW = "slow"
# A module whose tests start torch, megatron-core models, torchrun or Ray is marked slow (`pytestmark`):
# the slow tier. The rest is the fast tier (`-m "not slow"`), the one to run while changing the data
# side. A module that imports what starts them and is not marked is refused at collection (`unmarked`).
STARTS_SLOW = re.compile(r"^(import|from) (torch|ray)\b|^(import|from) _train\b|\bray_instance\b", re.M)


def pytest_configure(config):
    config.addinivalue_line("markers", f"{CORRUPTS}: the test damages qwen-data outputs, or writes ones "
                                       "qwen-data never would, on purpose: they are not verified after it")
    config.addinivalue_line("markers", f"{SLOW}: torchrun, training, megatron-core models or Ray; "
                                       "the fast tier is -m 'not slow'")


def unmarked(source: str) -> bool:
    """Whether a test module's source starts torch, torchrun or Ray without being marked slow."""
    return bool(STARTS_SLOW.search(source)) and not re.search(r"^pytestmark = pytest\.mark\.slow\b", source, re.M)


def pytest_collection_modifyitems(config, items):
    for path in sorted({str(item.fspath) for item in items}):
        with open(path, encoding="utf-8") as f:
            if unmarked(f.read()):
                raise pytest.UsageError(f"{path} starts torch, torchrun or Ray: mark it "
                                        "`pytestmark = pytest.mark.slow` (the slow tier)")


def written_prefixes(directory):
    """Every qwen-data prefix under `directory`: a PREFIX.json manifest next to PREFIX.idx."""
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(str(directory)), "**", "*.json"), recursive=True)):
        prefix = path[: -len(".json")]
        if not os.path.isfile(prefix + ".idx"):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                if json.load(f).get("format") == "qwen-data/1":
                    found.append(prefix)
        except (ValueError, AttributeError):
            continue
    return found


def assert_verified(directory):
    from qwen_data.tools.verify import verify

    problems = [p for prefix in written_prefixes(directory) for p in verify(prefix)]
    assert not problems, "qwen-data verify fails on outputs written here:\n" + "\n".join(problems)


_per_test_dirs = set()


@pytest.fixture(autouse=True)
def verify_written_outputs(request):
    """After a test that used tmp_path: `qwen-data verify` passes on every prefix it wrote."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")  # now, so that it is torn down after this check
    _per_test_dirs.add(str(tmp_path))
    yield
    if request.node.get_closest_marker(CORRUPTS) is None:
        assert_verified(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def verify_module_outputs(request, tmp_path_factory):
    """After a module: the same for the directories its module fixtures made (tmp_path_factory.mktemp)."""
    base = tmp_path_factory.getbasetemp()
    before = set(os.listdir(base))
    yield
    skip = request.node.get_closest_marker(CORRUPTS) is not None
    for name in sorted(set(os.listdir(base)) - before):
        directory = os.path.join(base, name)
        # (pytest adds NAMEcurrent links to per-test directories)
        if directory not in _per_test_dirs and not os.path.islink(directory) and not skip:
            assert_verified(directory)


@pytest.fixture(scope="session", autouse=True)
def reference_held_once():
    """Each test process loads the certificate's reference (HF `tokenizers` over the bundled
    tokenizer.json, ~0.5 s) once. Its in-process runs then check in this process, as a second run
    in one process does (`Certifier.early`), instead of each forking a checking process that loads
    it again. Tests of that checking process empty the cache themselves (`reference._LOADED`)."""
    from qwen_data.certify.reference import preload
    from qwen_data.text.tokenizer import resolve_tokenizer_dir

    preload(os.path.join(resolve_tokenizer_dir(None)[1], "tokenizer.json"))
