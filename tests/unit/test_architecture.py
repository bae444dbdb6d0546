"""The layout holds in both packages: imports only go down the layers, no import cycles, no module over the length
limit; the operator imports only the torch-free parts of the training package listed here; the emulated cluster of
run-local reaches the emulated API server over HTTP only.

Measured from the source with `ast` (imports inside functions and under TYPE_CHECKING count too), so a
violation is found without importing anything. docs/architecture.md draws the layers and says why.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "fsdp_operator"
TRAINING = ROOT / "training" / "fsdp_train"
MAX_LINES = 600

# Top to bottom. A module may import its own subpackage and any subpackage of a lower rank; api and
# capacity share the bottom and import neither each other nor anything above. local/ (run-local: the
# emulated API server, local KubeRay) reads job manifests and summaries, and is driven by the cli only.
RANK = {"cli": 5, "local": 4, "runtime": 3, "decide": 2, "api": 1, "capacity": 1}
TOP = 6  # the package's own __init__ / __main__

# The modules over MAX_LINES, each one thing that has not been split, and why; none may grow past CEILING, and an
# entry goes when its module comes under the limit. All are the emulated cluster of run-local (local/).
CEILING = 1000
LONG_MODULES = {
    "operator/fsdp_operator/local/server/apiserver.py": "the HTTP surface of the emulated API server: one dispatch "
    "from a request to the store, watch streams, discovery and OpenAPI (the semantics are in store.py)",
    "operator/fsdp_operator/local/server/store.py": "one Store whose methods share its lock, index and event "
    "history: writes, deletion with finalizers, and the garbage collector that deletion starts",
    "operator/fsdp_operator/local/server/structural.py": "the structural-schema rules of a CRD, each a few lines, "
    "read as one list against the Kubernetes documentation",
    "operator/fsdp_operator/local/cluster/kuberay.py": "one KubeRay controller: a RayCluster's pods, its Ray "
    "nodes' processes with their restarts, and the status written from both",
    "operator/fsdp_operator/local/run.py": "run-local's driver: the progress shown as a job runs, and starting and "
    "stopping the server, the cluster and the operator around it",
}

# The training package's rooms, top to bottom (docs/architecture.md; each room's __init__ says what it holds).
TRAINING_RANK = {"run": 6, "watch": 5, "models": 4, "datapath": 3, "state": 2, "contract": 1}
TRAINING_TOP = 7

# What the operator may import of the training package, and why. Nothing here imports torch at module level
# (test_the_operator_never_loads_torch holds it).
OPERATOR_MAY_IMPORT = {
    "fsdp_train": "the package's path, shipped with each job as a runtime_env py_module (runtime/settings.py)",
    "fsdp_train.contract": "the events, config, catalogs and NCCL log reading both sides share",
    "fsdp_train.datapath": "`fsdpctl data check` runs the job's data path on its first rows (imported when run)",
    "fsdp_train.state.storage": "the data path's reads, for `fsdpctl data check` (imported when run)",
    "fsdp_train.run.preflight": "`fsdpctl run-local` checks sources before a cluster starts (imported when run)",
}

# run-local's two rooms: neither imports the other (the cluster is a client of the server over HTTP).
LOCAL_ROOMS = ("fsdp_operator.local.server", "fsdp_operator.local.cluster")


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str, root: Path) -> dict[str, Path]:
    return {module_name(package, root, p): p for p in sorted(root.rglob("*.py"))}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports anywhere in it (top level, functions, TYPE_CHECKING)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(package: str, root: Path) -> dict[str, set[str]]:
    known = modules(package, root)
    return {name: imports(path, name, set(known)) for name, path in known.items()}


def layer(module: str, ranks: dict[str, int] = RANK, top: int = TOP) -> tuple[str, int]:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in ranks:
        return parts[0], top  # the package itself and its __main__
    return parts[1], ranks[parts[1]]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_operator_module_sits_in_a_known_layer() -> None:
    stray = [
        name
        for name in modules("fsdp_operator", OPERATOR)
        if name.count(".") == 1 and name.split(".")[1] not in RANK and name.split(".")[1] not in {"__main__"}
    ]
    assert stray == [], f"modules outside the layers (move each into a subpackage): {stray}"


def test_every_training_module_sits_in_a_room() -> None:
    stray = [
        name
        for name in modules("fsdp_train", TRAINING)
        if name.count(".") == 1 and name.split(".")[1] not in TRAINING_RANK and name != "fsdp_train.__main__"
    ]
    assert stray == [], f"training modules outside the rooms (move each into one): {stray}"
    for room in TRAINING_RANK:
        init = TRAINING / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)} says what the room holds"


def upward_imports(package: str, root: Path, ranks: dict[str, int], top: int) -> list[str]:
    upward = []
    for source, targets in graph(package, root).items():
        source_layer, source_rank = layer(source, ranks, top)
        for target in targets:
            target_layer, target_rank = layer(target, ranks, top)
            if target_layer != source_layer and target_rank >= source_rank:
                upward.append(f"{source} ({source_layer}) imports {target} ({target_layer})")
    return sorted(upward)


@pytest.mark.parametrize(
    ("package", "root", "ranks", "top"),
    [("fsdp_operator", OPERATOR, RANK, TOP), ("fsdp_train", TRAINING, TRAINING_RANK, TRAINING_TOP)],
)
def test_imports_go_down_the_layers(package: str, root: Path, ranks: dict[str, int], top: int) -> None:
    upward = upward_imports(package, root, ranks, top)
    assert upward == [], "imports against the layers:\n" + "\n".join(upward)


def test_the_operator_imports_only_what_it_may_of_the_training_package() -> None:
    training = set(modules("fsdp_train", TRAINING))
    stray = []
    for source, path in modules("fsdp_operator", OPERATOR).items():
        found = imports(path, source, training)
        # `from fsdp_train.run import preflight` names the room on its way to the module: the module is what counts
        for target in {t for t in found if not any(other.startswith(f"{t}.") for other in found)}:
            # the package itself is allowed alone; a room or module with what is inside it
            rooms = [allowed for allowed in OPERATOR_MAY_IMPORT if "." in allowed]
            if target not in OPERATOR_MAY_IMPORT and not any(target.startswith(f"{room}.") for room in rooms):
                stray.append(f"{source} imports {target}")
    assert stray == [], "the operator imports training modules outside OPERATOR_MAY_IMPORT:\n" + "\n".join(stray)


def test_the_operator_never_loads_torch() -> None:
    """Every operator module and the contract load without torch (a kopf process never pays torch's import)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import fsdp_operator, fsdp_train.contract\n"
        "for package in (fsdp_operator, fsdp_train.contract):\n"
        "    for found in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        if not found.name.endswith('__main__'):\n"
        "            importlib.import_module(found.name)\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch')[:3])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "[]", f"importing the operator loads torch: {done.stdout.strip()}"


def test_the_local_cluster_and_api_server_never_import_each_other() -> None:
    crossing = [
        f"{source} imports {target}"
        for source, targets in graph("fsdp_operator", OPERATOR).items()
        for room in LOCAL_ROOMS
        if source.startswith(f"{room}.") or source == room
        for target in targets
        for other in LOCAL_ROOMS
        if other != room and (target == other or target.startswith(f"{other}."))
    ]
    assert crossing == [], "run-local's rooms import each other:\n" + "\n".join(crossing)


@pytest.mark.parametrize(("package", "root"), [("fsdp_operator", OPERATOR), ("fsdp_train", TRAINING)])
def test_no_import_cycles(package: str, root: Path) -> None:
    edges = graph(package, root)
    # a package's __init__ is imported with any of its modules: it may import them without a cycle
    for name in edges:
        edges[name] = {t for t in edges[name] if not name.startswith(f"{t}.")}
    found = cycles(edges)
    assert found == [], f"import cycles in {package}: {found}"


def test_training_never_imports_the_operator() -> None:
    for path in TRAINING.rglob("*.py"):
        names = {
            (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert not any(n.split(".")[0] == "fsdp_operator" for n in names), f"{path} imports fsdp_operator"


def test_no_module_over_the_limit() -> None:
    """No module of either package is over MAX_LINES, but those LONG_MODULES names, and they stay under CEILING."""
    long, listed = [], set()
    for root in (OPERATOR, TRAINING):
        for path in sorted(root.rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            count = len(path.read_text().splitlines())
            if name in LONG_MODULES:
                listed.add(name)
                if not MAX_LINES < count <= CEILING:
                    long.append(f"{name}: {count} lines, listed as long (over {MAX_LINES}, at most {CEILING})")
            elif count > MAX_LINES:
                long.append(f"{name}: {count} lines")
    long += [f"{name}: listed as long, but no such module" for name in sorted(LONG_MODULES.keys() - listed)]
    assert long == [], f"modules over {MAX_LINES} lines (split where a module holds two things):\n" + "\n".join(long)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The graph and cycle finder see a function-level import cycle and an upward import."""
    package = tmp_path / "pkg"
    (package / "api").mkdir(parents=True)
    (package / "cli").mkdir()
    for init in (
        package / "__init__.py",
        package / "api" / "__init__.py",
        package / "cli" / "__init__.py",
    ):
        init.write_text("")
    (package / "api" / "a.py").write_text("def f():\n    from pkg.api import b\n\nimport pkg.cli.main\n")
    (package / "api" / "b.py").write_text("from pkg.api.a import f\n")
    (package / "cli" / "main.py").write_text("from .. import api\n")
    edges = graph("pkg", package)
    assert cycles(edges) == [["pkg.api.a", "pkg.api.b"]]
    assert "pkg.cli.main" in edges["pkg.api.a"]
    assert layer("pkg.api.a") == ("api", 1) and layer("pkg.cli.main") == ("cli", 5)


def test_the_architecture_doc_lists_every_module_once() -> None:
    """docs/architecture.md's module table names each module of both packages once, and nothing that is gone."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| module | what it holds |") :]
    listed = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    present = [
        path.relative_to(OPERATOR).as_posix()
        for path in OPERATOR.rglob("*.py")
        if path.name not in {"__init__.py", "__main__.py"} and path.parent != OPERATOR
    ] + [
        f"fsdp_train/{path.relative_to(TRAINING).as_posix()}"
        for path in TRAINING.rglob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    ]
    doubled = sorted({name for name in listed if listed.count(name) > 1})
    assert doubled == [], f"listed twice in docs/architecture.md: {doubled}"
    assert sorted(set(present) - set(listed)) == [], "modules missing from docs/architecture.md's table"
    assert sorted(set(listed) - set(present)) == [], "docs/architecture.md lists modules that are gone"
