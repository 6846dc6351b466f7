"""The adaptive KL penalty against a target network (APPO, AlphaStar): what KL moves the
coefficient, how often, within which bounds, and that it settles where the KL tracks kl_target."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from shoal.algorithms.appo import APPOConfig
from shoal.batch import Batch
from shoal.errors import ConfigError
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.target import AdaptiveKL


def test_coefficient_is_floored_and_capped_and_climbs_back_from_the_floor():
    kl = AdaptiveKL(1.0, target=0.01)
    for _ in range(100):  # KL far below target / 2: halves each time, down to the floor
        kl.update(1e-9)
    assert kl.coeff == AdaptiveKL.MIN_COEFF == 1e-6
    for _ in range(34):  # KL above 2 * target: x1.5 each time; 1e-6 * 1.5 ** 34 = 0.9707
        kl.update(1.0)
    assert kl.coeff == pytest.approx(1e-6 * 1.5**34)
    for _ in range(100):
        kl.update(1.0)
    assert kl.coeff == AdaptiveKL.MAX_COEFF
    kl.update(0.01)  # inside [target / 2, 2 * target]: unchanged
    assert kl.coeff == AdaptiveKL.MAX_COEFF
    off = AdaptiveKL(1.0, target=0.01, enabled=False)
    assert off.update(1.0) == 0.0


class ScriptedKLLoss:
    """A loss whose ``kl`` stat is the index of the update (0, 1, 2, ...): which update's KL the
    coefficient saw is then readable from the value."""

    def __init__(self):
        self.calls = 0

    def __call__(self, module, batch, learner=None):
        loss = module(batch["x"]).pow(2).mean()
        stats = {"kl": torch.tensor(float(self.calls))}
        self.calls += 1
        return loss, stats


def test_the_coefficient_moves_once_per_target_refresh_on_the_periods_last_kl():
    """Period 3, six updates: the refreshes follow updates 2 and 5, so the coefficient sees the
    KLs those updates measured against the target before it refreshed (2 and 5, not the
    result's mean 2.5 and not a KL after the refresh); both are above 2 * kl_target (x1.5 each)."""
    cfg = SimpleNamespace(
        lr=0.01,
        grad_clip=None,
        lr_schedule=None,
        max_nonfinite_updates=3,
        use_kl_loss=True,
        kl_coeff=1.0,
        kl_target=0.5,
    )
    loss = ScriptedKLLoss()
    pl = PolicyLearner(torch.nn.Linear(2, 1), cfg, lambda c, target, kl: loss, target_period=3)
    batch = Batch({"x": np.ones((6, 2), np.float32)})
    stats = pl.learner.update(batch, num_epochs=6, minibatch_size=6, rng=np.random.default_rng(0))
    assert pl.learner.num_updates == 6 and pl.target.num_updates == 2
    assert stats["kl"] == pytest.approx(2.5)  # the result's mean: 0..5
    pl.after_update(stats)
    assert stats["period_kl"] == pytest.approx(3.5)  # mean of 2 and 5
    assert stats["kl_coeff"] == pytest.approx(2.25) == pl.kl.coeff
    pl.after_update(dict(stats))  # no refresh since: unchanged
    assert pl.kl.coeff == pytest.approx(2.25)
    # KL 0.6 at the next period's end (update 8): inside [0.25, 1] around kl_target 0.5 -> unchanged
    loss.calls = -1.4  # updates 6, 7 and 8 report -1.4, -0.4 and 0.6
    for _ in range(3):
        pl.learner.update(batch, num_epochs=1, minibatch_size=6, rng=np.random.default_rng(0))
    out: dict = {"kl": 0.0}
    pl.after_update(out)
    assert out["period_kl"] == pytest.approx(0.6) and pl.kl.coeff == pytest.approx(2.25)
    assert pl.kl_stats() == {"kl_coeff": pytest.approx(2.25), "period_kl": pytest.approx(0.6)}


def test_without_a_target_network_the_results_mean_kl_moves_it():
    cfg = SimpleNamespace(
        lr=0.01,
        grad_clip=None,
        lr_schedule=None,
        max_nonfinite_updates=3,
        use_kl_loss=True,
        kl_coeff=1.0,
        kl_target=0.01,
    )
    pl = PolicyLearner(torch.nn.Linear(2, 1), cfg, lambda c, target, kl: ScriptedKLLoss())
    stats = {"kl": 0.001}  # below target / 2: halved
    pl.after_update(stats)
    assert stats["kl_coeff"] == 0.5 and "period_kl" not in stats


def test_kl_loss_against_a_target_refreshed_every_update_is_a_config_error():
    with pytest.raises(ConfigError, match="target_update_frequency is 1: the target is refreshed after every update"):
        APPOConfig(env="CartPole-v1", use_kl_loss=True, target_update_frequency=1)
    APPOConfig(env="CartPole-v1", use_kl_loss=False, target_update_frequency=1)  # no penalty: fine


def test_on_cartpole_the_coefficient_settles_where_the_period_kl_tracks_kl_target():
    """APPO's CartPole preset with the penalty on and steps large enough for the KL over a target
    period to pass the target (lr 1e-2, refreshes every 32 updates: measured, the period KL
    reaches 0.04-0.16 where the coefficient is small): over the second half of the run the
    coefficient stays well off its bounds, within a band, and the median period KL is near
    kl_target. (On the preset's own lr 1e-3 and period 4 the period KL is mostly 1e-5 to 1e-4
    with bursts to 0.04, and a kl_target of 0.01 leaves the coefficient at its floor.)"""
    from shoal.config import load_yaml

    data = load_yaml("examples/appo_cartpole.yaml")
    for key in ("algo", "stop"):
        data.pop(key)
    target = 0.005
    data.update(use_kl_loss=True, kl_target=target, lr=0.01, target_update_frequency=32, seed=0)
    rows = []
    with APPOConfig(**data).build() as algo:
        while len(rows) < 400:
            r = algo.train()
            if "learner/period_kl" in r:
                rows.append((r["env_steps_sampled"], r["learner/kl_coeff"], r["learner/period_kl"]))
            if r["env_steps_sampled"] >= 1_500_000:
                break
    late = rows[len(rows) // 2 :]
    assert len(late) >= 10, rows
    coeffs = np.array([c for _, c, _ in late])
    kls = np.array([k for _, _, k in late])
    # The learner thread runs beside the sampler, so how many updates land per period varies with
    # load: one CI run had a stretch of ~11 quiet periods (period KL under target / 2) that took the
    # coefficient from 2e-2 to 1e-5 before it rose again. What the controller must show is that it
    # tracks: the coefficient's middle half stays well off its bounds, in a band, never sits on
    # either bound, and the median period KL is near kl_target.
    lo, mid, hi = np.percentile(coeffs, [25, 50, 75])
    assert 100 * AdaptiveKL.MIN_COEFF < mid < AdaptiveKL.MAX_COEFF / 100, coeffs
    assert 10 * AdaptiveKL.MIN_COEFF < lo and hi < AdaptiveKL.MAX_COEFF / 100, coeffs
    assert hi / lo < 1000, coeffs  # a band, not a drift to either end
    assert coeffs.min() > AdaptiveKL.MIN_COEFF and coeffs.max() < AdaptiveKL.MAX_COEFF, coeffs
    assert target / 4 < np.median(kls) < 4 * target, kls
