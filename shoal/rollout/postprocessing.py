"""Pure functions over time-major arrays: GAE and the flattening of fragments.

Arrays are time-major, shape ``(T, N)`` for T steps of N envs. ``next_values[t]`` is the
value of the observation that followed step t, so a transition carries its own bootstrap:
at a truncated step it is the value of the episode's final observation; at a terminated
step it is ignored. Advantages never flow across an episode end.
"""

from __future__ import annotations

import numpy as np


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


def flatten_valid(columns: dict[str, np.ndarray], valid: np.ndarray) -> dict[str, np.ndarray]:
    """(T, N, ...) columns -> rows of the valid steps, each env's steps contiguous and in order."""
    keep = valid.T.reshape(-1)
    out = {}
    for k, v in columns.items():
        v = np.swapaxes(v, 0, 1)
        out[k] = v.reshape(-1, *v.shape[2:])[keep]
    return out
