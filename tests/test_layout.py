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


@pytest.mark.parametrize(
    "package", ["core", "costs", "sim", "specs", "workload", "metrics", "explain", "engine", "ui", "validate"]
)
def test_imports_inside_a_package_form_no_cycle(package: str) -> None:
    assert _cycle(_graph(package)) is None


def test_imports_between_packages_form_no_cycle() -> None:
    """Package A imports package B, or B imports A, never both (as cli -> ui -> cli once did)."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        here = _module_name(path).split(".")
        if len(here) < 2:
            continue  # stallfree/__init__.py
        for module in _imports(path):
            there = module.split(".")
            if len(there) > 1 and there[1] != here[1]:
                graph.setdefault(here[1], set()).add(there[1])
    assert _cycle(graph) is None


def test_core_imports_nothing_else_of_ours_and_sim_engine_stay_apart() -> None:
    def deps(package: str) -> set[str]:
        return {m for p in (SRC / package).rglob("*.py") for m in _imports(p)}

    assert {m for m in deps("core") if not m.startswith("stallfree.core")} == set()
    assert not {m for m in deps("sim") if m.startswith(("stallfree.engine", "stallfree.explain"))}
    assert not {m for m in deps("engine") if m.startswith(("stallfree.sim", "stallfree.explain"))}


def test_costs_never_import_a_driver_and_sim_prices_only_through_costs() -> None:
    """sim -> costs, never back; no cost model imports a driver (sim, engine, validate, explain,
    the server, the bench client) or torch."""
    costs = {m for p in (SRC / "costs").rglob("*.py") for m in _imports(p)}
    drivers = ("stallfree.sim", "stallfree.engine", "stallfree.validate", "stallfree.explain")
    assert not {m for m in costs if m.startswith((*drivers, "stallfree.server", "stallfree.bench"))}
    assert not any("import torch" in p.read_text() for p in (SRC / "costs").rglob("*.py"))
    sim = {m for p in (SRC / "sim").rglob("*.py") for m in _imports(p)}
    assert "stallfree.costs.protocol" in sim


def _imported_names(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for everything ``source`` imports or may import: ``import a.b``, ``from a
    import b`` (``a`` and ``a.b``: ``b`` may be a module), relative imports resolved against
    ``package``, and ``importlib.import_module`` / ``__import__`` of a string literal; at any depth
    (in functions, under TYPE_CHECKING)."""
    parts = package.split(".")
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports_cli(module: str) -> bool:
    return module == "stallfree.cli" or module.startswith("stallfree.cli.")


def test_nothing_outside_the_command_line_imports_it() -> None:
    """``stallfree.cli`` only parses argv into library objects and prints results: a module that
    needs something of it (an option's default, a check, a formatter) needs it moved into the
    library, where the command line and the page (``stallfree.ui``) both reach it."""
    offenders: dict[str, str] = {}  # "path:line" -> the first stallfree.cli name it imports
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(SRC / "cli"):
            continue
        for line, module in _imported_names(path.read_text(), _package_of(path)):
            if _imports_cli(module):
                offenders.setdefault(f"{path.relative_to(SRC.parent)}:{line}", module)
    assert not offenders, "only stallfree/cli/ may import stallfree.cli:\n" + "\n".join(
        f"{where} imports {module}" for where, module in offenders.items()
    )


@pytest.mark.parametrize(
    "source",
    [
        "import stallfree.cli.common",
        "from stallfree.cli.explain import run",
        "from stallfree import cli",
        "from ..cli import common",
        "from .. import cli",
        "def f():\n    from stallfree.cli import main",
        "if TYPE_CHECKING:\n    from stallfree.cli.common import UsageError",
        "importlib.import_module('stallfree.cli.explain')",
    ],
)
def test_the_import_walk_sees_every_spelling(source: str) -> None:
    assert any(_imports_cli(m) for _, m in _imported_names(source, "stallfree.ui"))


def test_the_import_walk_names_no_lookalike() -> None:
    source = "from stallfree.client import x\nimport stallfree.clip\nfrom . import cli_view\n"
    assert not any(_imports_cli(m) for _, m in _imported_names(source, "stallfree.ui"))


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
            if isinstance(root, ast.Name) and root.id in ("argparse", "os", "sys", "torch"):
                continue  # their underscored names are the documented way (type hints, os._exit, torch ops)
            offenders.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert offenders == []
