"""Loss records: each algorithm's loss as a frozen record of the config values it reads.

A record is a Learner's ``loss_fn``: ``loss(module, batch, learner=None) -> (loss, stats)``.
It reads its own fields and nothing else, so a config carries only the keys its losses use,
and a change (``Algorithm.update_config``, Tune's PBT) builds a new record with
:meth:`LossRecord.with_config` that replaces the old one between two minibatches, one
attribute store, never a half-changed loss.

A subclass lists the fields it takes from a config in ``config_values(cfg)``; the others
(the KL coefficient object, the target network) are objects of the
learner it belongs to, carried over by ``with_config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LossRecord:
    """The base of PPOLoss, IMPALALoss, APPOLoss and DQNLoss."""

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        """The fields this loss takes from ``cfg``, by field name."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, cfg, **objects: Any):
        """The loss for ``cfg``, with the learner's ``objects`` (e.g. ``kl=``, ``target=``)."""
        return cls(**cls.config_values(cfg), **objects)

    def with_config(self, cfg):
        """The same loss with ``cfg``'s values (its objects kept): what ``update_config`` swaps in."""
        return dataclasses.replace(self, **self.config_values(cfg))

    def group_sum_sizes(self) -> tuple[int, ...]:
        """The lengths of the vectors one call sums over a learner group with ``learner.sum_over_group``,
        in order (IMPALA's and APPO's standardized advantages: one of 3, the count, sum and sum of
        squares). A group member with no batch in a round sums zeros of these lengths instead of
        calling the loss, so every member makes the same collectives."""
        return ()

    def __call__(self, module, batch: dict, learner=None):
        raise NotImplementedError
