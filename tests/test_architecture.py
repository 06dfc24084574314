"""The shape of the code: data flows one way, so the package's imports form no circle, each
subpackage imports only the rooms below it, and test modules share helpers through
`_helpers`/`_conversations`/`_oracles`, never through each other."""

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
            # `from . import marks` imports the module marks (the package only runs its __init__)
            targets = ([base] if node.module else []) + [f"{base}.{alias.name}" for alias in node.names]
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
    assert "qwen_data_train.commands" in graph["qwen_data.cli"]
    assert "qwen_data.blend.files" in graph["qwen_data_train.data"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # The check can fail: a circle like the one cli.py and sft.py once formed is found.
    assert find_cycle({**graph, "qwen_data.steps.sft": graph["qwen_data.steps.sft"] | {"qwen_data.cli"}})


# Who may import whom. A subpackage is one room, a module left flat a room of its own; each imports
# only the rooms listed: text and inputs under the steps (and under the tools: `verify --certify` reads
# a prefix's inputs again), the on-disk formats under everything that writes or reads them, the blend
# contract under the tools and the train stage, the CLI over all.
DATA_SIDE = {"qwen_data", "qwen_data.qwen", "qwen_data.errors", "qwen_data.options", "qwen_data.formats",
             "qwen_data.inputs", "qwen_data.text", "qwen_data.certify", "qwen_data.run", "qwen_data.steps",
             "qwen_data.blend", "qwen_data.tools"}
MAY_IMPORT = {
    "qwen_data": set(),
    "qwen_data.qwen": set(),
    "qwen_data.errors": set(),
    "qwen_data.options": set(),
    "qwen_data.formats": {"qwen_data", "qwen_data.qwen"},
    "qwen_data.inputs": {"qwen_data", "qwen_data.errors"},
    "qwen_data.text": {"qwen_data", "qwen_data.errors", "qwen_data.qwen"},
    # The certificate: what a run checks and proves, over what it reads and writes; the pipeline,
    # the steps' workers and the tools call it. (qwen_data, here and for text and the rooms above: the
    # compiled loops, `qwen_data._native`.)
    "qwen_data.certify": {"qwen_data", "qwen_data.errors", "qwen_data.qwen", "qwen_data.formats", "qwen_data.inputs",
                          "qwen_data.text"},
    "qwen_data.run": {"qwen_data.errors", "qwen_data.formats", "qwen_data.inputs", "qwen_data.text",
                      "qwen_data.certify"},
    "qwen_data.steps": {"qwen_data.errors", "qwen_data.qwen", "qwen_data.formats", "qwen_data.inputs",
                        "qwen_data.text", "qwen_data.certify", "qwen_data.run"},
    "qwen_data.blend": {"qwen_data", "qwen_data.formats"},
    "qwen_data.tools": {"qwen_data", "qwen_data.qwen", "qwen_data.formats", "qwen_data.inputs", "qwen_data.text",
                        "qwen_data.certify", "qwen_data.blend"},
    "qwen_data.cli": DATA_SIDE | {"qwen_data_train.commands"},
    # the command's entry: the certificate's checking process forked before the CLI's imports
    "qwen_data.launch": {"qwen_data.run", "qwen_data.cli"},
    "qwen_data.__main__": {"qwen_data.launch"},
    "qwen_data_train": set(),
}
# The train stage's rooms, floor by floor; each takes the data side's contract (TRAIN_MAY_IMPORT) and
# the rooms named. The plan decides before anything is built, so it sees no model, no process group;
# the model is built from a plan; the shapes and the marks stand on the ground, so Hugging Face
# folders, the loss and the gradients' reduction read them without the model's builder above them;
# Hugging Face folders never know the trainer, its checkpoints or its runs; only the loop, convert and
# the commands see the whole.
TRAIN_MAY_IMPORT = {"qwen_data.qwen", "qwen_data.options", "qwen_data.formats", "qwen_data.text", "qwen_data.blend"}
TRAIN_FLOORS = {
    "shapes": set(),
    "marks": set(),
    "thd": set(),  # numpy alone: packed rows' THD form for CUDA graphs
    "attention": {"thd"},
    "config": {"shapes"},
    "plan": {"attention", "config", "shapes"},
    "patches": {"attention", "kernels"},
    "model": {"attention", "config", "marks", "plan", "shapes"},
    "hf": {"marks", "shapes"},
    "kernels": set(),  # (Triton's, for the loss, the SwiGLU patch and AdamW)
    "loss": {"kernels", "marks"},
    "distributed": {"marks"},
    "data": {"config", "patches"},
    "loader": {"config", "data", "plan"},
    "step": {"attention", "distributed", "loss", "marks", "model"},
    "graphs": {"attention", "step", "thd"},
    "optimizer": {"config", "kernels", "marks"},
    "metrics": {"config", "distributed", "plan", "shapes"},
    "checkpoint": {"config", "distributed", "hf", "optimizer", "plan", "shapes"},
    "loop": {"checkpoint", "config", "distributed", "graphs", "hf", "loader", "metrics", "model", "optimizer",
             "patches", "plan", "shapes", "step"},
    "convert": {"checkpoint", "config", "distributed", "hf", "model", "patches", "plan"},
    "commands": {"config", "convert", "loop"},
    "__main__": {"commands"},
}
MAY_IMPORT.update({f"qwen_data_train.{name}": TRAIN_MAY_IMPORT | {f"qwen_data_train.{r}" for r in below}
                   for name, below in TRAIN_FLOORS.items()})
# The commands tell a refusal as `qwen-data` does (`errors.describe`): torchrun runs them without the CLI.
MAY_IMPORT["qwen_data_train.commands"].add("qwen_data.errors")


def room(module: str) -> str:
    """`qwen_data.formats.manifest` → `qwen_data.formats`; a module left flat is its own room."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, imported in graph.items():
        rooms.setdefault(room(module), set()).update(room(m) for m in imported if room(m) != room(module))
    return rooms


def wrong_arrows(rooms: dict[str, set[str]]) -> list[str]:
    wrong = []
    for name, imported in rooms.items():
        assert name in MAY_IMPORT, f"{name}: a room the layering does not know"
        allowed = MAY_IMPORT[name]
        wrong += [f"{name} -> {other}" for other in sorted(imported - allowed)]
    return wrong


def test_each_room_imports_only_the_rooms_below_it():
    rooms = room_graph(import_graph())
    assert {"qwen_data.formats", "qwen_data.steps", "qwen_data_train.hf", "qwen_data_train.loop"} <= set(rooms)
    assert "qwen_data.formats" in rooms["qwen_data.steps"]  # the graph is really read
    assert wrong_arrows(rooms) == []
    assert find_cycle(rooms) is None, " -> ".join(find_cycle(rooms))
    # The check can fail: a format reaching up into a step, HF folders into the trainer, are found.
    assert wrong_arrows({**rooms, "qwen_data.formats": rooms["qwen_data.formats"] | {"qwen_data.steps"}}) == [
        "qwen_data.formats -> qwen_data.steps"]
    assert wrong_arrows({**rooms, "qwen_data_train.hf": rooms["qwen_data_train.hf"] | {"qwen_data_train.loop"}}) == [
        "qwen_data_train.hf -> qwen_data_train.loop"]
    # ... and the plan reaching into the model it precedes.
    assert wrong_arrows({**rooms, "qwen_data_train.plan": rooms["qwen_data_train.plan"] | {"qwen_data_train.model"}}) == [
        "qwen_data_train.plan -> qwen_data_train.model"]


def test_no_test_module_imports_another():
    tests = {p.stem for p in (REPO_ROOT / "tests").rglob("test_*.py")}
    assert len(tests) > 30  # the test modules are really found
    for path in (REPO_ROOT / "tests").rglob("*.py"):
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


def _sources():
    return [p for package in PACKAGES.values() for p in sorted((REPO_ROOT / package).rglob("*.py"))]


def test_no_two_public_classes_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in _sources():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(str(path.relative_to(REPO_ROOT)))
    assert len(seen) > 50 and "Manifest" in seen  # the classes are really read
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_one_module_maps_a_bin():
    """Reading a .bin is the indexed format's job: every other module asks it (`indexed.bin_tokens`)."""
    mapping = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "qwen_data").rglob("*.py")
               if "np.memmap(" in p.read_text(encoding="utf-8")}
    assert mapping == {"qwen_data/formats/indexed.py"}


