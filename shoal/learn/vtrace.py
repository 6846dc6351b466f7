"""V-trace (Espeholt et al., 2018): off-policy value targets and policy-gradient advantages.

Everything is time-major, shape ``(T, B)``: T steps of B sequences. For step t of a sequence

    rho_t   = min(rho_bar, pi(a_t | x_t) / mu(a_t | x_t))       (clip_rho_threshold)
    c_t     = lambda * min(1, pi(a_t | x_t) / mu(a_t | x_t))    (lambda: vtrace_lambda, 1 in the paper's main form)
    delta_t = m_t * rho_t * (r_t + d_t * V(x_{t+1}) - V(x_t))
    vs_t    = V(x_t) + delta_t + d_t * c_t * (vs_{t+1} - V(x_{t+1}))
    A_t     = m_t * min(rho_pg_bar, pi/mu) * (r_t + d_t * vs_{t+1} - V(x_t))   (clip_pg_rho_threshold)

with ``V(x_T) = vs_T = bootstrap_value``. ``d_t`` is the discount of step t: gamma, or 0
where the episode terminated (no value beyond a terminal state). ``m_t`` is the mask of
real transitions (``valid``; 1 when not given); a masked step also gets ``d_t = 0``.

How a fragment from :class:`~shoal.rollout.EnvRunner` maps onto this: with next-step
autoreset the row after an episode's last step is a reset step (``valid`` False) whose
observation is the episode's final observation. Giving reset rows ``m = 0`` and ``d = 0``
makes their ``vs`` equal to their own value, ``V(final observation)``; so a truncated step
(``d = gamma``) bootstraps from the final observation's value, a terminated one (``d = 0``)
from nothing, and nothing flows back from the next episode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class VTraceReturns:
    vs: torch.Tensor  # (T, B) value targets
    pg_advantages: torch.Tensor  # (T, B) advantages for the policy gradient (0 on masked steps)
    rhos: torch.Tensor  # (T, B) unclipped importance ratios pi / mu


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    valid: torch.Tensor | None = None,
    *,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """V-trace targets and advantages; no gradient flows through them.

    Args:
        log_rhos: (T, B) ``log pi(a_t|x_t) - log mu(a_t|x_t)``, target minus behaviour log-probs.
        discounts: (T, B) per-step discount ``d_t`` (0 at termination); masked steps get 0 here.
        rewards, values: (T, B).
        bootstrap_value: (B,) value of the observation after the last step.
        valid: (T, B) bool or 0/1 mask of real transitions; None means all valid.
        clip_rho_threshold / clip_pg_rho_threshold: rho-bar and pg-rho-bar; None disables a clip.
        lambda_: scales the traces ``c_t`` (the paper's lambda variant); below 1 the targets lean
            on the value function sooner, trading bias for less variance, like GAE's lambda.
    """
    with torch.no_grad():
        log_rhos, discounts, rewards, values = (x.float() for x in (log_rhos, discounts, rewards, values))
        rhos = torch.exp(log_rhos)
        clipped = rhos.clamp(max=clip_rho_threshold) if clip_rho_threshold is not None else rhos
        cs = lambda_ * rhos.clamp(max=1.0)
        mask = torch.ones_like(rewards) if valid is None else valid.to(rewards.dtype)
        discounts = discounts * mask  # a masked step neither bootstraps nor passes anything back
        next_values = torch.cat([values[1:], bootstrap_value.float().unsqueeze(0)], dim=0)
        deltas = mask * clipped * (rewards + discounts * next_values - values)
        vs = discounted_sums(deltas, discounts * cs) + values
        next_vs = torch.cat([vs[1:], bootstrap_value.float().unsqueeze(0)], dim=0)
        pg_rhos = rhos.clamp(max=clip_pg_rho_threshold) if clip_pg_rho_threshold is not None else rhos
        pg_advantages = mask * pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, rhos=rhos)


_MATRIX_MAX = 1 << 24  # elements of the (T, T, B) product matrix; longer sequences take the loop


def discounted_sums(x: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``y_t = x_t + decay_t * y_{t+1}`` with ``y_T = 0``, for every column of the (T, ...) inputs.

    Written out, ``y_t = sum_{k >= t} (prod_{i=t}^{k-1} decay_i) x_k``. The products for all
    (t, k) come from one cumulative product over a (T, T, ...) matrix whose row t holds
    ``decay_i`` from column t on and 1 before it, so the recursion costs a handful of tensor
    operations instead of T small steps: on a GPU each step is a kernel launch from Python, and a
    profile of APPO's learner on an H100 spent a quarter of its time in the step loop
    (T = 32). The decays are at most 1 (discount times a clipped trace), so the products only
    shrink and need no division. Sequences whose matrix would exceed ``_MATRIX_MAX`` elements
    take the step loop.
    """
    T = x.shape[0]
    if T * x.numel() > _MATRIX_MAX:
        acc = torch.zeros_like(x[0])
        out = torch.empty_like(x)
        for t in range(T - 1, -1, -1):
            acc = x[t] + decay[t] * acc
            out[t] = acc
        return out
    flat_x, flat_d = x.reshape(T, -1), decay.reshape(T, -1)
    upper = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_().unsqueeze(-1)  # [t, i]: i >= t
    prods = torch.where(upper, flat_d.unsqueeze(0), torch.ones((), dtype=x.dtype, device=x.device)).cumprod(dim=1)
    # weights[t, k] = prod_{i=t}^{k-1} decay_i for k >= t (1 at k = t), 0 for k < t
    weights = torch.cat([torch.ones_like(prods[:, :1]), prods[:, :-1]], dim=1) * upper
    return torch.einsum("tkb,kb->tb", weights, flat_x).reshape(x.shape)


def vtrace_reference(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    valid=None,
    *,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The same quantities from the paper's sum form, one step at a time in plain Python (for tests).

    vs_t = V(x_t) + sum_{k >= t} (prod_{i=t}^{k-1} d_i c_i) * delta_k
    Returns ``(vs, pg_advantages)`` as float64 arrays of shape (T, B).
    """
    log_rhos, discounts, rewards, values = (
        np.asarray(x, dtype=np.float64) for x in (log_rhos, discounts, rewards, values)
    )
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    T, B = values.shape
    mask = np.ones((T, B)) if valid is None else np.asarray(valid, dtype=np.float64)
    discounts = discounts * mask
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))

    def value(t: int, b: int) -> float:
        return float(values[t, b]) if t < T else float(bootstrap_value[b])

    for b in range(B):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                rho = float(np.exp(log_rhos[k, b]))
                rho_clipped = min(clip_rho_threshold, rho) if clip_rho_threshold is not None else rho
                delta = mask[k, b] * rho_clipped * (rewards[k, b] + discounts[k, b] * value(k + 1, b) - values[k, b])
                total += weight * delta
                weight *= discounts[k, b] * lambda_ * min(1.0, rho)
            vs[t, b] = values[t, b] + total
    for b in range(B):
        for t in range(T):
            rho = float(np.exp(log_rhos[t, b]))
            pg_rho = min(clip_pg_rho_threshold, rho) if clip_pg_rho_threshold is not None else rho
            next_vs = vs[t + 1, b] if t + 1 < T else bootstrap_value[b]
            adv[t, b] = mask[t, b] * pg_rho * (rewards[t, b] + discounts[t, b] * next_vs - values[t, b])
    return vs, adv


__all__ = ["VTraceReturns", "vtrace", "vtrace_reference"]
