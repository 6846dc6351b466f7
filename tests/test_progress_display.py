"""The live display: losses and the headline shown, ETAs from given rates, bars only for targets,
and plain one-line output off a terminal."""

import io
import re

from rich.console import Console

from shoal.app.trainer import Stop
from shoal.logging.progress import ProgressDisplay, format_eta, metric_label

PG = [("learner/policy_loss", "policy_loss"), ("learner/vf_loss", "vf_loss"), ("learner/entropy", "entropy")]


def result(it, steps, t, ret=20.0, **extra):
    return {
        "iteration": it,
        "env_steps_sampled": steps,
        "time_total_s": t,
        "time_this_iter_s": 2.0,
        "env_steps_per_s": 500.0,
        "episode_return_mean": ret,
        "episodes_total": 3 * it,
        "learner/policy_loss": -0.0123,
        "learner/vf_loss": 12.5,
        "learner/entropy": 0.61,
        **extra,
    }


def display(stop, terminal, width=200, **kw):
    console = Console(file=io.StringIO(), force_terminal=terminal, width=width, record=True, color_system=None)
    return ProgressDisplay("ppo on CartPole-v1", Stop(**stop), console=console, metrics=PG, plain_every_s=0.0, **kw)


def test_format_eta_and_labels():
    assert [format_eta(s) for s in (0, 42, 185, 7384, None)] == ["0s", "42s", "3m05s", "2h03m", "-"]
    assert metric_label("episode_return_mean") == "return"
    assert metric_label("league/main_win_rate_vs_frozen") == "main win rate vs frozen"


def test_etas_from_recent_rates():
    d = display({"env_steps": 10_000, "time_s": 100, "iterations": 50}, terminal=False)
    # 2,000 steps over 4 s of training: 500 steps/s; 2 iterations in 4 s: 2 s each.
    d.observe(result(1, 1000, 2.0))
    d.observe(result(3, 3000, 6.0))
    crit = {c.name: c for c in d.criteria(result(3, 3000, 6.0))}
    assert crit["env steps"].eta_s == (10_000 - 3000) / 500  # 14 s
    assert crit["time"].eta_s == 100 - 6.0  # exact
    assert crit["iterations"].eta_s == (50 - 3) * 2.0
    assert crit["env steps"].fraction == 0.3
    assert "ETA 14s" in crit["env steps"].text()  # the steps end the run first: the others are limits
    assert "limit in 1m34s" in crit["time"].text() and "limit in 1m34s" in crit["iterations"].text()


def test_an_estimate_is_an_eta_only_where_no_other_criterion_may_end_the_run_sooner():
    """With a reward target beside it, the time criterion's estimate is when the run stops at the
    latest (the return may reach its target any moment), not how long the run will take."""
    d = display({"reward": 200, "time_s": 600}, terminal=False)
    d.observe(result(1, 1000, 2.0, ret=150.0))
    line = d.plain_line(result(1, 1000, 2.0, ret=150.0))
    assert "time 2.0/600.0 s   0% limit in 9m58s" in line and "ETA" not in line, line
    alone = display({"time_s": 600}, terminal=False)  # the only criterion: its estimate is the run's
    assert "time 2.0/600.0 s   0% ETA 9m58s" in alone.plain_line(result(1, 1000, 2.0))
    # steps and time: the one expected first is the ETA, the other a limit; before a rate is
    # measured the steps' estimate is unknown, so the time's is a limit too
    both = display({"env_steps": 10_000, "time_s": 600}, terminal=True)
    assert "limit in 9m58s" in both.plain_line({"iteration": 1, "env_steps_sampled": 1000, "time_total_s": 2.0})
    both.observe(result(1, 1000, 2.0))
    both.observe(result(3, 3000, 6.0))  # 500 steps/s: 14 s to go
    both.console.print(both.renderable(result(3, 3000, 6.0)))
    text = both.console.export_text()
    assert "3,000/10,000  30% ETA 14s" in text and "6.0/600.0 s   1% limit in 9m54s" in text, text


