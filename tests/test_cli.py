"""The `shoal` command line: algos, --help, train -> evaluate -> resume, and user errors (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import flat, invoke

METRICS = (
    "iteration",
    "env_steps_sampled",
    "env_steps_trained",
    "episode_return_mean",
    "episode_len_mean",
    "episodes_total",
    "time_total_s",
    "env_steps_per_s",
)
SMALL = [
    "--set",
    "train_batch_size=512",
    "--set",
    "minibatch_size=256",
    "--set",
    "num_sgd_iter=2",
    "--envs-per-worker",
    "4",
    "--seed",
    "0",
]


def test_algos_lists_ppo():
    r = invoke("algos")
    assert r.exit_code == 0, r.output
    assert "ppo" in r.output and "Proximal Policy Optimization" in flat(r.output)


def test_algos_subprocess():
    p = subprocess.run([sys.executable, "-m", "shoal", "algos"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ppo" in p.stdout


@pytest.mark.parametrize("cmd", [[], ["train"], ["evaluate"], ["resume"], ["algos"]])
def test_help(cmd):
    r = invoke(*cmd, "--help")
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output
    for sub in ("train", "evaluate", "resume", "algos"):
        if not cmd:
            assert sub in r.output


def test_train_help_documents_options():
    out = flat(invoke("train", "--help").output)
    for opt in ("--env", "--set", "--stop-iters", "--out", "--quiet", "--config"):
        assert opt in out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--stop-iters", 2, "--out", out, "-q", *SMALL)
    assert r.exit_code == 0, r.output
    dirs = list(out.iterdir())
    assert len(dirs) == 1
    assert "Stopped on iterations" in flat(r.output)
    return dirs[0]


def read_results(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]


def test_train_writes_run_dir(run_dir):
    assert run_dir.name.startswith("ppo_CartPole-v1_")
    assert (run_dir / "config.yaml").is_file()
    assert "train_batch_size: 512" in (run_dir / "config.yaml").read_text()
    rows = read_results(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        for k in METRICS:
            assert k in r, k
    assert rows[1]["env_steps_sampled"] > rows[0]["env_steps_sampled"] > 0
    csv_lines = (run_dir / "progress.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and "iteration" in csv_lines[0].split(",")
    assert list(run_dir.glob("events.out.tfevents*"))
    assert (run_dir / "checkpoints" / "checkpoint_000002" / "meta.json").is_file()
    assert (run_dir / "checkpoints" / "best" / "state.pt").is_file()
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"  # drawn when the run ended


def test_evaluate_then_resume(run_dir):
    r = invoke("evaluate", run_dir, "--episodes", 3)
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    assert "mean return" in text and "over 3 greedy episodes" in text

    r = invoke("resume", run_dir, "--stop-iters", 4, "-q")
    assert r.exit_code == 0, r.output
    rows = read_results(run_dir)
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4]
    steps = [row["env_steps_sampled"] for row in rows]
    assert steps == sorted(steps) and len(set(steps)) == 4  # counters carried over
    assert (run_dir / "checkpoints" / "checkpoint_000004").is_dir()
    assert len((run_dir / "progress.csv").read_text().splitlines()) == 5


def assert_user_error(r, *words):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    text = flat(r.output)
    assert "error:" in text
    for w in words:
        assert w in text, (w, text)
    return text


def test_unknown_algorithm(tmp_path):
    r = invoke("train", "ppx", "--env", "CartPole-v1", "--out", tmp_path, "-q")
    assert_user_error(r, "Unknown algorithm 'ppx'", "'ppo'")


def test_misspelt_set_key(tmp_path):
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--out", tmp_path, "-q", "--set", "lrr=0.1")
    assert_user_error(r, "lrr", "Did you mean 'lr'?")
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--out", tmp_path, "-q", "--set", "resources.num_worker=1")
    assert_user_error(r, "resources.num_workers")
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--out", tmp_path, "-q", "--set", "lr")
    assert_user_error(r, "key=value")
    assert list(tmp_path.iterdir()) == []


def test_unknown_env(tmp_path):
    r = invoke("train", "ppo", "--env", "CartPol-v1", "--stop-iters", 1, "--out", tmp_path, "-q")
    assert_user_error(r, "Unknown env 'CartPol-v1'", "'CartPole-v1'")
    assert list(tmp_path.iterdir()) == []  # no run directory for a run that never started


def test_evaluate_missing_path(tmp_path):
    r = invoke("evaluate", tmp_path / "nope")
    assert_user_error(r, "does not exist")


def test_evaluate_not_a_checkpoint(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    r = invoke("evaluate", tmp_path)
    assert_user_error(r, "No shoal checkpoint found")


def test_resume_set_changes_a_mutable_key_and_refuses_the_others(tmp_path):
    from shoal import checkpoint as ckpt

    r = invoke("train", "ppo", "--env", "CartPole-v1", "--stop-iters", 1, "--out", tmp_path, "-q", *SMALL)
    assert r.exit_code == 0, r.output
    (run,) = tmp_path.iterdir()
    text = assert_user_error(
        invoke("resume", run, "--set", "minibatch_size=64", "--stop-iters", 2, "-q"),
        "cannot change 'minibatch_size'",
        "entropy_coeff",
        "lr",
    )
    assert "shoal train ppo" in text and [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == [
        "checkpoint_000001"
    ]
    assert_user_error(invoke("resume", run, "--set", "lr=-1", "--stop-iters", 2, "-q"), "lr")
    r = invoke("resume", run, "--set", "lr=0.0123", "--set", "entropy_coeff=0.02", "--stop-iters", 2, "-q")
    assert r.exit_code == 0, r.output
    last = ckpt.list_checkpoints(run / "checkpoints")[-1]
    assert last.name == "checkpoint_000002"
    meta = ckpt.read_meta(last)
    assert meta["config"]["lr"] == 0.0123 and meta["config"]["entropy_coeff"] == 0.02
    state, _ = ckpt.load_checkpoint(last)
    assert state["learner"]["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0123)


def test_resume_not_a_run_dir(tmp_path):
    assert_user_error(invoke("resume", tmp_path / "nope"), "does not exist")
    assert_user_error(invoke("resume", tmp_path), "no checkpoints")


def test_missing_config_file(tmp_path):
    r = invoke("train", "ppo", "-c", tmp_path / "missing.yaml", "--out", tmp_path)
    assert_user_error(r, "missing.yaml", "does not exist")


def test_config_file_bad_stop_and_other_algo(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo: dqn\nenv: CartPole-v1\n")
    assert_user_error(invoke("train", "ppo", "-c", p, "--out", tmp_path), "'dqn'")
    p.write_text("env: CartPole-v1\nstop:\n  rewards: 10\n")
    assert_user_error(invoke("train", "ppo", "-c", p, "--out", tmp_path), "`stop`")


def test_a_config_file_that_names_its_algorithm_needs_no_algo_argument(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo: ppo\nenv: CartPole-v1\ntrain_batch_size: 256\nminibatch_size: 128\nnum_sgd_iter: 1\n")
    r = invoke("train", "-c", p, "--stop-iters", 1, "--no-stop-reward", "-q", "--out", tmp_path / "runs")
    assert r.exit_code == 0, r.output
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("ppo_CartPole-v1")
    p.write_text("env: CartPole-v1\n")
    assert_user_error(invoke("train", "-c", p, "--out", tmp_path), "No algorithm given", "algo: ppo")
    assert_user_error(invoke("train", "--env", "CartPole-v1", "--out", tmp_path), "No algorithm given")


def test_another_algorithms_keys_are_named_once_with_the_valid_keys_once(tmp_path):
    p = tmp_path / "dqn_like.yaml"  # a DQN preset without its algo line, trained as PPO
    p.write_text("env: CartPole-v1\nn_step: 3\nlearning_starts: 500\ntraining_intensity: 4\nlrr: 0.1\n")
    text = assert_user_error(invoke("train", "ppo", "-c", p, "--out", tmp_path), "Did you mean 'lr'?")
    assert text.count("Valid keys") == 1 and len(re.findall(r"\bentropy_coeff\b", text)) == 1  # not ..._schedule
    for key in ("n_step", "learning_starts", "training_intensity"):
        assert text.count(f"'{key}'") == 1, key
    assert text.count("'lrr'") == 2  # named, then with its suggestion
    assert len(text) < 1500, len(text)


def test_no_env(tmp_path):
    assert_user_error(invoke("train", "ppo", "--out", tmp_path, "-q"), "No env given")


def test_bad_stop_value(tmp_path):
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--stop-iters", 0, "--out", tmp_path, "-q")
    text = assert_user_error(r, "iterations", "greater than or equal to 1")
    assert "pydantic" not in text
    p = tmp_path / "c.yaml"
    p.write_text("env: CartPole-v1\nstop:\n  time_s: soon\n")
    assert_user_error(invoke("train", "ppo", "-c", p, "--out", tmp_path, "-q"), "time_s")
    assert [x.name for x in tmp_path.iterdir()] == ["c.yaml"]


def test_apex_cli_uses_the_small_machine_preset_only_without_resources():
    from shoal.app.cli_config import _build_config

    flags = {
        "env": "CartPole-v1",
        "seed": None,
        "resources": {"num_workers": None, "num_envs_per_worker": None, "address": None},
    }
    cfg, _, note = _build_config("apex", None, ["lr=0.002"], flags)
    assert "small_machine_preset" in note
    assert cfg.resources.num_workers == 2 and cfg.resources.num_replay_shards == 2
    assert cfg.replay_capacity == 100_000 and cfg.lr == 0.002  # preset below user keys
    cfg, _, note = _build_config("apex", None, [], {**flags, "resources": {"num_workers": 0}})
    assert note is None
    assert cfg.resources.num_workers == 0 and cfg.replay_capacity == 2_000_000  # ApeXConfig's defaults


def stop_of(out):
    """The stop criteria a run recorded in run.yaml (the only run directory under ``out``)."""
    import yaml

    (d,) = list(out.iterdir())
    return yaml.safe_load((d / "run.yaml").read_text())["stop"]


def test_given_stop_criteria_keep_the_envs_reward_threshold(tmp_path):
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--stop-iters", 1, "--out", tmp_path / "a", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    assert stop_of(tmp_path / "a") == {"reward": 475.0, "env_steps": None, "time_s": None, "iterations": 1}
    assert "target 475 not reached" in flat(r.output)
    p = tmp_path / "c.yaml"
    p.write_text("env: CartPole-v1\nstop:\n  iterations: 1\n")
    r = invoke("train", "ppo", "-c", p, "--out", tmp_path / "b", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    assert stop_of(tmp_path / "b")["reward"] == 475.0 and stop_of(tmp_path / "b")["iterations"] == 1


def test_no_stop_reward_drops_the_threshold(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("env: CartPole-v1\nstop:\n  reward: 100\n  iterations: 1\n")
    r = invoke("train", "ppo", "-c", p, "--no-stop-reward", "--out", tmp_path / "a", "-q", *SMALL)
    assert r.exit_code == 0, r.output
    assert stop_of(tmp_path / "a") == {"reward": None, "env_steps": None, "time_s": None, "iterations": 1}
    r = invoke(
        "train", "ppo", "--env", "CartPole-v1", "--stop-reward", 100, "--no-stop-reward", "--out", tmp_path / "b"
    )
    assert_user_error(r, "--stop-reward", "--no-stop-reward")
    assert not (tmp_path / "b").exists()
    help_text = flat(invoke("train", "--help").output)
    assert "--no-stop-reward" in help_text and "first criterion met" in help_text


def test_resume_no_stop_reward_drops_the_runs_reward_criterion(tmp_path):
    """A run solved on a low reward: resume goes on only once --no-stop-reward drops that criterion."""
    tiny = ["--set", "train_batch_size=64", "--set", "minibatch_size=32", "--set", "num_sgd_iter=1", "--seed", "0"]
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--stop-reward", 1, "--out", tmp_path, "-q", *tiny)
    assert r.exit_code == 0 and "Solved" in r.output, r.output
    (run,) = tmp_path.iterdir()
    n = len(read_results(run))  # the iteration that reached the reward
    r = invoke("resume", run, "--stop-iters", n + 1, "-q")
    assert r.exit_code == 0 and "already meets its stop criterion mean return" in flat(r.output), r.output
    assert "--no-stop-reward" in flat(r.output)
    assert_user_error(invoke("resume", run, "--stop-reward", 5, "--no-stop-reward"), "--stop-reward 5", "contradict")
    r = invoke("resume", run, "--stop-iters", n + 1, "--no-stop-reward", "-q")
    assert r.exit_code == 0 and "Stopped on iterations" in flat(r.output), r.output
    assert stop_of(tmp_path) == {"reward": None, "env_steps": None, "time_s": None, "iterations": n + 1}
    assert [row["iteration"] for row in read_results(run)] == list(range(1, n + 2))


def test_apex_preset_is_announced_and_recorded_in_config_yaml(tmp_path, monkeypatch):
    import yaml

    from shoal.algorithms.apex import ApeXConfig

    # A test-sized preset (in-process, tiny replay) so that the run takes a second; the mechanism is the same.
    preset = {
        "resources": {"num_workers": 0, "num_envs_per_worker": 2, "num_replay_shards": 1},
        "n_step": 3,
        "learning_starts": 64,
        "replay_capacity": 1000,
        "rollout_fragment_length": 8,
        "min_time_s_per_iteration": 0.0,
        "lr": 0.002,
    }
    monkeypatch.setattr(ApeXConfig, "small_machine_preset", classmethod(lambda cls: preset))
    r = invoke(
        "train", "apex", "--env", "CartPole-v1", "--stop-iters", 1, "--set", "lr=0.01", "--out", tmp_path / "a", "-q"
    )
    assert r.exit_code == 0, r.output
    (note,) = [line for line in r.output.splitlines() if "small_machine_preset" in line]  # one line
    changed = (
        "resources.num_envs_per_worker=2",
        "resources.num_replay_shards=1",
        "learning_starts=64",
        "replay_capacity=1000",
        "rollout_fragment_length=8",
        "min_time_s_per_iteration=0.0",
    )
    for kv in changed:
        assert kv in note, kv
    assert "n_step" not in note and "num_workers" not in note  # the preset's value is the default: no change
    assert "lr=" not in note  # the user's --set lr wins over the preset
    assert "--workers" in note and "resources" in note  # how to opt out
    (run,) = list((tmp_path / "a").iterdir())
    text = (run / "config.yaml").read_text()
    assert text.startswith("#") and "small_machine_preset" in text.split("\nalgo:")[0]
    for kv in changed:
        assert kv in text.split("\nalgo:")[0], kv
    cfg = yaml.safe_load(text)
    assert cfg["resources"]["num_replay_shards"] == 1 and cfg["lr"] == 0.01 and cfg["replay_capacity"] == 1000

    # The recorded config trains again as it is, and, holding resources, without the preset.
    r = invoke("train", "apex", "-c", run / "config.yaml", "--stop-iters", 1, "--out", tmp_path / "b", "-q")
    assert r.exit_code == 0, r.output
    assert "small_machine_preset" not in r.output
    (run_b,) = list((tmp_path / "b").iterdir())
    assert yaml.safe_load((run_b / "config.yaml").read_text()) == cfg
    assert not (run_b / "config.yaml").read_text().startswith("#")


def test_version_and_short_help():
    import shoal

    r = invoke("--version")
    assert r.exit_code == 0 and r.output.strip() == f"shoal {shoal.__version__}"
    r = invoke("-h")
    assert r.exit_code == 0 and "train" in r.output and "--install-completion" in r.output
    r = invoke("train", "-h")
    assert r.exit_code == 0 and "--stop-time" in r.output


def test_license_matches_pyproject_and_the_package_is_typed():
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["license"]["text"] == "Apache-2.0"
    assert "Apache License" in (root / "LICENSE").read_text() and "Version 2.0" in (root / "LICENSE").read_text()
    assert (root / "shoal" / "py.typed").is_file()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["shoal"]
    assert (root / "CHANGELOG.md").is_file()


def test_a_run_with_no_stop_criterion_says_so_and_names_the_flags(capsys):
    """An env without a reward threshold and no stop given: the note names each way to stop."""
    from shoal.app.cli_reports import _start_notes
    from shoal.app.trainer import Stop

    _start_notes(None, Stop())
    err = capsys.readouterr().err
    assert "training until Ctrl-C" in err and "no reward threshold" in err
    for flag in ("--stop-reward", "--stop-steps", "--stop-time", "--stop-iters", "stop:"):
        assert flag in err, flag
    _start_notes(None, Stop(iterations=3))  # a criterion: nothing to say
    assert capsys.readouterr().err == ""
