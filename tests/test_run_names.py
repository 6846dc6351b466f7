"""Run directories and titles read like ``ppo_make_env_<timestamp>`` whatever form ``env`` takes."""

import functools
import os
import re
from datetime import datetime

import gymnasium as gym

from shoal.algorithms.ppo import PPOConfig
from shoal.app import run_files
from shoal.app.plotting import _label
from shoal.app.run_files import new_run_dir


def make_env(**kwargs):
    return gym.make("CartPole-v1", **kwargs)


class MyEnvFactory:
    def __call__(self):
        return gym.make("CartPole-v1")


def test_names_of_every_env_form():
    def nested_maker():
        return gym.make("CartPole-v1")

    cases = {
        make_env: "make_env",
        nested_maker: "nested_maker",
        (lambda: gym.make("CartPole-v1")): "lambda",
        functools.partial(make_env, max_episode_steps=10): "make_env",
        MyEnvFactory: "MyEnvFactory",
        MyEnvFactory(): "MyEnvFactory",
        "CartPole-v1": "CartPole-v1",
        "ALE/Pong-v5": "ALE_Pong-v5",
        "my_pkg.envs:make_maze": "make_maze",
        "my_pkg.envs:Factory.build": "Factory-build",  # a generic factory name: what holds it leads
        "my_pkg.envs:make": "envs-make",
        "pettingzoo.classic.rps_v2:parallel_env": "rps_v2-parallel_env",
        "pettingzoo.classic:tictactoe_v3": "tictactoe_v3",
        "envs:make": "envs-make",
    }
    for env, name in cases.items():
        assert PPOConfig(env=env).env_name() == name, env


def test_run_dir_of_a_callable_env_is_readable(tmp_path):
    d = new_run_dir(tmp_path, PPOConfig(env=make_env))
    assert re.fullmatch(r"ppo_make_env_\d{8}-\d{6}", d.name), d.name
    d = new_run_dir(tmp_path, PPOConfig(env=lambda: make_env()))
    assert re.fullmatch(r"ppo_lambda_\d{8}-\d{6}", d.name), d.name
    assert "0x" not in d.name and " " not in d.name


class _OneSecond(datetime):
    """Every run started in the same second."""

    @classmethod
    def now(cls, tz=None):
        return cls(2026, 11, 22, 10, 15, 0)


def test_runs_started_in_one_second_get_distinct_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(run_files, "datetime", _OneSecond)
    cfg = PPOConfig(env="CartPole-v1")
    made = [new_run_dir(tmp_path / "runs", cfg) for _ in range(3)]
    assert [d.name for d in made] == [
        "ppo_CartPole-v1_20261122-101500",
        "ppo_CartPole-v1_20261122-101500-1",
        "ppo_CartPole-v1_20261122-101500-2",
    ]
    assert all(d.is_dir() and not any(d.iterdir()) for d in made)
    assert {_label(d) for d in made} == {"ppo_CartPole-v1"}  # `shoal plot` labels them as one config


def test_a_name_another_process_takes_first_is_passed_over(tmp_path, monkeypatch):
    """Two `shoal train --out SAME` in one second: the other process makes the directory between
    this one's choice of the name and its mkdir. The name is claimed by the mkdir itself, so this
    run takes the next name instead of failing with FileExistsError."""
    monkeypatch.setattr(run_files, "datetime", _OneSecond)
    out = tmp_path / "runs"
    out.mkdir()
    rival = out / "ppo_CartPole-v1_20261122-101500"
    real_mkdir = os.mkdir

    def rival_first(path, *args, **kwargs):
        if os.fspath(path) == os.fspath(rival) and not rival.exists():
            real_mkdir(rival)  # the other process wins the race for the name
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", rival_first)
    d = new_run_dir(out, PPOConfig(env="CartPole-v1"))
    assert d.name == "ppo_CartPole-v1_20261122-101500-1" and d.is_dir()
    assert sorted(p.name for p in out.iterdir()) == [rival.name, d.name]
