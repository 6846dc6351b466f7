"""Pure functions over time-major arrays: GAE, the flattening of fragments, and sequences.

Arrays are time-major, shape ``(T, N)`` for T steps of N envs. ``next_values[t]`` is the
value of the observation that followed step t, so a transition carries its own bootstrap:
at a truncated step it is the value of the episode's final observation; at a terminated
step it is ignored. Advantages never flow across an episode end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shoal.batch import Batch, Col, pack_per_sequence
from shoal.models.recurrent import pack_state

if TYPE_CHECKING:
    from shoal.rollout.env_runner import Fragment


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminateds: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    lambda_: float,
) -> np.ndarray:
    """Generalized advantage estimates, ``(T, ...)`` in and out.

    delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
    A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}

    ``dones = terminateds | truncateds``: a truncated step bootstraps from its own
    ``next_values`` (the final observation's value) but does not chain into the next
    episode's advantages.
    """
    rewards = np.asarray(rewards, dtype=np.float32)
    not_term = 1.0 - np.asarray(terminateds, dtype=np.float32)
    not_done = 1.0 - np.asarray(dones, dtype=np.float32)
    deltas = rewards + gamma * not_term * next_values - values
    adv = np.zeros_like(deltas, dtype=np.float32)
    last = np.zeros_like(deltas[0], dtype=np.float32)
    decay = gamma * lambda_
    for t in range(len(deltas) - 1, -1, -1):
        last = deltas[t] + decay * not_done[t] * last
        adv[t] = last
    return adv


def env_major(x: np.ndarray) -> np.ndarray:
    """Time-major ``(T, N, ...)`` -> rows, one env's T steps after another (every step kept)."""
    x = np.swapaxes(x, 0, 1)
    return x.reshape(-1, *x.shape[2:])


def flatten_valid(columns: dict[str, np.ndarray], valid: np.ndarray) -> dict[str, np.ndarray]:
    """(T, N, ...) columns -> rows of the valid steps, each env's steps contiguous and in order."""
    keep = valid.T.reshape(-1)
    out = {}
    for k, v in columns.items():
        v = np.swapaxes(v, 0, 1)
        out[k] = v.reshape(-1, *v.shape[2:])[keep]
    return out


def n_step_targets(
    rewards: np.ndarray, terminateds: np.ndarray, dones: np.ndarray, valid: np.ndarray, n: int, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns over time-major ``(T, N)`` arrays, never across an episode end.

    For each step t the return sums ``gamma**k * r[t+k]`` for k < n, stopping after the
    step that ends the episode (terminated or truncated) or at the fragment's end. Returns
    ``(returns, discounts, terminated, next_index)``: ``discounts = gamma**k`` for the k
    rewards summed, ``terminated`` whether the episode terminated within them (no
    bootstrap), and ``next_index`` the row of ``obs`` (T + 1 rows) to bootstrap from: the
    observation after the last summed step (for a truncated episode, its final
    observation). Rows where ``valid`` is False (reset steps) are zero and unused.
    """
    rewards = np.asarray(rewards, dtype=np.float32)
    T, N = rewards.shape
    ret = np.zeros((T, N), dtype=np.float32)
    disc = np.ones((T, N), dtype=np.float32)
    term = np.zeros((T, N), dtype=bool)
    t_idx = np.arange(T)[:, None].repeat(N, axis=1)
    next_idx = t_idx + 1
    alive = np.asarray(valid, dtype=bool).copy()
    for k in range(n):
        src = t_idx + k
        in_range = src < T
        src = np.minimum(src, T - 1)
        cols = np.arange(N)[None, :]
        add = alive & in_range
        ret += np.where(add, (gamma**k) * rewards[src, cols], 0.0).astype(np.float32)
        next_idx = np.where(add, src + 1, next_idx)
        disc = np.where(add, np.float32(gamma ** (k + 1)), disc)
        term |= add & terminateds[src, cols]
        alive = add & ~dones[src, cols]
    return ret, disc, term, next_idx


def q_td_errors(
    q_sa: np.ndarray, q_next: np.ndarray, returns: np.ndarray, discounts: np.ndarray, terminateds: np.ndarray
) -> np.ndarray:
    """``|returns + discounts * (1 - terminated) * max_a q_next - q_sa|``: initial replay priorities."""
    target = returns + discounts * (1.0 - terminateds.astype(np.float32)) * q_next.max(axis=-1)
    return np.abs(target - q_sa)


def sequence_postprocess(fragment: Fragment) -> Batch:
    """Worker-side (IMPALA, APPO): keep every step (reset rows masked by VALID), one env's T steps after another;
    the observation after each env's last step (the V-trace bootstrap) and a recurrent policy's
    state at each fragment's start ride along, packed over the sequence's rows (``BOOTSTRAP_OBS``,
    ``STATE_IN``)."""
    seq = env_major  # (T, N, ...) -> rows, one env's T steps after another
    state = {}
    if fragment.state_in is not None:
        state[Col.STATE_IN] = pack_state(fragment.state_in[0], len(fragment.rewards))
    if fragment.masks is not None:  # the legal actions each step was sampled under
        state[Col.ACTION_MASK] = seq(fragment.masks[:-1])
    return Batch(
        {
            **state,
            Col.OBS: seq(fragment.obs[:-1]),
            Col.BOOTSTRAP_OBS: pack_per_sequence(fragment.obs[-1], len(fragment.rewards)),  # each env's last next obs
            Col.ACTIONS: seq(fragment.actions),
            Col.ACTION_LOGP: seq(fragment.extras[Col.ACTION_LOGP]),
            Col.REWARDS: seq(fragment.rewards),
            Col.TERMINATEDS: seq(fragment.terminateds),
            Col.VALID: seq(fragment.valid),
        }
    )
