"""The house plan holds: the import order of docs/architecture.md, read from the code.

Every module of src/clotho is parsed (ast, nothing imported) and each `import clotho...` /
`from clotho... import` is taken as an edge between top-level packages (`tasks`, `swe`, ...;
a top-level module such as `errors.py` is a package of its own). Imports under
`if TYPE_CHECKING:` are not counted: they never run. Imports inside functions are counted:
a lazy import is still a dependency.

A package may import only packages of lower layers (`LAYERS`), and nothing outside
`sandbox/` imports a backend's modules (`BACKEND_MODULES`). What does not hold yet is listed
in `ALLOWED_UPWARD` and `ALLOWED_BACKEND_IMPORTS`, each entry with its reason; an entry the
code no longer needs fails the test too, so the lists can only shrink.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "clotho"

# Lowest first; a package imports only packages of the layers below its own (docs/architecture.md,
# "Rooms": the same order in words).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "hosts"),
    ("data", "chat", "sandbox"),
    ("verify", "gateway"),
    ("tools",),
    ("agent",),
    ("installed_agents",),
    ("rollout",),
    ("tasks",),
    ("swe",),
    ("env",),
    ("envs", "runs", "trainers"),
    ("export", "view"),
    ("bench",),
    ("cli",),
    ("__main__",),
]

# (importing module, imported package): known upward imports, each to be removed.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# Modules that are one backend's own: only sandbox/ imports them (callers go through
# `clotho.sandbox`, the config registry and the `Sandbox` contract).
BACKEND_MODULES = (
    "clotho.sandbox.docker",
    "clotho.sandbox.ray",
    "clotho.sandbox.remote",
    "clotho.sandbox.ssh",
    "clotho.sandbox.local",
)

# (importing module, backend module): known imports of a backend from outside sandbox/.
ALLOWED_BACKEND_IMPORTS: dict[tuple[str, str], str] = {
    # `clotho bench sandbox` measures the backends themselves beside baselines of their own
    # parts: a new bubblewrap per command (the backend's read-only root arguments) and slots
    # opened straight from a Docker `SlotHost` (which of them started a container).
    ("clotho.bench.sandbox_bench", "clotho.sandbox.local.bwrap"): "baseline: bwrap per command",
    ("clotho.bench.sandbox_bench", "clotho.sandbox.docker.containers"): "slot figures",
    ("clotho.bench.sandbox_bench", "clotho.sandbox.docker.slots"): "slot figures",
    # The Ray benchmarks start a real local cluster (`ray/local_cluster.py`, shared with the
    # tests) and time the payload path of big transfers itself.
    ("clotho.bench.ray_transfer_bench", "clotho.sandbox.ray.local_cluster"): "local cluster",
    ("clotho.bench.ray_transfer_bench", "clotho.sandbox.ray.payload"): "payload timing",
    ("clotho.bench.scale_bench", "clotho.sandbox.ray.local_cluster"): "local cluster",
}


@dataclass(frozen=True)
class Edge:
    module: str  # the importing module
    target: str  # the imported module (or package)
    line: int

    @property
    def source_package(self) -> str:
        return package_of(self.module)

    @property
    def target_package(self) -> str:
        return package_of(self.target)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if "runner_files" in path.parts:  # carried into sandboxes, not part of the package
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of nodes under `if TYPE_CHECKING:` (they never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for body in node.body for child in ast.walk(body))
    return skipped


def _edges() -> list[Edge]:
    modules = _modules()
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                for alias in node.names:  # a submodule when it is one, else the module
                    name = f"{base}.{alias.name}"
                    targets.append(name if name in modules else base)
            edges += [
                Edge(module, t, node.lineno)
                for t in targets
                if t.startswith("clotho.") and t != "clotho.__version__"
            ]
    return edges


EDGES = _edges()
LAYER_OF = {package: n for n, layer in enumerate(LAYERS) for package in layer}


def _upward() -> dict[tuple[str, str], list[Edge]]:
    found: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for edge in EDGES:
        source, target = edge.source_package, edge.target_package
        if source == target or source == "clotho" or target == "clotho":
            continue
        if LAYER_OF[target] >= LAYER_OF[source]:
            found[(edge.module, target)].append(edge)
    return found


def test_every_package_has_a_layer() -> None:
    packages = {package_of(m) for m in _modules()} - {"clotho"}
    missing = sorted(packages - set(LAYER_OF))
    assert not missing, f"packages with no layer in LAYERS (and docs/architecture.md): {missing}"
    unknown = sorted(set(LAYER_OF) - packages)
    assert not unknown, f"LAYERS names packages that do not exist: {unknown}"


def test_no_package_imports_a_package_above_it() -> None:
    upward = _upward()
    new = {
        key: [f"{e.module}:{e.line} imports {e.target}" for e in edges]
        for key, edges in upward.items()
        if key not in ALLOWED_UPWARD
    }
    assert not new, (
        "imports against the layering (a package imports only lower layers; see "
        f"docs/architecture.md): {new}"
    )
    stale = sorted(set(ALLOWED_UPWARD) - set(upward))
    assert not stale, f"ALLOWED_UPWARD entries the code no longer needs (remove them): {stale}"


def test_no_import_cycle_between_packages() -> None:
    """Independent of the layer numbers: the package graph, allowed entries included, has no
    cycle but those the allowed entries make (listed, so each is seen)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in EDGES:
        source, target = edge.source_package, edge.target_package
        allowed = (edge.module, target) in ALLOWED_UPWARD
        if source != target and "clotho" not in (source, target) and not allowed:
            graph[source].add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, f"packages import each other: {' -> '.join(cycle or [])}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


