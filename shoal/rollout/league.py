"""The league's rollout actor: a MultiAgentEnvRunner that writes each learning policy's
sequences straight into that policy's learner-shard replay (see ``shoal.algorithms.alpha_star``).
"""

from __future__ import annotations

from typing import Any

from shoal.batch import Batch
from shoal.rollout.multi_agent import MultiAgentEnvRunner


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

    def sync(self, msg: dict[str, Any]) -> None:
        """One message per broadcast: new weights, matchmaking, learning ids, replay handles, removals."""
        self.set_weights(msg["weights"], matchmaking=msg["matchmaking"])
        self.set_policies_to_train([p for p in msg["train"] if p in self.policies])
        self.replay = dict(msg["replay"])
        for pid in msg.get("remove", ()):
            if pid in self.policies:
                self.remove_policy(pid)
