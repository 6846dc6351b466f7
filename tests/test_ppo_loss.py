"""PPO loss terms and the adaptive KL coefficient against hand-computed values;
Categorical / DiagGaussian against torch.distributions."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from shoal.algorithms.ppo_loss import ppo_loss_terms
from shoal.learn.target import update_kl_coeff
from shoal.models.distributions import Categorical, DiagGaussian, masked_logits

torch.set_num_threads(1)


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


# Four samples, clip_param 0.2 (ratios allowed in [0.8, 1.2]):
#   s0: r = 1.1 (inside),           A = +2 -> min(2.2, 2.2)       =  2.2
#   s1: r = 1.5 (above, clipped),   A = +1 -> min(1.5, 1.2)       =  1.2
#   s2: r = 0.5 (below, clipped),   A = -1 -> min(-0.5, -0.8)     = -0.8
#   s3: r = 0.5 (below, unclipped), A = +1 -> min(0.5, 0.8)       =  0.5
# policy_loss = -(2.2 + 1.2 - 0.8 + 0.5) / 4 = -3.1 / 4 = -0.775
RATIOS = t(1.1, 1.5, 0.5, 0.5)
ADV = t(2.0, 1.0, -1.0, 1.0)
OLD_LOGP = t(-0.3, -1.0, -2.0, -0.7)
# values / old values / targets
#   unclipped squared errors: (1-2)^2 = 1, (2-1.5)^2 = 0.25, (0-1)^2 = 1, (3-3)^2 = 0
#     vf_loss = 0.5 * (1 + 0.25 + 1 + 0) / 4 = 0.5 * 0.5625 = 0.28125
#   clipped (c = 0.3): V_clip = V_old + clip(V - V_old, -0.3, 0.3)
#     s0: 0.5 + 0.3 = 0.8 -> (0.8-2)^2 = 1.44;  max(1, 1.44)    = 1.44
#     s1: 1.0 + 0.3 = 1.3 -> (1.3-1.5)^2 = 0.04; max(0.25, 0.04) = 0.25 (unclipped is larger)
#     s2: 0.0 + 0.0 = 0.0 -> (0-1)^2 = 1;        max(1, 1)       = 1
#     s3: 1.0 + 0.3 = 1.3 -> (1.3-3)^2 = 2.89;   max(0, 2.89)    = 2.89
#     vf_loss = 0.5 * (1.44 + 0.25 + 1 + 2.89) / 4 = 0.5 * 1.395 = 0.6975
VALUES = t(1.0, 2.0, 0.0, 3.0)
OLD_VALUES = t(0.5, 1.0, 0.0, 1.0)
TARGETS = t(2.0, 1.5, 1.0, 3.0)
ENTROPY = t(0.5, 0.6, 0.7, 0.8)  # mean 0.65
KL = t(0.01, 0.02, 0.03, 0.04)  # mean 0.025


def terms(vf_clip=None, kl=KL, logp=None, **kw):
    logp = OLD_LOGP + torch.log(RATIOS) if logp is None else logp
    args = dict(clip_param=0.2, vf_clip_param=vf_clip, vf_loss_coeff=0.5, entropy_coeff=0.1, kl_coeff=0.2)
    args.update(kw)
    return ppo_loss_terms(logp, OLD_LOGP, ADV, VALUES, OLD_VALUES, TARGETS, ENTROPY, kl, **args)


def s(x):
    return torch.tensor(x, dtype=torch.float64)


def test_terms_without_value_clipping():
    out = terms(vf_clip=None)
    assert_close(out["policy_loss"], s(-0.775))
    assert_close(out["vf_loss"], s(0.28125))
    assert_close(out["entropy"], s(0.65))
    assert_close(out["kl"], s(0.025))
    # 3 of 4 ratios are more than 0.2 away from 1
    assert_close(out["clip_fraction"], torch.tensor(0.75))
    # total = -0.775 + 0.5 * 0.28125 - 0.1 * 0.65 + 0.2 * 0.025 = -0.775 + 0.140625 - 0.065 + 0.005
    assert_close(out["total_loss"], s(-0.694375))


def test_terms_with_value_clipping():
    out = terms(vf_clip=0.3)
    assert_close(out["policy_loss"], s(-0.775))
    assert_close(out["vf_loss"], s(0.6975))
    # total = -0.775 + 0.5 * 0.6975 - 0.065 + 0.005 = -0.48625
    assert_close(out["total_loss"], s(-0.48625))


def test_coefficients_enter_total_linearly():
    out = terms(vf_clip=None, vf_loss_coeff=2.0, entropy_coeff=0.0, kl_coeff=1.0)
    # -0.775 + 2 * 0.28125 - 0 + 1 * 0.025 = -0.1875
    assert_close(out["total_loss"], s(-0.1875))
    out = terms(vf_clip=None, vf_loss_coeff=0.0, entropy_coeff=1.0, kl_coeff=0.0)
    # -0.775 - 0.65 = -1.425
    assert_close(out["total_loss"], s(-1.425))


def test_without_kl_term_reports_estimate_and_excludes_it():
    out = terms(vf_clip=None, kl=None, kl_coeff=5.0)
    # total has no kl term even with kl_coeff 5: -0.775 + 0.140625 - 0.065 = -0.699375
    assert_close(out["total_loss"], s(-0.699375))
    # reported kl = mean((r - 1) - log r) over r = 1.1, 1.5, 0.5, 0.5:
    #   (0.1 - ln 1.1) + (0.5 - ln 1.5) + 2 * (-0.5 - ln 0.5)
    expected = ((0.1 - math.log(1.1)) + (0.5 - math.log(1.5)) + 2 * (-0.5 - math.log(0.5))) / 4  # ~0.12138
    assert_close(out["kl"], s(expected))
    assert not out["kl"].requires_grad


def test_clipped_samples_have_no_policy_gradient():
    logp = (OLD_LOGP + torch.log(RATIOS)).clone().requires_grad_(True)
    out = terms(vf_clip=None, logp=logp)
    out["policy_loss"].backward()
    # d/dlogp of -(1/4) * r * A is -(1/4) * r * A where unclipped, 0 where the clipped term is the min:
    #   s0: -(1.1 * 2) / 4 = -0.55; s1: 0; s2: 0; s3: -(0.5 * 1) / 4 = -0.125
    assert_close(logp.grad, t(-0.55, 0.0, 0.0, -0.125))


def test_pessimistic_bound_keeps_unclipped_term_for_bad_actions():
    # r = 1.5 with A = -2: min(-3.0, 1.2 * -2 = -2.4) = -3.0 (the clip does not cap a loss increase)
    out = ppo_loss_terms(
        torch.log(t(1.5)),
        t(0.0),
        t(-2.0),
        t(0.0),
        t(0.0),
        t(0.0),
        t(0.0),
        None,
        clip_param=0.2,
        vf_clip_param=None,
        vf_loss_coeff=0.0,
        entropy_coeff=0.0,
    )
    assert_close(out["policy_loss"], s(3.0))
    assert_close(out["clip_fraction"], torch.tensor(1.0))


def test_value_clipping_gradient_zero_when_clipped_branch_wins():
    values = VALUES.clone().requires_grad_(True)
    out = ppo_loss_terms(
        OLD_LOGP,
        OLD_LOGP,
        ADV,
        values,
        OLD_VALUES,
        TARGETS,
        ENTROPY,
        None,
        clip_param=0.2,
        vf_clip_param=0.3,
        vf_loss_coeff=1.0,
        entropy_coeff=0.0,
    )
    out["vf_loss"].backward()
    # s0 and s3: the clipped error is the max and V is outside the clip range -> zero gradient.
    # s1: the unclipped error wins: d/dV 0.5 * (V - R)^2 / 4 = (2 - 1.5) / 4 = 0.125
    # s2: V = V_old, inside the clip range: both branches are (V - R)^2 with the same gradient, (0 - 1) / 4 = -0.25
    assert_close(values.grad, t(0.0, 0.125, -0.25, 0.0))


@pytest.mark.parametrize(
    "kl, expected",
    [
        (0.03, 0.3),  # > 2 * target (0.02): x1.5
        (0.0201, 0.3),
        (0.004, 0.1),  # < target / 2 (0.005): x0.5
        (0.0049, 0.1),
        (0.01, 0.2),  # between: unchanged
        (0.02, 0.2),  # exactly 2 * target: unchanged
        (0.005, 0.2),  # exactly target / 2: unchanged
    ],
)
def test_update_kl_coeff(kl, expected):
    assert update_kl_coeff(0.2, kl, 0.01) == pytest.approx(expected)


# ---- distributions ----------------------------------------------------------------------
def test_categorical_matches_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, generator=g)
    other = torch.randn(5, 4, generator=g)
    actions = torch.tensor([0, 1, 2, 3, 1])
    d, ref = Categorical(logits), torch.distributions.Categorical(logits=logits)
    ref_other = torch.distributions.Categorical(logits=other)
    assert_close(d.logp(actions), ref.log_prob(actions))
    assert_close(d.entropy(), ref.entropy())
    assert_close(d.kl(Categorical(other)), torch.distributions.kl_divergence(ref, ref_other))
    assert_close(d.kl(Categorical(logits)), torch.zeros(5), atol=1e-6, rtol=0)
    assert torch.equal(d.deterministic(), logits.argmax(-1))


def test_categorical_masked_actions():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    d = Categorical(masked_logits(logits, mask))
    ref = torch.distributions.Categorical(logits=logits[:, :2])
    assert_close(d.entropy(), ref.entropy())
    assert d.deterministic().item() == 1
    samples = Categorical(masked_logits(logits.expand(2000, 3), mask.expand(2000, 3))).sample(
        torch.Generator().manual_seed(0)
    )
    assert (samples != 2).all()
    # -inf logits: zero probability and a finite entropy
    d_inf = Categorical(torch.tensor([[0.0, 0.0, -math.inf]]))
    assert_close(d_inf.entropy(), torch.tensor([math.log(2)]))


def test_categorical_sampling_frequencies():
    probs = torch.tensor([0.1, 0.2, 0.7])
    n = 20_000
    d = Categorical(probs.log().expand(n, 3))
    samples = d.sample(torch.Generator().manual_seed(123))
    assert samples.shape == (n,)
    freq = torch.bincount(samples, minlength=3).double() / n
    # std of a frequency <= sqrt(0.25 / 20000) ~ 0.0035; allow ~4 std
    assert_close(freq, probs.double(), atol=0.015, rtol=0)
    # seeded: the same generator seed gives the same samples, a different one different samples
    assert torch.equal(samples, d.sample(torch.Generator().manual_seed(123)))
    assert not torch.equal(samples, d.sample(torch.Generator().manual_seed(124)))


def test_diag_gaussian_matches_torch():
    g = torch.Generator().manual_seed(0)
    mean, log_std = torch.randn(6, 3, generator=g), 0.3 * torch.randn(6, 3, generator=g)
    mean2, log_std2 = torch.randn(6, 3, generator=g), 0.3 * torch.randn(6, 3, generator=g)
    d = DiagGaussian(torch.cat([mean, log_std], -1))
    d2 = DiagGaussian(torch.cat([mean2, log_std2], -1))
    ref = torch.distributions.Normal(mean, log_std.exp())
    ref2 = torch.distributions.Normal(mean2, log_std2.exp())
    actions = torch.randn(6, 3, generator=g)
    assert_close(d.logp(actions), ref.log_prob(actions).sum(-1))
    assert_close(d.entropy(), ref.entropy().sum(-1))
    assert_close(d.kl(d2), torch.distributions.kl_divergence(ref, ref2).sum(-1))
    assert torch.equal(d.deterministic(), mean)


def test_diag_gaussian_sampling_moments():
    n = 20_000
    mean = torch.tensor([1.0, -2.0])
    log_std = torch.tensor([0.0, math.log(0.5)])
    d = DiagGaussian(torch.cat([mean, log_std]).expand(n, 4))
    x = d.sample(torch.Generator().manual_seed(0))
    assert x.shape == (n, 2)
    assert_close(x.mean(0), mean, atol=0.03, rtol=0)
    assert_close(x.std(0), torch.tensor([1.0, 0.5]), atol=0.03, rtol=0)


def test_kl_adaptive_lr_steps_by_hand():
    from shoal.learn.target import KLAdaptiveLR

    s = KLAdaptiveLR(0.01)
    assert s.next_lr(3e-4, 0.03) == pytest.approx(2e-4)  # above 2 x 0.01: / 1.5
    assert s.next_lr(3e-4, 0.001) == pytest.approx(4.5e-4)  # below 0.01 / 2: x 1.5
    assert s.next_lr(3e-4, 0.01) == 3e-4 and s.next_lr(3e-4, 0.02) == 3e-4 and s.next_lr(3e-4, 0.005) == 3e-4
    assert s.next_lr(9e-3, 0.0) == 1e-2 and s.next_lr(1.2e-6, 1.0) == 1e-6  # within [1e-6, 1e-2]


def test_ppo_lr_kl_target_moves_lr_once_per_epoch_and_is_checkpointed():
    from shoal import PPOConfig

    # a target so large that every epoch's KL is below half of it: x 1.5 per epoch, 3 epochs an iteration
    cfg = PPOConfig(
        env="CartPole-v1", seed=0, lr=3e-4, lr_kl_target=1.0, num_sgd_iter=3, train_batch_size=256, minibatch_size=64
    )
    algo, again = cfg.build(), cfg.build()
    try:
        algo.train()
        assert algo.learner.lr == pytest.approx(3e-4 * 1.5**3)
        assert algo.learner.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4 * 1.5**3)
        again.set_state(algo.get_state())
        assert again.learner.lr == pytest.approx(3e-4 * 1.5**3)
    finally:
        algo.stop()
        again.stop()
    with pytest.raises(Exception, match="lr_kl_target adapts the learning rate and lr_schedule sets it"):
        PPOConfig(env="CartPole-v1", lr_kl_target=0.01, lr_schedule=[[0, 1e-3], [1000, 0.0]])
