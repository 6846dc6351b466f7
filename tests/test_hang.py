"""A hung env: the request times out, its actor is recreated, and the run goes on."""

from __future__ import annotations

import logging

import pytest

from shoal import PPOConfig

HANG = "flaky_envs:HangingCartPole"
SMALL = dict(train_batch_size=256, minibatch_size=128, num_sgd_iter=1, rollout_fragment_length=32)


def _res(**kw):
    return {"num_workers": 2, "num_envs_per_worker": 4, "num_cpus_per_worker": 0.5, "request_timeout_s": 3, **kw}


def test_ppo_hung_env_times_out_and_the_actor_is_recreated(ray_cluster, tmp_path, caplog):
    cfg = PPOConfig(env=HANG, env_config={"hang_at": 10, "marker": str(tmp_path / "hung")}, seed=0,
                    resources=_res(), **SMALL)
    algo = cfg.build()
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.runtime"):
            results = [algo.train() for _ in range(3)]
        assert (tmp_path / "hung").exists()  # one env did hang
        last = results[-1]
        assert last["num_worker_timeouts"] == 1
        assert last["num_worker_restarts"] == 1
        assert last["iteration"] == 3 and last["env_steps_trained"] > 0
        line = next(r.getMessage() for r in caplog.records if "has not returned" in r.getMessage())
        assert "rollout actor" in line and "sample()" in line and "HangingCartPole" in line and "request_timeout_s=3" in line
        # The replacement samples: both actors answer again.
        assert len(algo.env_runners.foreach("get_weights")) == 2
    finally:
        algo.stop()