def test_reward_bar_runs_from_first_return_and_has_no_eta():
    d = display({"reward": 200}, terminal=False)
    d.observe(result(1, 100, 1.0, ret=20.0))
    d.observe(result(2, 200, 2.0, ret=110.0))
    (c,) = d.criteria(result(2, 200, 2.0, ret=110.0))
    assert c.name == "reward" and c.fraction == 0.5 and c.eta_s is None and "ETA" not in c.text()


def test_live_panel_shows_losses_and_bars_only_for_targets():
    d = display({"env_steps": 10_000}, terminal=True)
    r = result(2, 2500, 5.0)
    d.observe(r)
    d.console.print(d.renderable(r, best=25.0))
    text = d.console.export_text()
    assert "policy_loss -0.0123" in text and "vf_loss 12.5" in text and "entropy 0.61" in text
    assert "return 20" in text and "best return 25" in text
    assert "env steps ━" in text and "2,500/10,000  25% ETA 15s" in text  # the one bar: 7,500 steps at 500/s
    assert "time" not in text.replace("time_", "") and "iterations" not in text  # no target, no row
    no_target = display({}, terminal=True)
    no_target.observe(r)
    no_target.console.print(no_target.renderable(r))
    assert "━" not in no_target.console.export_text() and "ETA" not in no_target.console.export_text()


def test_atari_steps_are_labelled_agent_steps():
    """An Atari agent step is frame_skip frames, and the presets' comments count frames."""
    d = display({"env_steps": 10_000}, terminal=False, steps_label="agent steps")
    line = d.plain_line(result(3, 3000, 6.0))
    assert "agent steps 3,000/10,000" in line and "agent steps/s 500" in line and "env steps" not in line
    assert "env steps 3,000/10,000" in display({"env_steps": 10_000}, terminal=False).plain_line(result(3, 3000, 6.0))


def test_a_resumed_run_counts_from_its_start_before_its_first_result():
    """The bars open at the run's progress where it resumes (not empty until the session's first
    result), and the reward bar runs from the run's first return, not the session's."""
    start = {"iteration": 40, "env_steps_sampled": 4000, "time_total_s": 80.0, "episode_return_mean": 90.0}
    d = display(
        {"env_steps": 10_000, "reward": 200}, terminal=True, resumed_from={**start, "first_return": 20.0, "best": 95.0}
    )
    with d:
        pass
    text = d.console.export_text()
    assert "4,000/10,000  40%" in text and "iter 40" in text and "best return 95" in text
    assert "90.0/200.0  39%" in text  # (90 - 20) / (200 - 20)
    d.observe(result(41, 4100, 82.0, ret=110.0))
    assert next(c for c in d.criteria(result(41, 4100, 82.0, ret=110.0)) if c.name == "reward").fraction == 0.5


def test_resumed_from_reads_the_runs_first_return_and_the_checkpoints_counters(tmp_path):
    from types import SimpleNamespace

    from shoal.app.trainer import _resumed_from
    from shoal.logging.metrics import EpisodeWindow

    (tmp_path / "results.jsonl").write_text(
        '{"iteration": 1, "episode_return_mean": NaN}\n{"iteration": 2, "episode_return_mean": 12.5}\n'
    )
    algo = SimpleNamespace(
        iteration=2, counters={"env_steps_sampled": 300.0, "time_total_s": 4.0}, episodes=EpisodeWindow()
    )
    got = _resumed_from(algo, tmp_path, best=12.5)
    assert got is not None and got["first_return"] == 12.5 and got["env_steps_sampled"] == 300 and got["iteration"] == 2
    assert _resumed_from(SimpleNamespace(iteration=0), tmp_path, best=float("nan")) is None  # a new run


def test_league_headline_is_main_win_rate():
    d = display({}, terminal=False, best_metric="league/main_win_rate_vs_frozen")
    line = d.plain_line({"iteration": 4, "league/main_win_rate_vs_frozen": 0.625})
    assert "main win rate vs frozen 0.625" in line


