"""League reports: the players, match counts, the win-rate matrix, and a heatmap of it.

``league_report(builder_or_state)`` returns plain data; ``format_league_report`` turns it
into text tables; ``write_league_report(run_dir_or_state, out_dir)`` writes
``league_report.json``, ``league_report.txt``, ``league_win_rates.png`` (the heatmap,
when matplotlib is installed) and, for a league on an OpenSpiel game that evaluated,
``league_exploitability.png`` (main's and the Nash mixture's exploitability over the run) and is what ``shoal league RUN_DIR`` calls;
``add_league_to_tensorboard`` puts the same tables and figure in TensorBoard.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from shoal.errors import CheckpointError
from shoal.league.builder import STATE_FORMAT, LeagueBuilder
from shoal.league.payoff import PayoffTable

REPORT_JSON, REPORT_TXT, HEATMAP_PNG = "league_report.json", "league_report.txt", "league_win_rates.png"
EXPLOITABILITY_PNG = "league_exploitability.png"
NO_MATPLOTLIB = "matplotlib is not installed, so no heatmap was drawn (pip install matplotlib)."


def league_report(source: Union[LeagueBuilder, dict[str, Any]]) -> dict[str, Any]:
    """Players (type, learning or frozen, parent, games played), match counts per pair and
    per match type, and the win-rate matrix (row player's win rate against column player;
    None where the pair never met)."""
    state = source.get_state() if isinstance(source, LeagueBuilder) else source
    payoff = PayoffTable()
    payoff.set_state(state["payoff"])
    ids = list(state["players"])
    windows = state.get("windows", {})
    players = [
        {
            "id": pid,
            "type": s["type"],
            "learning": bool(s["trainable"]),
            "parent": s.get("parent"),
            "created_iteration": int(s.get("created_iteration", 0)),
            "games_played": payoff.games_played(pid),
            "recent_win_rate": float(np.mean(windows[pid])) if windows.get(pid) else None,
        }
        for pid, s in state["players"].items()
    ]
    by_type = state.get("pair_type_counts", {})
    pairs = []
    for i, a in enumerate(ids):
        for b in ids[i:]:
            n = payoff.games(a, b)
            if n:
                per_type = {mt: t[a][b] for mt, t in by_type.items() if t.get(a, {}).get(b)}
                pairs.append({"policies": [a, b], "games": n, "by_match_type": per_type})
    wr = payoff.matrix(ids)
    return {
        "iteration": int(state.get("iteration", 0)),
        "players": players,
        "num_learning": sum(p["learning"] for p in players),
        "num_frozen": sum(not p["learning"] for p in players),
        "games_total": int(sum(state.get("match_type_counts", {}).values())),
        "match_type_counts": dict(state.get("match_type_counts", {})),
        "pair_counts": pairs,
        "win_rate_matrix": {"ids": ids, "matrix": [[None if math.isnan(x) else float(x) for x in row] for row in wr]},
        "dropped_results": int(state.get("dropped_results", 0)),
    }


def _table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    cells = [header] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def exploitability_curve(run_dir: Optional[Path]) -> list[dict[str, Any]]:
    """The evaluations of an OpenSpiel league's run (``results.jsonl``): per evaluated iteration,
    ``iteration``, ``env_steps``, main's exploitability (``main``), its average's
    (``main_average``) and the frozen players' Nash mixture's (``mixture``; each None when not
    measured). Empty for other runs."""
    path = None if run_dir is None else Path(run_dir) / "results.jsonl"
    if path is None or not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash: the rest still counts
            continue
        if isinstance(row, dict) and row.get("evaluation/exploitability") is not None:
            out.append(
                {
                    "iteration": row.get("iteration"),
                    "env_steps": row.get("env_steps_sampled"),
                    "main": row["evaluation/exploitability"],
                    "main_average": row.get("evaluation/main_average_exploitability"),
                    "mixture": row.get("evaluation/mixture_exploitability"),
                }
            )
    return out


def exploitability_figure(curve: list[dict[str, Any]]):
    """Main's and the mixture's exploitability against env steps; None without matplotlib or data."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    if not curve:
        return None
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    steps = [c["env_steps"] for c in curve]
    ax.plot(steps, [c["main"] for c in curve], marker=".", label="main")
    for key, label in (
        ("main_average", "main's average (main@average)"),
        ("mixture", "Nash mixture of the frozen players"),
    ):
        if any(c.get(key) is not None for c in curve):
            ax.plot(steps, [np.nan if c.get(key) is None else c[key] for c in curve], marker=".", label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("exploitability (NashConv / 2)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Exploitability: what a best response wins")
    fig.tight_layout()
    return fig


def format_league_report(report: dict[str, Any]) -> str:
    out = [
        f"League after iteration {report['iteration']}: {len(report['players'])} players "
        f"({report['num_learning']} learning, {report['num_frozen']} frozen), {report['games_total']} games"
        + (f", {report['dropped_results']} results dropped" if report["dropped_results"] else ""),
        "",
    ]
    out += [
        "Players",
        _table(
            ["id", "type", "state", "parent", "games", "recent win rate"],
            [
                [
                    p["id"],
                    p["type"],
                    "learning" if p["learning"] else "frozen",
                    p["parent"],
                    p["games_played"],
                    p["recent_win_rate"],
                ]
                for p in report["players"]
            ],
        ),
        "",
    ]
    out += [
        "Matches per match type",
        _table(["match type", "games"], [[k, v] for k, v in report["match_type_counts"].items()]),
        "",
    ]
    types = list(report["match_type_counts"])
    out += [
        "Matches per pair",
        _table(
            ["policies", "games", *types],
            [
                [" vs ".join(p["policies"]), p["games"], *[p["by_match_type"].get(t, 0) for t in types]]
                for p in report["pair_counts"]
            ],
        ),
        "",
    ]
    m = report["win_rate_matrix"]
    out += [
        "Win rate of row player against column player",
        _table(["", *m["ids"]], [[pid, *row] for pid, row in zip(m["ids"], m["matrix"])]),
    ]
    out += _exploitability_table(report.get("exploitability") or [])
    return "\n".join(out) + "\n"


def _exploitability_table(curve: list[dict[str, Any]]) -> list[str]:
    """The report's exploitability lines (main, its average when measured, the Nash mixture)."""
    if not curve:
        return []
    average = any(c.get("main_average") is not None for c in curve)
    return [
        "",
        "Exploitability (lower is better; 0 at a Nash equilibrium)",
        _table(
            ["iteration", "env steps", "main", *(["main@average"] if average else []), "Nash mixture"],
            [
                [c["iteration"], c["env_steps"], c["main"], *([c.get("main_average")] if average else []), c["mixture"]]
                for c in curve
            ],
        ),
    ]


def heatmap_figure(report: dict[str, Any]):
    """A matplotlib Figure of the win-rate matrix (no pyplot, so no GUI backend); None without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    m = report["win_rate_matrix"]
    ids, data = m["ids"], np.array([[np.nan if v is None else v for v in row] for row in m["matrix"]], dtype=float)
    size = max(4.0, 0.6 * len(ids) + 2.0)
    fig = Figure(figsize=(size + 1.0, size))
    ax = fig.add_subplot()
    ax.set_facecolor("0.9")  # pairs that never met stay grey
    im = ax.imshow(np.ma.masked_invalid(data.reshape(len(ids), len(ids))), vmin=0.0, vmax=1.0, cmap="RdYlGn")
    ax.set_xticks(range(len(ids)), ids, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(ids)), ids, fontsize=8)
    for i in range(len(ids)):
        for j in range(len(ids)):
            if not np.isnan(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xlabel("opponent")
    ax.set_ylabel("player")
    ax.set_title(f"League win rates (iteration {report['iteration']})")
    fig.colorbar(im, ax=ax, label="win rate (draw = 1/2)")
    fig.tight_layout()
    return fig


def find_league_state(state: Any) -> Optional[dict[str, Any]]:
    """The league state inside a checkpoint's state (wherever the algorithm put it)."""
    if isinstance(state, dict):
        if state.get("format") == STATE_FORMAT:
            return state
        for v in state.values():
            found = find_league_state(v)
            if found is not None:
                return found
    return None


def _load_state(source: Union[str, Path, dict[str, Any], LeagueBuilder]) -> tuple[dict[str, Any], Optional[Path]]:
    if isinstance(source, LeagueBuilder):
        return source.get_state(), None
    if isinstance(source, dict):
        state = find_league_state(source)
        if state is None:
            raise CheckpointError("The given state holds no league state (no dict with format 'shoal-league').")
        return state, None
    from shoal.checkpoint import open_checkpoint

    path = Path(source)
    opened = open_checkpoint(path, run=False)
    ckpt, state = opened.path, find_league_state(opened.state)
    if state is None:
        raise CheckpointError(f"Checkpoint '{ckpt}' holds no league state: was '{path}' a league run (alpha_star)?")
    run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt
    return state, (path if path.is_dir() and (path / "checkpoints").is_dir() else run_dir)


def write_league_report(
    run_dir_or_state: Union[str, Path, dict[str, Any], LeagueBuilder], out_dir: Union[str, Path, None] = None
) -> dict[str, Any]:
    """Write the report files for a run directory, checkpoint, state dict or builder.

    ``out_dir`` defaults to the run directory (required for a state or a builder). Returns
    the report with ``files`` (what was written) and ``heatmap_message`` (None, or why
    there is no heatmap).
    """
    state, run_dir = _load_state(run_dir_or_state)
    out = Path(out_dir) if out_dir is not None else run_dir
    if out is None:
        raise ValueError("write_league_report needs out_dir when given a state or a builder")
    out.mkdir(parents=True, exist_ok=True)
    report = league_report(state)
    report["exploitability"] = exploitability_curve(run_dir)
    files = {"json": str(out / REPORT_JSON), "text": str(out / REPORT_TXT)}
    fig = heatmap_figure(report)
    if fig is not None:
        fig.savefig(out / HEATMAP_PNG, dpi=100)
        files["heatmap"] = str(out / HEATMAP_PNG)
    curve_fig = exploitability_figure(report["exploitability"])
    if curve_fig is not None:
        curve_fig.savefig(out / EXPLOITABILITY_PNG, dpi=100)
        files["exploitability"] = str(out / EXPLOITABILITY_PNG)
    report["heatmap_message"] = None if fig is not None else NO_MATPLOTLIB
    report["files"] = files
    (out / REPORT_TXT).write_text(format_league_report(report) + ("" if fig is not None else NO_MATPLOTLIB + "\n"))
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2))
    return report


def add_league_to_tensorboard(writer: Any, report: dict[str, Any], step: int) -> None:
    """The report's tables (as text) and heatmap (as a figure) on a torch SummaryWriter."""
    writer.add_text("league/report", "```\n" + format_league_report(report) + "```", step)
    fig = heatmap_figure(report)
    if fig is not None:
        writer.add_figure("league/win_rates", fig, step)
