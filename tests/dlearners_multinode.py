"""Distributed learners on a simulated three-node Ray cluster: do policy learners sit beside their replay actor?

Also the small regression module and loss the distributed-learner tests train, and the minimal
policy learner that trains them (Ray workers import them from here). Run by ``tests/test_distributed_learners.py`` in a fresh Python
process (a ``ray.cluster_utils.Cluster`` needs its own Ray instance); prints one JSON line:
each shard's replay node, each policy's shard and node, and one learning step per policy.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from shoal.batch import Batch, Col
from shoal.errors import ActorLostError
from shoal.learn import Learner
from shoal.learn.distributed_learners import REPLAY_LOST, resolve_learner_device

TRUE_W = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)


def make_module() -> torch.nn.Module:
    return torch.nn.Linear(4, 1)


def mse_loss(module: torch.nn.Module, batch: dict, learner) -> tuple[torch.Tensor, dict]:
    err = module(batch[Col.OBS]).squeeze(-1) - batch[Col.REWARDS]
    loss = (err**2).mean()
    return loss, {"loss": loss.detach()}


def regression_batch(n: int = 32, seed: int = 0) -> Batch:
    """Rows of a noiseless linear regression: rewards = obs @ TRUE_W."""
    obs = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    return Batch({Col.OBS: obs, Col.REWARDS: obs @ TRUE_W})


class PolicyLearner:
    """One policy's learner: ``make_module()`` and ``loss_fn`` in a :class:`~shoal.learn.Learner`.

    ``learn_on_batch(batch)`` takes one gradient step on the whole batch; ``learn()`` first
    asks the shard's replay actor for this policy's next batch (None when there is none).
    """

    def __init__(
        self,
        policy_id,
        replay,
        make_module,
        loss_fn,
        lr: float = 1e-3,
        grad_clip: float | None = None,
        torch_threads: int = 1,
        seed: int | None = None,
        device: str = "cpu",
    ) -> None:
        torch.set_num_threads(torch_threads)
        if seed is not None:
            torch.manual_seed(seed)
        self.policy_id, self.replay = policy_id, replay
        self.learner = Learner(
            make_module(), loss_fn, lr=lr, grad_clip=grad_clip, device=resolve_learner_device(device)
        )

    def learn_on_batch(self, batch: Batch) -> dict[str, float]:
        stats = self.learner.update_minibatch(batch.to_torch(self.learner.device))
        return {k: float(v) for k, v in stats.items()} | {"num_updates": self.learner.num_updates, "rows": len(batch)}

    def learn(self):
        try:
            batch = self.replay.replay(self.policy_id)
        except ActorLostError:
            return REPLAY_LOST
        return None if batch is None else self.learn_on_batch(batch)

    def set_replay(self, replay) -> None:
        self.replay = replay

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.learner.get_weights()

    def set_weights(self, weights: dict) -> None:
        self.learner.set_weights(weights)

    def num_updates(self) -> int:
        return self.learner.num_updates


class DeviceProbe:
    """A policy learner that only reports the device it was given and what that resolves to in its process."""

    def __init__(self, policy_id, replay, device: str = "cpu") -> None:
        self.device = device

    def where(self) -> dict:
        import os

        import ray

        from shoal import runtime

        return {
            "spec": self.device,
            "resolved": runtime.assigned_cuda_device(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def get_weights(self) -> dict:
        return {}

    def set_weights(self, weights) -> None:
        pass


def main() -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from shoal.learn.distributed_learners import DistributedLearners, shard_plan
    from shoal.replay import BatchReplay

    torch.set_num_threads(1)
    t0 = time.time()
    # Each node declares 2 (fake) GPUs: Ray assigns them to actors and sets CUDA_VISIBLE_DEVICES, which is
    # all the device check below needs; nothing runs on them.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=2)
    ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    out: dict = {"cluster_start_s": round(time.time() - t0, 1)}
    try:
        cluster.wait_for_nodes()
        out["num_nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        plan = shard_plan(0, 6, num_shards=3)  # 3 shards x 2 slots; 0.2 + 2 x 0.3 CPUs per shard fits a 1-CPU node
        dl = DistributedLearners(
            PolicyLearner,
            BatchReplay,
            plan,
            remote=True,
            replay_kwargs={"capacity": 4},
            replay_num_cpus=0.2,
            policy_num_cpus=0.3,
            resource_wait_s=60.0,
            address=cluster.address,
        )
        try:
            for k in range(6):
                dl.add_policy(f"p{k}", (make_module, mse_loss), {"lr": 0.05, "seed": k})
            nodes = dl.node_ids()
            out["replay_nodes"] = {str(s): n for s, n in nodes["replay"].items()}
            out["policies"] = {pid: {"shard": dl.where[pid][0], "node": n} for pid, n in nodes["policies"].items()}
            for pid in dl.policy_ids:
                dl.get_replay_actor(pid).add_batch(pid, regression_batch(seed=1))
            out["learned"] = {pid: dl.call(pid, "learn") is not None for pid in dl.policy_ids}
        finally:
            dl.stop()
        # Remote learners with GPUs train on the GPU Ray assigned to their actor: one shard, 2 GPUs, 1 per policy.
        dl = DistributedLearners(
            DeviceProbe,
            BatchReplay,
            shard_plan(2, 2, num_shards=1),
            remote=True,
            policy_num_cpus=0.1,
            resource_wait_s=60.0,
            address=cluster.address,
        )
        try:
            for pid in ("g0", "g1"):
                dl.add_policy(pid)
            out["gpu_learners"] = {pid: dl.call(pid, "where") for pid in dl.policy_ids}
        finally:
            dl.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    out["total_s"] = round(time.time() - t0, 1)
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
    sys.exit(0)