def test_plain_lines_off_terminal_are_never_wrapped():
    d = display(
        {"env_steps": 123_456_789, "time_s": 3600, "iterations": 100_000, "reward": 475}, terminal=False, width=40
    )
    assert not d.live_mode
    with d:
        d.update(result(7, 1_234_567, 321.5, **{"learner/vf_loss": 123456.789}), best=19.5)
        d.update(result(8, 1_334_567, 341.5), best=19.5)
    lines = d.console.file.getvalue().splitlines()
    assert lines[0] == "ppo on CartPole-v1" and len(lines) == 3  # title, then one line per update
    first = lines[1]
    assert len(first) > 40  # longer than the console, and still one line
    assert "steps 1,234,567/123,456,789" in first and "vf_loss 1.235e+05" in first
    assert re.search(r"time 321\.5/3,600\.0 s\s+9% limit in 54m38s", first)  # the reward may stop it first
    assert "policy_loss -0.0123" in first and "return 20" in first


def test_missing_figures_show_a_dash():
    d = display({}, terminal=False)
    line = d.plain_line({"iteration": 1, "env_steps_sampled": 10, "time_total_s": 1.0})
    assert "policy_loss -" in line and "return -" in line and "ETA" not in line


def test_off_terminal_the_interval_holds_lines_back_but_the_last_is_printed():
    d = display({"iterations": 10}, terminal=False)
    d.plain_every_s = 3600.0
    with d:
        for i in range(1, 5):
            d.update(result(i, 100 * i, float(i)))
    lines = d.console.file.getvalue().splitlines()
    assert len(lines) == 3 and lines[1].startswith("iter 1 ") and lines[2].startswith("iter 4 ")


def test_declared_display_metrics_are_what_the_learners_report():
    from shoal.algorithms.dqn import DQNConfig
    from shoal.algorithms.ppo import PPOConfig

    configs = [
        PPOConfig(env="CartPole-v1", seed=0, train_batch_size=256, minibatch_size=256, num_sgd_iter=1),
        DQNConfig(env="CartPole-v1", seed=0, learning_starts=64, min_env_steps_per_iteration=128),
    ]
    for config in configs:
        algo = config.build()
        try:
            r = {}
            for _ in range(2):
                r = algo.train()
            keys = [key for key, _ in algo.display_metrics()]
            assert keys and all(k in r for k in keys), (config.algo, keys, sorted(r))
        finally:
            algo.stop()


def test_restarts_and_timeouts_show_only_when_there_are_some():
    d = display({}, terminal=False)
    assert "restarts" not in d.plain_line({"iteration": 1, "num_worker_restarts": 0, "num_worker_timeouts": 0})
    line = d.plain_line({"iteration": 2, "num_worker_restarts": 3, "num_worker_timeouts": 1})
    assert "restarts 3" in line and "timeouts 1" in line


def test_an_evaluated_headline_is_pending_until_its_first_value_then_keeps_its_last():
    """A league's exploitability comes every evaluation_interval iterations: before the first it
    said "-" (for ~50 s on Leduc), and between two evaluations too."""
    d = display({}, terminal=False, best_metric="evaluation/exploitability", headline_every=10)
    d.observe(result(1, 1000, 5.0))
    d.observe(result(2, 2000, 10.0))  # 5 s an iteration: iteration 10 in ~40 s
    assert "exploitability pending (iter 10, ~40s)" in d.plain_line(result(2, 2000, 10.0))
    evaluated = result(10, 10_000, 50.0, **{"evaluation/exploitability": 0.4321})
    d.observe(evaluated)
    assert "exploitability 0.4321  " in d.plain_line(evaluated, best=0.4321)
    later = result(11, 11_000, 55.0)
    d.observe(later)
    assert "exploitability 0.4321 (iter 10)" in d.plain_line(later, best=0.4321)
    plain = display({}, terminal=False, best_metric="evaluation/exploitability")  # no interval known: a dash
    assert "exploitability -" in plain.plain_line(result(1, 1000, 5.0))
