"""The floor plan, enforced: which package may import which, no cycles, modules a reader can
hold in their head. Every import statement counts, including one inside a function: a late
import is still a dependency. Only imports for type annotations (under TYPE_CHECKING) are
left out: they run nothing."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The product's top-level packages, lowest first: each may import only those before it.
TOP = ["config", "models", "tasks", "web"]

# models' packages by layer: a package may import packages of a lower layer, never one of its
# own layer or above. "models" stands for the foundation modules at the package's root
# (errors, db, storage, retry, compat, migrations); models.runtime, the composition root that
# wires a process together, is above them all.
LAYER = {
    "models.security": 0,
    "models": 1,
    "models.speech": 2, "models.jobs": 2,
    "models.access": 3,
    "models.delivery": 4,
    "models.pipeline": 5, "models.maintenance": 5,
    "models.runtime": 6,
}
# Scripts Alembic loads by path, and the facade (models/__init__.py) that re-exports the
# public names: nothing inside models imports them.
NOT_MODULES = {"models/__init__.py", "models/migrations/env.py"}
MAX_LINES = 340  # "about 300": a module a reader holds in their head


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file, relative ones resolved."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block) for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from models.jobs import record` names the module models.jobs.record
            found += [(node.lineno, f"{module}.{alias.name}" if not node.module or _is_package(module)
                       else module) for alias in node.names]
    return found


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (getattr(node.test, "id", None) == "TYPE_CHECKING"
                                         or getattr(node.test, "attr", None) == "TYPE_CHECKING")


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").exists()


def _sources(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "versions" not in p.parts)


def _package_of(module: str) -> str | None:
    """The models package a module belongs to, or None outside models."""
    parts = module.split(".")
    if parts[0] != "models":
        return None
    candidate = ".".join(parts[:2])
    return candidate if candidate in LAYER else "models"  # a foundation module


def _edges() -> list[tuple[str, str, str]]:
    """(where, from package, to package) for every import between models' packages."""
    edges = []
    for path in _sources("models"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in NOT_MODULES:
            continue
        source = _package_of(_module_name(path))
        for line, module in _imports(path):
            target = _package_of(module)
            if target is not None and target != source:
                edges.append((f"{rel}:{line} imports {module}", source, target))
    return edges


@pytest.mark.parametrize("top", TOP)
def test_top_level_packages_import_only_those_below(top):
    allowed = set(TOP[: TOP.index(top) + 1])
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path in _sources(top) for line, module in _imports(path)
             if module.split(".")[0] in TOP and module.split(".")[0] not in allowed]
    assert wrong == [], f"{top} may import only {sorted(allowed)}"


def test_models_packages_import_only_lower_layers():
    wrong = [where for where, source, target in _edges() if LAYER[target] >= LAYER[source]]
    assert wrong == []


def test_no_import_cycle_between_models_packages():
    graph: dict[str, set[str]] = {}
    for _where, source, target in _edges():
        graph.setdefault(source, set()).add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else path + [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a cycle through three packages is reported as a path."""
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_every_models_package_says_what_it_may_import():
    for package in LAYER:
        init = ROOT / package.replace(".", "/") / "__init__.py"
        init = init if init.exists() else init.parent.with_suffix(".py")  # models.runtime is a module
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)} needs a docstring saying what it may import"


@pytest.mark.parametrize("top", TOP)
def test_no_module_is_too_long_to_read(top):
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in _sources(top)
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert long == [], f"split these by concept (at most {MAX_LINES} lines)"
