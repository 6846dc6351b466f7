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
ABOVE_BASE = (
    "shoal.algorithms",
    "shoal.framework",
    "shoal.learn",
    "shoal.rollout",
    "shoal.replay",
    "shoal.league",
    "shoal.app",
)
APP = ("shoal.app",)  # the product surface: CLI, trainer, Tune, evaluation, export, inference
FRAMEWORK = ("shoal.framework",)  # Algorithm and its helpers, PolicySet, the runners, the pipeline
ALGORITHMS = ("shoal.algorithms",)  # the algorithms, what some of them share, and the registry


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = ("shoal", *path.relative_to(ROOT).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path], typing_too: bool = False) -> set[str]:
    """The shoal modules ``name`` imports anywhere outside ``if TYPE_CHECKING:`` (``typing_too``: inside
    it too), with the packages importing them runs (``import a.b.c`` runs ``a.b``'s ``__init__`` first)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
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


def test_the_framework_names_no_algorithm():
    """The algorithms stand on ``shoal.framework``; no framework module imports a module of
    ``shoal.algorithms``, lazily or for type checking only included. The registry (the package
    ``shoal.algorithms`` itself) is the one way up: a checkpoint's rebuild asks it for a config
    class by name."""
    mods = _modules()
    framework = [name for name in mods if _in(name, FRAMEWORK)]
    assert {"shoal.framework.base", "shoal.framework.policies", "shoal.framework.runner"} <= set(framework)
    wrong = sorted(
        (a, b)
        for a in framework
        for b in _imports(a, mods[a], mods, typing_too=True)
        if _in(b, ALGORITHMS) and b != "shoal.algorithms"
    )
    assert wrong == []


def test_nothing_below_the_framework_imports_it():
    """The algorithms import the framework and the product surface imports both; the library below
    (learn, rollout, replay, league, config, ...) imports neither (``config.build()`` makes the class
    that named the config class as its ``config_cls``; ``shoal/__init__.py`` names them by string)."""
    graph = _graph()
    above = (*APP, *ALGORITHMS, *FRAMEWORK)
    wrong = sorted(
        (a, b)
        for a, targets in graph.items()
        if not _in(a, above) and a != "shoal.__main__"
        for b in targets
        if _in(b, (*ALGORITHMS, *FRAMEWORK))
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


def test_no_file_is_longer_than_600_lines():
    """A module reads as one thing; a longer one is split where its parts meet."""
    lengths = sorted((len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in ROOT.rglob("*.py"))
    assert len(lengths) > 100  # the walk found the package
    assert [f for f in lengths if f[0] > 600] == []


def test_no_function_is_longer_than_a_screen():
    """60 lines at most (docstring included): longer ones are split into named steps."""
    lengths = _function_lengths()
    assert len(lengths) > 500  # the walk found the package
    assert [f for f in lengths if f[0] > 60] == []


def test_every_training_step_reads_on_one_screen():
    """An algorithm's whole step (sample -> learn per policy -> post-update -> sync) in <= 35 lines."""
    steps = [f for f in _function_lengths() if f[2] == "training_step" and "framework/base.py" not in f[1]]
    assert len(steps) >= 7, steps  # PPO, DQN, IMPALA, APPO, Ape-X, DD-PPO, AlphaStar
    assert [f for f in steps if f[0] > 35] == []


ALGORITHM_MODULES = {  # module -> the algorithm it belongs to; the rest of shoal/algorithms is shared code
    "ppo": "ppo",
    "dqn": "dqn",
    "apex": "apex",
    "apex_td3": "apex_td3",
    "sac": "sac",
    "impala": "impala",
    "appo": "appo",
    "ddppo": "ddppo",
    "alpha_star": "alpha_star",
    "alpha_star_config": "alpha_star",
    "alpha_star_learner": "alpha_star",
    "league_evaluator": "alpha_star",
}


def _algorithm_imports(module: str, source: str | None = None) -> set[str]:
    """The algorithm modules ``module`` (a name in ALGORITHM_MODULES) imports anywhere, lazily or
    for type checking only included; ``source``: its text, when not read from the package."""
    tree = ast.parse(source if source is not None else (ROOT / "algorithms" / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = ["shoal", "algorithms"][: max(0, 3 - node.level)] if node.level else []
            base = ".".join([*package, *([node.module] if node.module else [])])
            names.update(f"{base}.{a.name}" for a in node.names)
    found = {n.split(".")[2] for n in names if n.startswith("shoal.algorithms.") and n.count(".") >= 2}
    return {m for m in found if m in ALGORITHM_MODULES and ALGORITHM_MODULES[m] != ALGORITHM_MODULES[module]}


def test_no_algorithm_module_imports_another_algorithm():
    """What several algorithms share lives in modules of its own (replay_loop.py, q_learning.py,
    continuous.py, apex_actors.py, apex_pipeline.py, ppo_loss.py, appo_loss.py, loss_keys.py; the framework's in
    shoal/framework), so changing one algorithm never changes another."""
    registry = next(
        ast.literal_eval(node.value)
        for node in ast.parse((ROOT / "algorithms" / "__init__.py").read_text()).body
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "REGISTRY" and node.value is not None
    )
    assert {mod.rsplit(".", 1)[1] for mod, *_ in registry.values()} <= set(ALGORITHM_MODULES)
    wrong = sorted((m, other) for m in ALGORITHM_MODULES for other in _algorithm_imports(m))
    assert wrong == []


def test_the_algorithm_import_check_sees_every_import_form():
    forms = {
        "from shoal.algorithms import dqn": {"dqn"},
        "import shoal.algorithms.sac": {"sac"},
        "from shoal.algorithms.apex import ApeX": {"apex"},
        "from .impala import IMPALA": {"impala"},
        "from . import appo": {"appo"},
        "def f():\n    from shoal.algorithms.ppo import PPO": {"ppo"},
        "if TYPE_CHECKING:\n    from shoal.algorithms.ddppo import DDPPO": {"ddppo"},
        "from shoal.algorithms.alpha_star_learner import APPOPolicyLearner": set(),  # alpha_star's own
        "from shoal.algorithms.replay_loop import ReplayAlgorithm": set(),  # shared code
        "from shoal.framework.base import Algorithm": set(),  # the framework
        "from .. import ppo": set(),  # shoal.ppo, not an algorithm
    }
    for source, expected in forms.items():
        assert _algorithm_imports("alpha_star", source) == expected, source
