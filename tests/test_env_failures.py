"""Envs that raise or send NaN: recreated and counted, or stopped with a clear error (exit 2)."""

from __future__ import annotations

import flaky_envs
import pytest
from helpers import invoke

from shoal import PPOConfig
from shoal import checkpoint as ckpt
from shoal.errors import EnvFailureError, NonFiniteEnvError
from shoal.rollout.faults import EnvFaults

ENV = "flaky_envs:FlakyCartPole"
SMALL = dict(
    env=ENV, train_batch_size=64, minibatch_size=64, num_sgd_iter=1, seed=0, resources={"num_envs_per_worker": 1}
)


def _config(tag: str, **env_config) -> PPOConfig:
    return PPOConfig(**SMALL, env_config={"tag": tag, **env_config})


def test_an_env_that_raises_once_is_recreated_and_counted():
    # instances 1 and 2 (the spaces, make_vec_env's probe) are healthy; 3 (the runner's env) raises at step 10;
    # the recreated vector env (4 and 5) is healthy again
    with _config("once", fail_at=10, healthy=2, faulty=1).build() as algo:
        r1 = algo.train()
        assert r1["num_env_failures"] == 1
        # the dropped fragment was sampled again: 64 rows, less a few autoreset rows (CartPole episodes last >= 8 steps)
        assert 56 <= r1["env_steps_sampled"] <= 64
    assert flaky_envs.INSTANCES["once"] == 5


def test_a_run_of_failures_stops_with_the_envs_own_message():
    with pytest.raises(EnvFailureError) as info:
        with PPOConfig(
            **SMALL, env_config={"tag": "always", "fail_at": 3}, max_consecutive_env_failures=4
        ).build() as algo:
            algo.train()
    msg = " ".join(str(info.value).split())
    assert "failed 4 times in a row" in msg and "boom at step 3: the simulator crashed" in msg
    assert "RuntimeError" in msg and "max_consecutive_env_failures=4" in msg


def test_failures_not_in_a_row_do_not_stop_the_run():
    faults = EnvFaults(PPOConfig(env="CartPole-v1", max_consecutive_env_failures=2), 3)
    calls = iter([RuntimeError("a"), "ok", RuntimeError("b"), "ok"])

    def attempt():
        from shoal.rollout.faults import env_call

        def env_step():
            x = next(calls)
            if isinstance(x, Exception):
                raise x
            return x

        return env_call("step", env_step)

    recreated = []
    assert faults.guard(attempt, lambda: recreated.append(1)) == "ok"
    assert faults.guard(attempt, lambda: recreated.append(1)) == "ok"
    assert (faults.total, faults.in_a_row, len(recreated), faults.take_new(), faults.take_new()) == (2, 0, 2, 2, 0)
    assert faults.where == "rollout actor 3"


def test_nan_reward_and_inf_observation_are_reported():
    with pytest.raises(NonFiniteEnvError) as info:
        with _config("nanr", nan_at=7).build() as algo:
            algo.train()
    msg = " ".join(str(info.value).split())
    assert "returned a reward holding NaN or inf at its step 6" in msg and "sub-env 0" in msg and "FlakyCartPole" in msg
    with pytest.raises(NonFiniteEnvError, match="observation"):
        with _config("info", nan_at=7, nan_field="observation").build() as algo:
            algo.train()


def test_nan_reward_from_a_multi_agent_env_is_reported():
    cfg = PPOConfig(
        env="flaky_envs:nan_multi_cartpole",
        seed=0,
        rollout_fragment_length=10,
        minibatch_size=40,
        resources={"num_envs_per_worker": 2},
        multi_agent={"policies": {"p": None}, "policy_mapping": {"agent_0": "p", "agent_1": "p"}},
    )
    with pytest.raises(NonFiniteEnvError, match="returned a reward holding NaN or inf to an agent of policy 'p'"):
        with cfg.build() as algo:
            algo.train()


def test_cli_env_that_fails_for_good_exits_2_with_a_checkpoint(tmp_path):
    # every env raises at its second step: nothing is ever sampled
    r = invoke(
        "train",
        "ppo",
        "--env",
        ENV,
        "--set",
        "env_config={tag: cli, fail_at: 2, healthy: 0}",
        "--set",
        "train_batch_size=64",
        "--set",
        "minibatch_size=64",
        "--set",
        "num_sgd_iter=1",
        "--envs-per-worker",
        1,
        "--seed",
        0,
        "--stop-iters",
        3,
        "-q",
        "--out",
        tmp_path,
    )
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "failed 5 times in a row" in out and "boom" in out and "Traceback" not in out


def test_cli_env_failing_after_some_iterations_leaves_the_last_good_checkpoint(tmp_path):
    r = invoke(
        "train",
        "ppo",
        "--env",
        ENV,
        "--set",
        "env_config={tag: later, fail_at: 150, healthy: 0}",
        "--set",
        "train_batch_size=64",
        "--set",
        "minibatch_size=64",
        "--set",
        "num_sgd_iter=1",
        "--set",
        "max_consecutive_env_failures=1",
        "--envs-per-worker",
        1,
        "--seed",
        0,
        "--stop-iters",
        10,
        "--checkpoint-every",
        100,
        "-q",
        "--out",
        tmp_path,
    )
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    # steps 1..149 are fine: iterations 1 and 2 (64 steps each) finish, iteration 3 meets the failure
    run = next(tmp_path.iterdir())
    names = [p.name for p in ckpt.list_checkpoints(run / "checkpoints")]
    assert names == ["checkpoint_000002"] and "checkpoint_000002" in out


def test_cli_env_that_fails_in_reset(tmp_path):
    r = invoke(
        "train",
        "ppo",
        "--env",
        ENV,
        "--set",
        "env_config={tag: reset, fail_in: reset, healthy: 1}",
        "--stop-iters",
        1,
        "-q",
        "--out",
        tmp_path,
    )
    assert r.exit_code == 2, r.output
    assert "in reset" in " ".join(r.output.split())


@pytest.mark.usefixtures("ray_cluster")
def test_ray_actor_recreates_its_env_and_stops_on_nan():
    cfg = dict(SMALL, resources={"num_workers": 1, "num_envs_per_worker": 1, "num_cpus_per_worker": 0.5})
    with PPOConfig(**cfg, env_config={"tag": "ray", "fail_at": 10, "healthy": 1, "faulty": 1}).build() as algo:
        r = algo.train()
        assert (r["num_env_failures"], r["num_worker_restarts"]) == (1, 0)  # handled in the actor, not by a restart
    with pytest.raises(NonFiniteEnvError, match="rollout actor 1"):
        with PPOConfig(**cfg, env_config={"tag": "raynan", "nan_at": 5}).build() as algo:
            algo.train()
