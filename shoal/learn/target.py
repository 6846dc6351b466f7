"""Target networks and the adaptive KL coefficient: the post-update phases of a learner.

:class:`TargetNetwork` is the one target-network mechanism (DQN, Ape-X, APPO, the league's
APPO learners). It is a frozen copy of an online network, refreshed every ``period`` units
(learner updates, or trained env steps) by copying (``tau=1``) or blending (``tau<1``:
``target <- tau * online + (1 - tau) * target``). Its ``post_update(rows)`` is registered
on the :class:`~shoal.learn.Learner` (``add_post_update_hook``), which calls it right after
each optimizer step, in whatever thread learns, so a refresh never races an update.

:class:`AdaptiveKL` is PPO's KL coefficient: ``update(kl)`` once per learner result (a train
batch's passes) moves it towards ``kl_target``; losses read ``coeff``.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Literal

import torch

Unit = Literal["updates", "env_steps"]
Replicas = dict[int, tuple[torch.nn.Module, int]]  # id(module) -> (its copy of a network, the version it holds)


def replica_beside(net: torch.nn.Module, module: torch.nn.Module, replicas: Replicas, version: int) -> torch.nn.Module:
    """``module``'s copy of ``net`` (made on ``module``'s device the first time, kept in
    ``replicas``), reloaded from ``net`` when it holds an older ``version`` than the one given:
    a frozen network read beside each replica of a multi-device learner."""
    replica, held = replicas.get(id(module), (None, -1))
    if replica is None:
        replica = copy.deepcopy(net).to(next(module.parameters()).device)
    if held != version:
        replica.load_state_dict(net.state_dict())
    replicas[id(module)] = (replica, version)
    return replica


class TargetNetwork:
    """A frozen copy of ``online``, refreshed every ``period`` updates or trained env steps."""

    def __init__(
        self,
        online: torch.nn.Module,
        period: int,
        *,
        unit: Unit = "updates",
        tau: float = 1.0,
        net: torch.nn.Module | None = None,
    ) -> None:
        """``net``: an existing copy to keep refreshed (e.g. a submodule of the learner's
        module, so it is saved with it); by default a new deep copy."""
        if unit not in ("updates", "env_steps"):
            raise ValueError(f"unit must be 'updates' or 'env_steps', got {unit!r}")
        self.online, self.period, self.unit, self.tau = online, int(period), unit, float(tau)
        self.net = (net if net is not None else copy.deepcopy(online)).requires_grad_(False)
        self.since_update = 0  # units counted since the last refresh
        self.num_updates = 0  # refreshes so far
        self._version = 0  # bumped whenever ``net`` changes: device replicas re-copy it
        self._replicas: Replicas = {}
        self._lock = threading.Lock()

    # ---- the post-update hook -------------------------------------------------------------
    def post_update(self, rows: int) -> bool:
        """Count one optimizer step on ``rows`` rows; refresh when ``period`` is reached. True if it did."""
        with self._lock:
            self.since_update += 1 if self.unit == "updates" else int(rows)
            if self.since_update < self.period:
                return False
            self._refresh()
            self.since_update = 0
            self.num_updates += 1
            return True

    def sync(self) -> None:
        """Copy the online network now (its weights were replaced from outside) and restart the count."""
        with self._lock, torch.no_grad():
            self.net.load_state_dict(self.online.state_dict())
            self.since_update = 0
            self._version += 1

    @torch.no_grad()
    def _refresh(self) -> None:
        if self.tau >= 1.0:
            self.net.load_state_dict(self.online.state_dict())
        else:
            for t, s in zip(self.net.parameters(), self.online.parameters()):
                t.lerp_(s, self.tau)
        self._version += 1

    # ---- use ----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.net(*args, **kwargs)

    def for_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The copy that sits beside ``module``: ``net`` for the online network itself, a
        per-replica copy (same weights, on the replica's device) for a multi-device tower."""
        with self._lock:
            if module is self.online:
                return self.net
            return replica_beside(self.net, module, self._replicas, self._version)

    # ---- state ----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "module": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                "since_update": self.since_update,
                "num_updates": self.num_updates,
            }

    def set_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.net.load_state_dict(state["module"])
            self.since_update = int(state["since_update"])
            self.num_updates = int(state["num_updates"])
            self._version += 1


def update_kl_coeff(kl_coeff: float, kl: float, kl_target: float) -> float:
    """PPO's adaptive KL rule: x1.5 when ``kl > 2 * target``, x0.5 when ``kl < target / 2``."""
    if kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff


class AdaptiveKL:
    """The KL penalty coefficient: ``coeff`` (0 when the penalty is off), adapted by ``update(kl)``
    and kept within [``MIN_COEFF``, ``MAX_COEFF``]: the cap keeps a run of large KLs from taking
    it where the penalty swamps the loss, the floor keeps a long run of small KLs from taking it
    so near 0 that it could not come back when the KL grows (from 1e-6, 34 measurements above
    twice the target bring it back to 1)."""

    MIN_COEFF = 1e-6
    MAX_COEFF = 1e4

    def __init__(self, coeff: float, target: float, enabled: bool = True) -> None:
        self.coeff = float(coeff) if enabled else 0.0
        self.target = float(target)
        self.enabled = enabled

    def update(self, kl: float) -> float:
        """Move ``coeff`` towards ``target`` after one measured KL (no-op when disabled)."""
        if self.enabled:  # one float assignment: thread-safe
            coeff = update_kl_coeff(self.coeff, float(kl), self.target)
            self.coeff = min(self.MAX_COEFF, max(self.MIN_COEFF, coeff))
        return self.coeff

    def get_state(self) -> dict[str, float]:
        return {"coeff": self.coeff}

    def set_state(self, state: dict[str, float]) -> None:
        self.coeff = float(state["coeff"])


class KLAdaptiveLR:
    """A learning rate steered by the policy's step size (rl_games' "adaptive" schedule): after
    each epoch over a train batch, an epoch mean KL(old || new) above twice ``target`` divides
    the rate by ``FACTOR``, one below half of ``target`` multiplies it by ``FACTOR``; it stays
    within [``MIN_LR``, ``MAX_LR``]. Small steps early in training so grow the rate quickly."""

    FACTOR = 1.5
    MIN_LR = 1e-6
    MAX_LR = 1e-2

    def __init__(self, target: float) -> None:
        self.target = float(target)

    def next_lr(self, lr: float, kl: float) -> float:
        if kl > 2.0 * self.target:
            return max(lr / self.FACTOR, self.MIN_LR)
        if kl < 0.5 * self.target:
            return min(lr * self.FACTOR, self.MAX_LR)
        return lr
