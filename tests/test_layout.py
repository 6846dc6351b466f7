"""The package layout holds: no import cycle (lazy imports in functions included), and the
base layers import nothing above them. Read from the source with ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import shoal

ROOT = Path(shoal.__file__).resolve().parent
BASE = (
    "shoal.config",
    "shoal.envs",
    "shoal.models",
    "shoal.batch",
    "shoal.spaces",
    "shoal.imports",
    "shoal.process",
    "shoal.errors",
    "shoal.trust",
    "shoal.gym_ids",
    "shoal.files",
    "shoal.seeding",
)
ABOVE_BASE = ("shoal.algorithms", "shoal.learn", "shoal.rollout", "shoal.replay", "shoal.league", "shoal.app")
APP = ("shoal.app",)  # the product surface: CLI, trainer, Tune, evaluation, export, inference


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = ("shoal", *path.relative_to(ROOT).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The shoal modules ``name`` imports anywhere outside ``if TYPE_CHECKING:``, with the packages
    importing them runs (``import a.b.c`` runs ``a.b``'s ``__init__`` first)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
    out = set()
    for target in found:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        if target.startswith("shoal") and target != name:
            parts = target.split(".")
            out.update(
                p
                for p in (".".join(parts[:i]) for i in range(2, len(parts) + 1))
                if p in mods and p != name and not name.startswith(p + ".")
            )
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_lazy_imports_included():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def _in(name: str, layer: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in layer)


def test_the_base_layers_import_nothing_above_them():
    graph = _graph()
    wrong = sorted((a, b) for a, targets in graph.items() if _in(a, BASE) for b in targets if _in(b, ABOVE_BASE))
    assert wrong == []


def test_only_the_entry_point_imports_the_product_surface():
    """``shoal.app`` sits on top: the library below it never imports it (``shoal/__init__.py`` names
    its public functions lazily, by string; ``python -m shoal`` is ``__main__``)."""
    graph = _graph()
    assert {"shoal.app.trainer", "shoal.app.cli"} <= set(graph)
    wrong = sorted(
        (a, b)
        for a, targets in graph.items()
        if not _in(a, APP) and a != "shoal.__main__"
        for b in targets
        if _in(b, APP)
    )
    assert wrong == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _function_lengths() -> list[tuple[int, str, str]]:
    """``(lines, "path:line", name)`` of every function and method in the package."""
    out = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno}", node.name))
    return out


def test_no_function_is_longer_than_a_screen():
    """60 lines at most (docstring included): longer ones are split into named steps."""
    lengths = _function_lengths()
    assert len(lengths) > 500  # the walk found the package
    assert [f for f in lengths if f[0] > 60] == []


def test_every_training_step_reads_on_one_screen():
    """An algorithm's whole step (sample -> learn per policy -> post-update -> sync) in <= 35 lines."""
    steps = [f for f in _function_lengths() if f[2] == "training_step" and "algorithms/base.py" not in f[1]]
    assert len(steps) >= 7, steps  # PPO, DQN, IMPALA, APPO, Ape-X, DD-PPO, AlphaStar
    assert [f for f in steps if f[0] > 35] == []
