"""`shoal` finds 'module:function' envs in the directory it starts in, as `python -m shoal` does,
and names the run after the function."""

import os
import sys

import pytest

ENV_MODULE = """
import gymnasium as gym


def make_short_cartpole():
    return gym.make("CartPole-v1", max_episode_steps=20)
"""


def test_shoal_imports_envs_from_the_working_directory(tmp_path, monkeypatch):
    from shoal.app import cli

    (tmp_path / "cwd_envs_for_shoal.py").write_text(ENV_MODULE)
    monkeypatch.chdir(tmp_path)
    # the console script's import path: its own directory, never the working directory
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "shoal",
            "train",
            "ppo",
            "-e",
            "cwd_envs_for_shoal:make_short_cartpole",
            "--stop-iters",
            "1",
            "--out",
            "runs",
            "--quiet",
            "--set",
            "train_batch_size=256",
            "--set",
            "minibatch_size=256",
            "--envs-per-worker",
            "2",
        ],
    )
    monkeypatch.delitem(sys.modules, "cwd_envs_for_shoal", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code in (0, None)
    assert sys.path[-1] == str(tmp_path)  # appended: it shadows no installed package
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("ppo_make_short_cartpole_")