def test_a_module_that_starts_torch_torchrun_or_ray_is_marked_slow_or_refused():
    """The tiers are by marker (`conftest.py`): a test module that imports torch, Ray or the torchrun
    helper at its top, unmarked, stops the collection; one importing them inside a test (megatron-core
    reading our files) stays in the fast tier."""
    from conftest import unmarked

    assert unmarked("import pytest\nimport torch\n")
    assert unmarked("from _train import torchrun\n")
    assert not unmarked("import pytest\nimport torch\n\npytestmark = pytest.mark.slow  # why\n")
    assert not unmarked("def test_reads():\n    from megatron.core.datasets import indexed_dataset\n")


def _model_asks(source: str) -> list[str]:
    """What a module of the model's builder asks of the machine or of megatron-core's groups' sizes:
    `torch.cuda...`, `*_world_size(...)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            found.append("torch.cuda")
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name.endswith("_world_size"):
            found.append(name)
    return found


def test_the_model_takes_its_sizes_and_machine_from_the_plan():
    """The plan settled the layout and looked at the machine: the builder asks neither again (which
    pipeline stage or expert rank this process is stays parallel_state's to say)."""
    files = sorted((REPO_ROOT / "train" / "model").glob("*.py"))
    assert len(files) >= 8
    for path in files:
        assert _model_asks(path.read_text(encoding="utf-8")) == [], path.name
    # the check can fail
    assert _model_asks("x = parallel_state.get_pipeline_model_parallel_world_size()\ny = torch.cuda.is_available()") \
        == ["get_pipeline_model_parallel_world_size", "torch.cuda"]


def _long_functions(source: str, most: int = 50) -> list[str]:
    return [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > most]


def test_no_function_of_the_product_is_over_50_lines():
    found = {str(p.relative_to(REPO_ROOT)): long for folder in PACKAGES.values()
             for p in (REPO_ROOT / folder).rglob("*.py") if (long := _long_functions(p.read_text(encoding="utf-8")))}
    assert found == {}
    assert _long_functions("def f():\n" + "    x = 1\n" * 50) == ["f (51 lines)"]  # the check can fail
