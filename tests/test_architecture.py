"""The shape of the code: data flows one way, so the package's imports form no circle, and test
modules share helpers through `_helpers`/`_conversations`/`_oracles`, never through each other."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

from _helpers import REPO_ROOT

PACKAGES = {"qwen_data": "qwen_data", "qwen_data_train": "train"}  # installed name: folder


def _module_name(package: str, path: Path) -> str:
    parts = (package,) + path.relative_to(REPO_ROOT / PACKAGES[package]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The known modules `path` imports, at any depth of its code (lazy imports count)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(package, p): p for package in PACKAGES for p in (REPO_ROOT / PACKAGES[package]).rglob("*.py")}
    return {name: _imports(path, name, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_imports_form_no_circle():
    graph = import_graph()
    assert "qwen_data.cli" in graph and "qwen_data.steps.sft" in graph["qwen_data.cli"]  # the graph is really read
    assert "qwen_data_train.loop" in graph["qwen_data.cli"] and "qwen_data.blend.files" in graph["qwen_data_train.data"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # The check can fail: a circle like the one cli.py and sft.py once formed is found.
    assert find_cycle({**graph, "qwen_data.steps.sft": graph["qwen_data.steps.sft"] | {"qwen_data.cli"}})


def test_no_test_module_imports_another():
    tests = {p.stem for p in (REPO_ROOT / "tests").glob("test_*.py")}
    for path in (REPO_ROOT / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not (set(names) & tests), f"{path.name} imports {set(names) & tests}"


def test_the_train_stage_installs_under_its_own_name(tmp_path):
    """A top-level `train` in site-packages would shadow (or be shadowed by) any other project's."""
    outside = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('train'))"],
                             cwd=tmp_path, capture_output=True, text=True, check=True)
    assert outside.stdout.strip() == "None"
    assert Path(importlib.util.find_spec("qwen_data_train").origin).parent == REPO_ROOT / "train"
