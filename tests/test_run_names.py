"""Run directories and titles read like ``ppo_make_env_<timestamp>`` whatever form ``env`` takes."""

import functools
import re

import gymnasium as gym

from shoal.algorithms.ppo import PPOConfig
from shoal.app.trainer import new_run_dir


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
        "my_pkg.envs:Factory.build": "build",
    }
    for env, name in cases.items():
        assert PPOConfig(env=env).env_name() == name, env


def test_run_dir_of_a_callable_env_is_readable(tmp_path):
    d = new_run_dir(tmp_path, PPOConfig(env=make_env))
    assert re.fullmatch(r"ppo_make_env_\d{8}-\d{6}", d.name), d.name
    d = new_run_dir(tmp_path, PPOConfig(env=lambda: make_env()))
    assert re.fullmatch(r"ppo_lambda_\d{8}-\d{6}", d.name), d.name
    assert "0x" not in d.name and " " not in d.name