# Folders whose modules import one another one way only: a module of one may not reach
# itself through the folder's other modules (lazy imports count; `TYPE_CHECKING` ones not).
ACYCLIC_FOLDERS = ("clotho.sandbox.docker",)


def _module_graph(folder: str) -> dict[str, set[str]]:
    """The import edges between modules of `folder` (the folder's own `__init__` aside)."""
    inside = folder + "."
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in EDGES:
        both = edge.module.startswith(inside) and edge.target.startswith(inside)
        if both and edge.module != edge.target:
            graph[edge.module].add(edge.target)
    return graph


def test_no_import_cycle_between_modules_of_a_backend_folder() -> None:
    """`sandbox/docker/`: the backend imports its kinds of sandbox (slots, sidecars, a
    container each), they import the shared modules below them (`containers.py`,
    `images.py`, ...), and nothing imports back up."""
    for folder in ACYCLIC_FOLDERS:
        graph = _module_graph(folder)
        assert graph, f"no imports seen between modules of {folder}"
        cycle = _find_cycle(graph)
        assert cycle is None, f"modules of {folder} import each other: {' -> '.join(cycle or [])}"


def _is_backend(target: str) -> str | None:
    for prefix in BACKEND_MODULES:
        if target == prefix or target.startswith(prefix + "."):
            return prefix
    return None


def test_nothing_outside_sandbox_imports_a_backend() -> None:
    found: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for edge in EDGES:
        if edge.source_package != "sandbox" and _is_backend(edge.target):
            found[(edge.module, edge.target)].append(edge)
    new = sorted(
        f"{e.module}:{e.line} imports {e.target}"
        for key, edges in found.items()
        if key not in ALLOWED_BACKEND_IMPORTS
        for e in edges
    )
    assert not new, f"backend modules imported outside sandbox/ (use the contract): {new}"
    stale = sorted(set(ALLOWED_BACKEND_IMPORTS) - set(found))
    assert not stale, f"ALLOWED_BACKEND_IMPORTS entries no longer needed (remove them): {stale}"


def test_the_checks_see_imports() -> None:
    """The parser finds what it must (so the checks above cannot pass on nothing): a known
    edge of each kind, lazy ones inside functions included."""
    pairs = {(e.module, e.target) for e in EDGES}
    assert ("clotho.tasks.verify", "clotho.verify.integrity") in pairs
    assert ("clotho.swe.verify", "clotho.verify.integrity") in pairs
    assert ("clotho.bench.scale_bench", "clotho.sandbox.ray.local_cluster") in pairs  # lazy
    assert not any(
        e.target.startswith("clotho.swe") for e in EDGES if e.module == "clotho.tasks.discover"
    )
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    docker = _module_graph("clotho.sandbox.docker")
    assert "clotho.sandbox.docker.slots" in docker["clotho.sandbox.docker.backend"]
    assert "clotho.sandbox.docker.containers" in docker["clotho.sandbox.docker.slots"]


