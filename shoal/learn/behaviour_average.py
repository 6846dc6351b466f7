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

from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.models.distributions import masked_logits


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
        self.net = copy.deepcopy(module)
        self.dist_cls: Any = module.dist_cls  # the policy's action distribution
        self.net.requires_grad_(True)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.window, self.sgd_steps, self.batch_size = window, sgd_steps, batch_size
        self.rng = np.random.default_rng(seed)
        self.rows_seen = 0  # rows kept since the start (or the restore); the next goes to slot rows_seen % window
        self._obs: Optional[np.ndarray] = None
        self._actions: Optional[np.ndarray] = None
        self._masks: Optional[np.ndarray] = None

    @property
    def size(self) -> int:
        """Rows held (at most ``window``)."""
        return min(self.rows_seen, self.window)

    def add(self, batch: Batch) -> int:
        """Keep ``batch``'s valid rows (padding and next-step reset rows are not play); the number kept."""
        obs = np.asarray(batch[Col.OBS])
        actions = np.asarray(batch[Col.ACTIONS])
        masks = np.asarray(batch[Col.ACTION_MASK], dtype=bool) if Col.ACTION_MASK in batch else None
        if Col.VALID in batch:
            valid = np.asarray(batch[Col.VALID], dtype=bool)
            obs, actions = obs[valid], actions[valid]
            masks = None if masks is None else masks[valid]
        n = len(actions)
        if n == 0:
            return 0
        if self._obs is None:
            self._obs = np.zeros((self.window, *obs.shape[1:]), obs.dtype)
            self._actions = np.zeros((self.window, *actions.shape[1:]), actions.dtype)
            self._masks = None if masks is None else np.zeros((self.window, *masks.shape[1:]), bool)
        assert self._actions is not None
        if n > self.window:  # only the newest window's worth can stay
            obs, actions, n = obs[-self.window :], actions[-self.window :], self.window
            masks = None if masks is None else masks[-self.window :]
        slots = (self.rows_seen + np.arange(n)) % self.window
        self._obs[slots], self._actions[slots] = obs, actions
        if self._masks is not None and masks is not None:
            self._masks[slots] = masks
        self.rows_seen += n
        return n

    def train(self) -> Optional[float]:
        """``sgd_steps`` steps on minibatches drawn from the window; the last step's loss (None when empty)."""
        if self.size == 0:
            return None
        assert self._obs is not None and self._actions is not None
        device = next(self.net.parameters()).device
        loss_value = None
        for _ in range(self.sgd_steps):
            idx = self.rng.integers(0, self.size, self.batch_size)
            obs = torch.as_tensor(self._obs[idx], device=device)
            actions = torch.as_tensor(self._actions[idx], device=device)
            inputs, _ = self.net(obs)
            if self._masks is not None:
                inputs = masked_logits(inputs, torch.as_tensor(self._masks[idx], device=device))
            loss = -self.dist_cls(inputs).logp(actions).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            loss_value = float(loss.detach())
        return loss_value

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}

    def get_state(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rows_seen = 0  # the rows themselves are not saved: the window refills from new play
        self._obs = self._actions = self._masks = None


__all__ = ["BehaviourAverage"]
