"""The package's shape: imports run one way, and no module reaches into another's privates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "stallfree"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ``stallfree`` module ``path`` imports, including under TYPE_CHECKING and in functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stallfree"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("stallfree"))
    return found


def _graph(package: str) -> dict[str, set[str]]:
    folder = SRC / package
    modules = {_module_name(p): p for p in folder.rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
        if not name.endswith("__init__") and path.name != "__init__.py"
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


@pytest.mark.parametrize("package", ["core", "sim", "specs", "workload", "metrics", "explain", "engine"])
def test_imports_inside_a_package_form_no_cycle(package: str) -> None:
    assert _cycle(_graph(package)) is None


def test_core_imports_nothing_else_of_ours_and_sim_engine_stay_apart() -> None:
    def deps(package: str) -> set[str]:
        return {m for p in (SRC / package).rglob("*.py") for m in _imports(p)}

    assert {m for m in deps("core") if not m.startswith("stallfree.core")} == set()
    assert not {m for m in deps("sim") if m.startswith(("stallfree.engine", "stallfree.explain"))}
    assert not {m for m in deps("engine") if m.startswith(("stallfree.sim", "stallfree.explain"))}


def test_no_module_reads_another_objects_private_attributes() -> None:
    """``x._name`` only where ``x`` is ``self`` or ``cls`` (or a module-level private helper)."""
    offenders = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id.startswith("_")):
                continue
            root = owner
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("argparse", "sys", "torch"):
                continue  # their underscored names are the documented way (type hints, torch ops)
            offenders.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert offenders == []
