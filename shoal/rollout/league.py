"""The league's rollout actor: a MultiAgentEnvRunner that writes each learning policy's
sequences straight into that policy's learner-shard replay (see ``shoal.algorithms.alpha_star``),
and the :class:`SyncMessage` the driver broadcasts to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from shoal.batch import Batch
from shoal.rollout.multi_agent import MultiAgentEnvRunner


@dataclass
class SyncMessage:
    """One broadcast to the rollout actors (one object-store put): ``weights`` (policy id -> the
    weights that changed, or all of them), ``matchmaking`` (``Matchmaking.to_dict()`` data),
    ``train`` (the learning policy ids), ``replay`` (policy id -> its shard's replay actor or
    proxy; empty when the driver stores the batches) and ``remove`` (policies that left)."""

    weights: dict[str, dict]
    matchmaking: dict[str, Any]
    train: list[str]
    replay: dict[str, Any]
    remove: list[str] = field(default_factory=list)

    @classmethod
    def coerce(cls, msg: Union["SyncMessage", Mapping[str, Any]]) -> "SyncMessage":
        """A SyncMessage as it is, or one from the old dict form (``remove`` optional)."""
        if isinstance(msg, cls):
            return msg
        if not isinstance(msg, Mapping):
            raise ValueError(f"a league sync message is a SyncMessage or a dict, got {type(msg).__name__}")
        return cls(
            weights=msg["weights"],
            matchmaking=msg["matchmaking"],
            train=list(msg["train"]),
            replay=msg["replay"],
            remove=list(msg.get("remove", ())),
        )


def store_batches(batches: dict[str, Batch], replay: dict[str, Any]) -> None:
    """Each learning policy's batch into its shard replay (``replay``: policy id -> replay actor or proxy)."""
    for pid, batch in batches.items():
        if pid in replay:
            replay[pid].add_batch(pid, batch)


class LeagueRolloutActor(MultiAgentEnvRunner):
    """A MultiAgentEnvRunner that stores each learning policy's batch in that policy's shard replay."""

    def __init__(self, config, worker_index: int, policies: dict, matchmaking: Any, replay: dict) -> None:
        trainable = [pid for pid, s in policies.items() if s.get("trainable")]
        super().__init__(config, worker_index, policies, matchmaking=matchmaking, policies_to_train=trainable)
        self.replay = dict(replay)

    def sample_and_store(self):
        batches, metrics = self.sample()
        store_batches(batches, self.replay)
        return metrics

    def sample_and_return(self):
        """For learners in the driver (``resources.remote_learners: false``): the batches come back with the metrics."""
        return self.sample()

    def sync(self, msg: SyncMessage) -> None:
        """One message per broadcast: new weights, matchmaking, learning ids, replay handles, removals."""
        msg = SyncMessage.coerce(msg)
        self.set_weights(msg.weights, matchmaking=msg.matchmaking)
        self.set_policies_to_train([p for p in msg.train if p in self.policies])
        self.replay = dict(msg.replay)
        for pid in msg.remove:
            if pid in self.policies:
                self.remove_policy(pid)
