"""Learning curves: ``shoal plot`` over run directories, seeds grouped as a mean and a band."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import flat, invoke

from shoal.app.plotting import group_runs, mean_and_band, plot_runs
from shoal.errors import ConfigError, ShoalError


def fake_run(root, name: str, config: dict, rows: list[tuple[int, float]]):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"algo": "ppo", **config}))
    (d / "results.jsonl").write_text(
        "".join(
            json.dumps(
                {"iteration": i + 1, "env_steps_sampled": x, "time_total_s": 2.0 * (i + 1), "episode_return_mean": y}
            )
            + "\n"
            for i, (x, y) in enumerate(rows)
        )
    )
    return d


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    fake_run(
        root, "ppo_CartPole-v1_20261126-010000", {"env": "CartPole-v1", "lr": 1e-3, "seed": 0}, [(0, 0.0), (10, 10.0)]
    )
    fake_run(
        root, "ppo_CartPole-v1_20261126-010100", {"env": "CartPole-v1", "lr": 1e-3, "seed": 1}, [(0, 0.0), (20, 40.0)]
    )
    fake_run(
        root,
        "ppo_CartPole-v1_20261126-010200",
        {"env": "CartPole-v1", "lr": 1e-4, "seed": 0},
        [(0, 1.0), (5, float("nan")), (10, 3.0)],
    )
    return root


def test_seeds_of_one_config_are_one_group_and_its_band_is_hand_computed(runs):
    groups = group_runs(sorted(runs.iterdir()), "env_steps_sampled", "episode_return_mean")
    assert [(g.label, len(g.runs)) for g in groups] == [("ppo_CartPole-v1", 2), ("ppo_CartPole-v1 (config 2)", 1)]
    assert groups[1].runs[0][1].tolist() == [1.0, 3.0]  # the NaN row is left out
    grid, mean, low, high = mean_and_band(groups[0].runs)
    assert grid[0] == 0 and grid[-1] == 10  # the range both seeds reached
    i = int(np.argmin(abs(grid - 5.0)))
    x = grid[i]  # seed 0: y = x; seed 1: y = 2x
    assert mean[i] == pytest.approx(1.5 * x) and low[i] == pytest.approx(x) and high[i] == pytest.approx(2 * x)
    assert len(group_runs(sorted(runs.iterdir()), "env_steps_sampled", "episode_return_mean", group=False)) == 3


def test_plot_writes_png_and_svg_and_refuses_bad_inputs(runs, tmp_path):
    png = plot_runs([runs], tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = invoke("plot", runs, "--x", "time", "-o", tmp_path / "c.svg", "--title", "two configs")
    assert r.exit_code == 0, r.output
    assert "<svg" in (tmp_path / "c.svg").read_text() and "Curves:" in r.output
    r = invoke("plot", runs, "--x", "frames", "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and "env_steps, time, iteration" in flat(r.output)
    r = invoke("plot", runs, "--key", "episode_reward_mean", "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and "episode_return_mean" in flat(r.output)  # the keys it does have
    r = invoke("plot", runs, "-o", tmp_path / "x.jpg")
    assert r.exit_code == 2 and ".png, .svg, .pdf" in flat(r.output)
    with pytest.raises(ConfigError, match="not a run directory"):
        plot_runs([tmp_path / "nothing"], tmp_path / "x.png")


def test_torn_and_garbage_lines_are_skipped_and_counted(runs, tmp_path, caplog):
    """What a killed writer leaves (a last line cut short) and a garbage line: the rows around them
    are drawn, and a warning counts the lines left out (as resume drops a torn row)."""
    run = runs / "ppo_CartPole-v1_20261126-010000"
    with open(run / "results.jsonl", "ab") as f:
        f.write(b"not json \xff\n")
        f.write(b'{"iteration": 3, "env_steps_sampled": 30, "episode_return_mean": 12.0}\n')
        f.write(b'{"iteration": 4, "env_steps_sampled": 40, "episode_re')
    groups = group_runs([run], "env_steps_sampled", "episode_return_mean")
    assert groups[0].runs[0][1].tolist() == [0.0, 10.0, 12.0]
    with caplog.at_level("WARNING", logger="shoal.plot"):
        r = invoke("plot", run, "-o", tmp_path / "c.png")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert any("skipped 2 lines that hold no result row" in rec.getMessage() for rec in caplog.records)


def test_a_run_without_results_rows_says_so(tmp_path):
    run = tmp_path / "ppo_CartPole-v1_20261126-010000"
    run.mkdir()
    (run / "results.jsonl").write_text("")
    r = invoke("plot", run, "-o", tmp_path / "c.png")
    text = flat(r.output)
    assert r.exit_code == 2 and "holds no result rows" in text and "Keys the" not in text, r.output
    assert not (tmp_path / "c.png").exists()


def test_an_output_directory_that_cannot_be_made_is_one_paragraph(runs):
    """/proc passes the permission bits for root, yet refuses a new directory."""
    r = invoke("plot", runs, "-o", "/proc/x/c.png")
    assert r.exit_code == 2 and "'/proc' is not a writable directory" in flat(r.output), r.output
    assert "Traceback" not in r.output
    with pytest.raises(ShoalError, match="Cannot write the picture '/proc/x/c.png'"):
        plot_runs([runs], Path("/proc/x/c.png"))  # the library call, past the command's check


def test_a_curve_of_one_point_is_a_marker_and_says_so(tmp_path):
    """A league's curves.png after its first evaluation: one finite value. A line through one point
    draws nothing, so the picture was an empty plot."""
    from shoal.app.plotting import curves_figure

    run = fake_run(tmp_path, "alpha_star_kuhn_poker_20261127-010000", {"env": "openspiel:kuhn_poker"}, [(64, 0.45)])
    groups = group_runs([run], "env_steps_sampled", "episode_return_mean")
    fig = curves_figure(groups, "env steps sampled", "episode_return_mean")
    (ax,) = fig.axes
    (line,) = ax.lines
    assert line.get_marker() == "o" and line.get_xydata().tolist() == [[64.0, 0.45]]
    assert "(one point)" in ax.get_legend().get_texts()[0].get_text()
    two = group_runs([fake_run(tmp_path, "two", {}, [(0, 1.0), (10, 2.0)])], "env_steps_sampled", "episode_return_mean")
    assert curves_figure(two, "x", "y").axes[0].lines[0].get_marker() in (None, "None", "")  # a line, as before
    assert plot_runs([run], tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