def test_tasks_and_swe_meet_only_at_the_format_registry() -> None:
    """`tasks/` imports nothing of `swe/`; `swe/` imports of `tasks/` only the format
    registry it registers with (`tasks/formats.py`), never Harbor's code or its verifier."""
    assert not [e for e in EDGES if e.source_package == "tasks" and e.target_package == "swe"]
    from_swe = {
        e.target for e in EDGES if e.source_package == "swe" and e.target_package == "tasks"
    }
    assert from_swe == {"clotho.tasks.formats"}


# --- inside sandbox/ ------------------------------------------------------------------------
#
# Its parts: the contract `base.py` and the host bookkeeping every backend shares (`host/`:
# state folders, leases, exit cleanup, cgroups, /proc walks) on the ground floor, the shared
# core above them (every other top-level module: the kinds registry, the backend contract,
# the pool, the shell), one folder per backend on top.
SANDBOX_FOLDERS = ("host", "local", "docker", "ray", "remote", "ssh")

# (importing part, imported part): known imports that close a circle between parts, each with
# its reason, to be removed (an entry the code no longer needs fails the test).
ALLOWED_SANDBOX_PART_EDGES: dict[tuple[str, str], str] = {}


def sandbox_part(module: str) -> str | None:
    """`host`, `local`, ... for a module of that folder; `base`; `core` for the other modules
    of sandbox/; None outside sandbox/."""
    parts = module.split(".")
    if parts[:2] != ["clotho", "sandbox"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in (*SANDBOX_FOLDERS, "base") else "core"


def _part_edges() -> dict[tuple[str, str], list[Edge]]:
    found: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for edge in EDGES:
        source, target = sandbox_part(edge.module), sandbox_part(edge.target)
        if source and target and source != target:
            found[(source, target)].append(edge)
    return found


def test_host_and_the_contract_import_nothing_of_sandbox_above_them() -> None:
    """`host/` imports only `host/`; `base.py` nothing of sandbox/: every backend stands on
    them, so neither may reach a backend or the core (lazy imports included)."""
    above = sorted(
        f"{e.module}:{e.line} imports {e.target}"
        for (source, target), edges in _part_edges().items()
        if source in ("host", "base") and target != "host"
        for e in edges
    )
    assert not above, f"host/ or base.py import what stands above them: {above}"


def test_no_import_cycle_between_parts_of_sandbox() -> None:
    edges = _part_edges()
    assert ("local", "host") in edges and ("docker", "host") in edges  # the checks see them
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        if (source, target) not in ALLOWED_SANDBOX_PART_EDGES:
            graph[source].add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, f"parts of sandbox/ import each other: {' -> '.join(cycle or [])}"
    stale = sorted(set(ALLOWED_SANDBOX_PART_EDGES) - set(edges))
    assert not stale, f"ALLOWED_SANDBOX_PART_EDGES entries no longer needed (remove them): {stale}"


def test_no_import_cycle_between_modules_of_host_and_local() -> None:
    """Inside `host/` (state -> exit_cleanup -> leases -> cgroups, trees, proctree) and
    `local/` (backend -> bwrap, unsafe_local -> limits, fresh, netguard) imports go one way."""
    for folder in ("clotho.sandbox.host", "clotho.sandbox.local"):
        graph: dict[str, set[str]] = defaultdict(set)
        for edge in EDGES:
            inside = edge.module.startswith(folder + ".") and edge.target.startswith(folder + ".")
            if inside and edge.module != edge.target:
                graph[edge.module].add(edge.target)
        assert graph, f"no imports seen between modules of {folder}"
        cycle = _find_cycle(graph)
        assert cycle is None, f"modules of {folder} import each other: {' -> '.join(cycle or [])}"
