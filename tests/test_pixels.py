"""Pixels end to end on PixelCatch (a 10x10 uint8 frame game that learns in seconds): frames stay
uint8 from the env through a Ray rollout actor and the object store to the learner, which
scales them itself; and a CNN agent clearly beats a random one."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.batch import Batch, Col

CATCH = "shoal.envs.pixel_catch:PixelCatch"
SMALL_CNN = {"torso": "conv", "conv_filters": [[16, 3, 1], [16, 3, 2]], "hiddens": [64], "activation": "relu"}
RANDOM_RETURN = -0.39  # mean over 3,000 games of uniformly random play


def _record_learner_inputs(monkeypatch) -> list[tuple[np.dtype, tuple]]:
    """Every batch a learner converts to tensors: (obs dtype, obs tensor dtype and shape)."""
    seen = []
    original = Batch.to_torch

    def to_torch(self, device="cpu", exclude=()):
        out = original(self, device, exclude)
        if Col.OBS in self.data:
            seen.append((self.data[Col.OBS].dtype, out[Col.OBS].dtype, tuple(out[Col.OBS].shape)))
        return out

    monkeypatch.setattr(Batch, "to_torch", to_torch)
    return seen


@pytest.mark.ray
def test_frames_stay_uint8_from_a_ray_rollout_actor_to_the_learner(monkeypatch):
    import torch

    from shoal import runtime
    from shoal.algorithms.impala import IMPALAConfig

    seen = _record_learner_inputs(monkeypatch)
    algo = IMPALAConfig(
        env=CATCH,
        seed=0,
        model=SMALL_CNN,
        rollout_fragment_length=9,
        train_batch_size=72,
        resources={"num_workers": 1, "num_envs_per_worker": 4, "num_cpus_per_worker": 0.5},
    ).build()
    try:
        for _ in range(50):
            algo.train()
            if seen:
                break
    finally:
        algo.stop()
        runtime.shutdown()
    assert seen, "the learner saw no batch"
    np_dtype, torch_dtype, shape = seen[0]
    assert np_dtype == np.uint8 and torch_dtype == torch.uint8  # 100 bytes a frame, not 400
    assert shape[1:] == (100,)  # flat rows; the torso restores (1, 10, 10)


@pytest.mark.learning
def test_a_cnn_agent_learns_pixel_catch_in_process():
    from shoal import PPOConfig
    from shoal.app.trainer import train

    config = PPOConfig(
        env=CATCH,
        seed=0,
        model=SMALL_CNN,
        lr=1e-3,
        gamma=0.9,
        train_batch_size=2048,
        minibatch_size=256,
        num_sgd_iter=4,
        entropy_coeff=0.01,
        resources={"num_envs_per_worker": 16},
    )
    # ~40k env steps to +0.8 here; +0.5 (random play: -0.39) leaves room for a loaded CI machine
    summary = train(config, {"reward": 0.5, "time_s": 120}, out=None, progress=False)
    assert summary.solved, (
        f"best mean return {summary.best_return:.2f} after {summary.result['env_steps_sampled']} steps"
    )
    assert summary.best_return > RANDOM_RETURN + 0.8
