"""A policy's behaviour average: a copy of its network trained by supervision on its own actions.

On a two-player zero-sum game a policy trained by self-play tends to cycle around an
equilibrium rather than settle on it; the average of its recent behaviour sits nearer the
centre. :class:`BehaviourAverage` keeps the policy's latest ``window`` rows (observation, action
mask, action) and, after every learner update, takes ``sgd_steps`` Adam steps of the negative
log-likelihood of those actions on a network of the policy's own architecture: NFSP's average
network, over a sliding window of the policy's play rather than over all of it (a window
forgets the early, far-off policies). Sampling rows in proportion to how often they were played
weights each information state by how often it was reached, which is what an average strategy
needs.

The window is play data, like a replay buffer: checkpoints keep the network and its optimizer,
not the rows; a restored run refills the window from new play.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

import numpy as np
import torch

from shoal import process
from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.learn.target import Replicas, replica_beside
from shoal.models.distributions import masked_logits
from shoal.replay import storage
from shoal.replay.buffers import ReplayBuffer


class BehaviourAverage:
    """``module``'s architecture (a copy of it, from its current weights) trained on the rows
    :meth:`add` is given; ``window`` rows are kept, newest replacing oldest."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        window: int,
        sgd_steps: int,
        batch_size: int,
        lr: float,
        seed: Optional[int] = None,
    ) -> None:
        if getattr(module, "recurrent", False):
            raise ConfigError(
                "average_policy: behaviour trains a feed-forward copy of the policy on single steps; this "
                "policy's model is recurrent: use average_policy: parameters"
            )
        self.online = module  # the policy's module, beside which ``net`` itself is the magnet
        self.net = copy.deepcopy(module)
        self.dist_cls: Any = module.dist_cls  # the policy's action distribution
        self.net.requires_grad_(True)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.window, self.sgd_steps, self.batch_size = window, sgd_steps, batch_size
        self.seed = seed
        self.window_rows = ReplayBuffer(window, seed=seed)  # FIFO: newest replacing oldest
        self.rows_seen = 0  # rows kept since the start (or the restore)
        self._version = 0  # bumped by every change of ``net``'s weights: the replicas' refresh
        self._replicas: Replicas = {}

    def for_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The network as a magnet beside ``module`` (``magnet_coeff``): ``net`` itself beside the
        policy's own module, else a copy on ``module``'s device (a multi-device learner's replica),
        refreshed when ``net`` has changed since. Read under ``torch.no_grad``: the magnet is a
        constant of the policy's loss, trained only by :meth:`train`."""
        if module is self.online:
            return self.net
        return replica_beside(self.net, module, self._replicas, self._version)

    @property
    def size(self) -> int:
        """Rows held (at most ``window``)."""
        return len(self.window_rows)

    def add(self, batch: Batch) -> int:
        """Keep ``batch``'s valid rows (padding and next-step reset rows are not play); the number kept."""
        cols = [Col.OBS, Col.ACTIONS] + ([Col.ACTION_MASK] if Col.ACTION_MASK in batch else [])
        rows = Batch({c: np.asarray(batch[c], dtype=bool if c == Col.ACTION_MASK else None) for c in cols})
        if Col.VALID in batch:
            rows = rows.take(np.flatnonzero(np.asarray(batch[Col.VALID], dtype=bool)))
        if len(self.window_rows) == 0 and len(rows):
            self._check_fits(rows)
        kept = len(self.window_rows.add(rows))  # more than a window: only its newest window's worth
        self.rows_seen += kept
        return kept

    def _check_fits(self, rows: Batch) -> None:
        """A ConfigError naming ``average_window`` when a full window would not fit in memory now."""
        per_row = sum(storage.row_nbytes(v.shape[1:], v.dtype) for v in rows.data.values())
        avail = process.available_memory_bytes()
        if avail is not None and self.window * per_row > avail:
            raise ConfigError(
                f"average_window ({self.window:,} rows) is too large for this machine's memory: the behaviour "
                f"average keeps that many rows of each learning policy's play, {per_row:,} bytes each, "
                f"{self.window * per_row / process.GB:.1f} GB, and {avail / process.GB:.1f} GB is available. "
                "Lower average_window, or use average_policy: parameters (no rows kept)."
            )

    def train(self) -> Optional[float]:
        """``sgd_steps`` steps on minibatches drawn from the window; the last step's loss (None when empty)."""
        if self.size == 0:
            return None
        device = next(self.net.parameters()).device
        loss = torch.zeros(())
        for _ in range(self.sgd_steps):
            rows = self.window_rows.sample(self.batch_size)
            obs = torch.as_tensor(rows[Col.OBS], device=device)
            actions = torch.as_tensor(rows[Col.ACTIONS], device=device)
            inputs, _ = self.net(obs)
            if Col.ACTION_MASK in rows:
                inputs = masked_logits(inputs, torch.as_tensor(rows[Col.ACTION_MASK], device=device))
            loss = -self.dist_cls(inputs).logp(actions).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self._version += 1
        return float(loss.detach())  # one host sync, for the last step

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}

    def get_state(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self._version += 1
        self.optimizer.load_state_dict(state["optimizer"])
        self.rows_seen = 0  # the rows themselves are not saved: the window refills from new play
        self.window_rows = ReplayBuffer(self.window, seed=self.seed)


__all__ = ["BehaviourAverage"]
