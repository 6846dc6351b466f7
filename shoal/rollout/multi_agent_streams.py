"""A multi-agent stream's rows (one stream per env copy, agent and policy): a decision waiting
for its outcome, a finished row, the reset row that ends an episode without termination, and
full sequences packed into a policy's Batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from shoal.batch import Batch, Col, pack_per_sequence
from shoal.models.recurrent import pack_state

_COLUMNS = (
    Col.OBS,
    Col.NEXT_OBS,
    Col.ACTIONS,
    Col.ACTION_LOGP,
    Col.REWARDS,
    Col.TERMINATEDS,
    Col.VALID,
    Col.ACTION_MASK,
)


@dataclass(slots=True)
class _OpenStep:
    """An agent's decision waiting for its next observation: what it saw and did, and the
    reward it has received since."""

    obs: np.ndarray
    mask: np.ndarray | None  # the action mask it acted under (None: every action legal)
    action: Any
    logp: float
    reward: float = 0.0
    state: np.ndarray | None = None  # a recurrent policy's state before this decision


class _Row(NamedTuple):
    """One decision in a stream: a row of the policy's batch, fields in the order of ``_COLUMNS``."""

    obs: np.ndarray
    next_obs: np.ndarray
    action: Any
    logp: float
    reward: float
    terminated: bool
    valid: bool
    mask: np.ndarray
    state: np.ndarray | None = None  # recurrent policies: the state before this row (not a column of its own)


def _reset_row(last: _Row, state: np.ndarray | None = None) -> _Row:
    """The masked row that ends a stream's episode without termination (like a single-agent reset
    row): it holds ``last``'s next observation, which V-trace bootstraps from (a recurrent policy
    from ``state``, its state after ``last``'s decision)."""
    return _Row(
        last.next_obs, last.next_obs, np.zeros_like(last.action), 0.0, 0.0, False, False, np.ones_like(last.mask), state
    )


def sequences_to_batch(seqs: list[list[_Row]]) -> Batch:
    """Full sequences of one policy as its Batch: the columns, a recurrent policy's start states and
    each sequence's bootstrap observation."""
    rows = [row for seq in seqs for row in seq]
    cols = list(zip(*rows))
    dtypes = (np.float32, np.float32, None, np.float32, np.float32, bool, bool, bool)
    batch = Batch(
        {
            name: np.asarray(np.stack(col) if np.ndim(col[0]) else col, dtype=dt)
            for name, col, dt in zip(_COLUMNS, cols, dtypes)
        }
    )
    T = len(seqs[0])
    if seqs[0][0].state is not None:  # a recurrent policy: each sequence's start state (shoal.models.recurrent)
        batch[Col.STATE_IN] = pack_state(np.stack([seq[0].state for seq in seqs]), T)
    # V-trace's bootstrap, as single-agent sequences carry it (PPO's GAE reads NEXT_OBS on every row)
    batch[Col.BOOTSTRAP_OBS] = pack_per_sequence(batch[Col.NEXT_OBS][T - 1 :: T], T)
    return batch
