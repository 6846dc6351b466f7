"""Distributed learners: learner shards, each one replay actor plus policy learner actors on its node.

With G GPUs and at most P trainable policies, :func:`shard_plan` decides how many shards
there are and how the GPUs are shared out (unless told the shard count: one shard per whole
GPU but at most P, or one per policy without GPUs; its docstring gives the exact rules).
:class:`DistributedLearners` creates one replay actor per shard (of the class it is given,
e.g. :class:`shoal.replay.BatchReplay`) and, as policies are added, one policy learner actor
in the first free slot of a shard, pinned to that shard's replay actor's node so batches move
between them through the node's shared object store.

A policy learner class is constructed as ``cls(policy_id, replay, *ctor_args, device=...,
**ctor_kwargs)`` where ``replay`` is its shard's replay actor; calls on it return their result
(in-process the object itself, remotely a waiting proxy), and ``device`` is where it must train:
its shard slot's GPU (``cuda:k``; for a Ray actor the GPU Ray assigned it) or "cpu" (resolve it
with :func:`resolve_learner_device`). It must have ``get_weights()``,
``set_weights(weights)`` and ``set_replay(replay)``; a policy learner actor that dies is
recreated from the latest weights the driver has seen from it (``get_weights``/``set_weights``
here keep them). A replay actor that dies is recreated empty and its learners get the new
handle through ``set_replay``; a learner whose replay call fails meanwhile returns
:data:`REPLAY_LOST` from the request, which :meth:`DistributedLearners.fetch_ready` turns into
that check instead of a learner crash. Algorithms bring their own policy learner class
(AlphaStar's is :class:`shoal.algorithms.alpha_star.APPOPolicyLearner`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from shoal import runtime
from shoal.errors import ConfigError

PolicyId = str


# ---- the arithmetic ----------------------------------------------------------------------
@dataclass(frozen=True)
class ShardPlan:
    num_shards: int
    gpus_per_shard: float
    gpus_per_policy: float
    policies_per_shard: int
    max_policies: int

    def shard_capacities(self) -> list[int]:
        """Slots per shard: the ``max_policies`` spread evenly, each at most ``policies_per_shard``."""
        base, extra = divmod(self.max_policies, self.num_shards)
        return [base + (1 if s < extra else 0) for s in range(self.num_shards)]

    def slot_device(self, shard: int, slot: int) -> str:
        """The device of the policy learner in ``slot`` of ``shard`` when the shards live in this
        process: "cpu" without GPUs, else ``cuda:k``, the GPUs dealt out as the plan shares them
        (shard s starts at GPU s x gpus_per_shard, its slots follow at gpus_per_policy each).
        Remote learners use the GPU Ray assigned to their actor instead (:data:`ASSIGNED_GPU`)."""
        if self.gpus_per_policy <= 0:
            return "cpu"
        return f"cuda:{math.floor(shard * self.gpus_per_shard + slot * self.gpus_per_policy + 1e-6)}"


ASSIGNED_GPU = "assigned-gpu"  # a remote policy learner's device: the GPU its Ray actor was given


class ReplayLost:
    """What a policy learner's ``learn()`` returns when its shard's replay actor died under it (an
    ActorLostError from the replay proxy): DistributedLearners then recreates the replay actor.
    One instance, :data:`REPLAY_LOST`, which stays itself through pickling (Ray's results)."""

    def __reduce__(self) -> str:
        return "REPLAY_LOST"

    def __repr__(self) -> str:
        return "REPLAY_LOST"


REPLAY_LOST = ReplayLost()


def resolve_learner_device(spec: str) -> torch.device:
    """A policy learner's device from its spec ("cpu", "cuda:k" or :data:`ASSIGNED_GPU`), checked."""
    if spec == ASSIGNED_GPU:
        spec = runtime.assigned_cuda_device()
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"a policy learner was given {spec} but torch sees no CUDA device in this process; "
            "set resources.num_gpus=0 to learn on the CPU"
        )
    return device


def _ray_fraction(x: float) -> float:
    """Ray takes resource amounts in steps of 1e-4; round down so the plan never asks for more."""
    return math.floor(x * 1e4 + 1e-6) / 1e4


def shard_plan(num_gpus: float, max_policies: int, num_shards: int | None = None) -> ShardPlan:
    """Learner shards for ``num_gpus`` GPUs (G) and at most ``max_policies`` (P) trainable policies.

    shards = min(G or P, P) unless given (a fractional G below 1 counts as one shard);
    GPUs per shard = G // shards, or G / shards when that is 0 (a fraction above 1 is
    floored); GPUs per policy = GPUs per shard / (P / shards), floored to whole GPUs above 1;
    policies per shard = ceil(P / shards).
    """
    if isinstance(max_policies, bool) or not isinstance(max_policies, int) or max_policies < 1:
        raise ConfigError(f"max_policies={max_policies!r}: the number of trainable policies must be an integer >= 1")
    if (
        isinstance(num_gpus, bool)
        or not isinstance(num_gpus, (int, float))
        or not math.isfinite(num_gpus)
        or num_gpus < 0
    ):
        raise ConfigError(f"num_gpus={num_gpus!r}: the learners' GPUs must be a finite number >= 0")
    if num_shards is None:
        shards = min(max(1, int(num_gpus)) if num_gpus > 0 else max_policies, max_policies)
    elif isinstance(num_shards, bool) or not isinstance(num_shards, int) or not 1 <= num_shards <= max_policies:
        raise ConfigError(
            f"num_shards={num_shards!r}: the number of learner shards must be an integer between 1 "
            f"and max_policies={max_policies}"
        )
    else:
        shards = num_shards
    per_shard = float(num_gpus // shards) or num_gpus / shards
    per_policy = per_shard / (max_policies / shards)
    per_policy = float(math.floor(per_policy)) if per_policy > 1 else _ray_fraction(per_policy)
    return ShardPlan(
        num_shards=shards,
        gpus_per_shard=_ray_fraction(per_shard),
        gpus_per_policy=per_policy,
        policies_per_shard=math.ceil(max_policies / shards),
        max_policies=max_policies,
    )


def shard_sizes(plan: ShardPlan, replay_num_cpus: float, policy_num_cpus: float) -> tuple[tuple[float, float], ...]:
    """``(cpus, gpus)`` per shard when each shard is one bundle: its replay actor plus one learner per slot."""
    return tuple(
        (replay_num_cpus + cap * policy_num_cpus, cap * plan.gpus_per_policy) for cap in plan.shard_capacities()
    )


# ---- the shards ----------------------------------------------------------------------------
class DistributedLearners:
    """Learner shards: ``plan.num_shards`` replay actors and up to ``plan.max_policies`` policy
    learner actors, each on its shard's replay actor's node.

    ``remote=False`` keeps everything as plain objects in this process (same interface).
    Replay actors are spread over the cluster's nodes (a SPREAD placement group); each
    policy learner actor reserves ``policy_num_cpus`` CPUs and ``plan.gpus_per_policy`` GPUs
    on its shard's node.
    """

    def __init__(
        self,
        policy_learner_cls: type,
        replay_cls: type,
        plan: ShardPlan,
        *,
        remote: bool,
        replay_kwargs: dict | None = None,
        replay_num_cpus: float = 0.0,
        policy_num_cpus: float = 1.0,
        max_in_flight: int = 1,
        max_restarts: int = 100,
        restart_window_s: float = 600.0,
        resource_wait_s: float = 30.0,
        address: str | None = None,
        placement: Any = None,
        request_timeout_s: float | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        self.policy_learner_cls, self.plan, self.remote = policy_learner_cls, plan, remote
        self.max_in_flight = max_in_flight
        common = runtime.ActorResources(
            max_restarts=max_restarts,
            restart_window_s=restart_window_s,
            resource_wait_s=resource_wait_s,
            address=address,
            request_timeout_s=request_timeout_s,
            start_timeout_s=start_timeout_s,
        )
        self.replay_resources = common.replace(num_cpus=replay_num_cpus, strategy="SPREAD", placement=placement)
        self.policy_resources = common.replace(num_cpus=policy_num_cpus, num_gpus=plan.gpus_per_policy)
        # With the run's placement group: shard s is one bundle (its replay actor plus every slot's
        # learner), so a shard's learners share its node without pinning.
        self.shard_bundles: tuple[int, ...] | None = placement[1] if placement is not None else None
        self._pg = placement[0] if placement is not None else None
        self.replays = runtime.make_actor_group(
            replay_cls,
            plan.num_shards,
            lambda i: ((), dict(replay_kwargs or {})),
            remote=remote,
            resources=self.replay_resources,
            name="learner shard replay actor",
            first_index=0,
        )
        self.replay_nodes: dict[int, str] = self.replays.node_ids() if remote else {}
        self._replay_actors = dict(self.replays.actors)  # the replay actor each shard's learners were given
        self.slots: list[list[PolicyId | None]] = [[None] * c for c in plan.shard_capacities()]
        self.where: dict[PolicyId, tuple[int, int]] = {}
        self.groups: dict[PolicyId, Any] = {}
        self.weights: dict[PolicyId, Any] = {}  # the latest weights seen from each policy's learner
        self._restarts_of_removed = 0

    # ---- slots ---------------------------------------------------------------------------
    @property
    def policy_ids(self) -> list[PolicyId]:
        return list(self.where)

    def num_free_slots(self) -> int:
        return sum(s.count(None) for s in self.slots)

    def add_policy(
        self, policy_id: PolicyId, ctor_args: tuple = (), ctor_kwargs: dict | None = None, *, weights: Any = None
    ) -> tuple[int, int]:
        """Create ``policy_id``'s learner actor in the first free slot; returns (shard, slot).

        ``weights``, when given, are set on the new learner (e.g. a snapshot's parent's).
        """
        shard, slot = self._free_slot(policy_id)
        device = ASSIGNED_GPU if self.remote and self.plan.gpus_per_policy > 0 else self.plan.slot_device(shard, slot)
        group = self._make_group(policy_id, shard, ctor_args, {**(ctor_kwargs or {}), "device": device})
        self.slots[shard][slot] = policy_id
        self.where[policy_id], self.groups[policy_id] = (shard, slot), group
        if weights is not None:
            self.set_weights(policy_id, weights)
        else:
            self.weights[policy_id] = self._call(policy_id, "get_weights")
        return shard, slot

    def reserve(self, policy_id: PolicyId) -> tuple[int, int]:
        """A slot, and its shard's replay, for ``policy_id`` whose learner lives elsewhere (a league
        policy's learner group): the rollout actors store its batches in that replay, its learners
        pull from it (``get_replay_actor``); no learner actor is created here. Returns (shard, slot)."""
        shard, slot = self._free_slot(policy_id)
        self.slots[shard][slot] = policy_id
        self.where[policy_id] = (shard, slot)
        return shard, slot

    def _free_slot(self, policy_id: PolicyId) -> tuple[int, int]:
        if policy_id in self.where:
            raise ValueError(f"policy {policy_id!r} already has a learner (shard {self.where[policy_id][0]})")
        free = next(((s, j) for s, row in enumerate(self.slots) for j, p in enumerate(row) if p is None), None)
        if free is None:
            raise ConfigError(
                f"cannot add policy {policy_id!r}: the league is full, all {self.plan.max_policies} learner slots "
                f"({self.plan.num_shards} shards, capacities {self.plan.shard_capacities()}) hold trainable policies "
                f"{self.policy_ids}. Remove (or freeze) a policy first, or raise the maximum number of trainable "
                "policies."
            )
        return free

    def _make_group(self, policy_id: PolicyId, shard: int, args: tuple, kwargs: dict):
        def ctor(_i: int) -> tuple[tuple, dict]:  # looked up at each (re)start: a restarted replay actor's new handle
            return (policy_id, self.replays.proxies(wait=True)[shard], *args), kwargs

        if self.shard_bundles is not None:  # in its shard's bundle of the run's placement group
            resources = self.policy_resources.replace(placement=(self._pg, (self.shard_bundles[shard],)))
        else:
            resources = self.policy_resources.replace(node=self.replay_nodes.get(shard))
        group = runtime.make_actor_group(
            self.policy_learner_cls,
            1,
            ctor,
            remote=self.remote,
            resources=resources,
            max_in_flight=self.max_in_flight,
            name=f"policy learner {policy_id!r}",
            first_index=0,
        )
        group.on_restart = lambda: [("set_weights", (self.weights[policy_id],))]
        return group

    def remove_policy(self, policy_id: PolicyId) -> Any:
        """Stop ``policy_id``'s learner, free its slot and drop its replay data; returns its latest weights."""
        shard, slot = self._where(policy_id)
        group = self.groups.pop(policy_id, None)  # None: a reserved slot, its learner elsewhere
        if group is not None:
            self._restarts_of_removed += group.num_restarts
            group.stop()
        self.slots[shard][slot] = None
        del self.where[policy_id]
        self.replays.foreach("remove_policy", policy_id, actor_ids=[shard])
        return self.weights.pop(policy_id, None)

    def _where(self, policy_id: PolicyId) -> tuple[int, int]:
        if policy_id not in self.where:
            raise KeyError(f"policy {policy_id!r} has no learner; trainable policies: {self.policy_ids}")
        return self.where[policy_id]

    # ---- actors ---------------------------------------------------------------------------
    def get_replay_actor(self, policy_id: PolicyId) -> Any:
        """The replay actor of ``policy_id``'s shard; its calls return their results."""
        return self.replays.proxies(wait=True)[self._where(policy_id)[0]]

    def replay_proxies(self) -> dict[PolicyId, Any]:
        """Fire-and-forget handles, per policy, for rollout actors to ``add_batch(policy_id, batch)``
        straight into the policy's shard (fetch again after a replay actor restarts)."""
        proxies = self.replays.proxies()
        return {pid: proxies[shard] for pid, (shard, _) in self.where.items()}

    def get_policy_actor(self, policy_id: PolicyId) -> Any:
        """The current learner actor of ``policy_id``; its calls return their results."""
        self._where(policy_id)
        return self.groups[policy_id].proxies(wait=True)[0]

    def _call(self, policy_id: PolicyId, method: str, *args: Any) -> Any:
        group = self.groups[policy_id]
        for _ in range(2):  # a dead actor is recreated (with the latest weights) and asked once more
            out = group.foreach(method, *args)
            if out:
                return out[0]
        raise RuntimeError(
            f"policy learner {policy_id!r} failed twice on {method}(); last failure: "
            f"{getattr(group, 'last_failure', None)}"
        )

    def call(self, policy_id: PolicyId, method: str, *args: Any) -> Any:
        """Call ``method`` on ``policy_id``'s learner and wait for the result."""
        self._where(policy_id)
        return self._call(policy_id, method, *args)

    def submit(self, policy_id: PolicyId, method: str, *args: Any) -> bool:
        """Send ``method`` to ``policy_id``'s learner unless ``max_in_flight`` requests are open."""
        self._where(policy_id)
        return self.groups[policy_id].submit(method, *args) > 0

    def num_in_flight(self, policy_id: PolicyId | None = None) -> int:
        ids = [policy_id] if policy_id is not None else list(self.groups)
        return sum(self.groups[p].num_in_flight() for p in ids)

    def fetch_ready(self, timeout_s: float = 0.0) -> list[tuple[PolicyId, Any]]:
        """Results of the submitted requests that are done, as (policy id, result), waiting at
        most ``timeout_s`` for the first one. A learner that died is recreated meanwhile. A result
        that carries ``weights`` (a :class:`~shoal.learn.threads.LearnerResult`) updates
        the weights kept for recreating that learner."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = [(pid, r) for pid, g in list(self.groups.items()) for _, r in g.fetch_ready(0.0)]
            out = [(pid, r) for pid, r in got if not isinstance(r, ReplayLost)]
            for pid, r in out:
                if getattr(r, "weights", None) is not None and pid in self.groups:
                    self.weights[pid] = r.weights
            if len(out) < len(got):
                self.check_replays()
            if out or time.monotonic() >= deadline or not self.num_in_flight():
                return out
            time.sleep(0.002)

    # ---- weights ----------------------------------------------------------------------------
    def get_weights(self, policy_ids: list[PolicyId] | None = None) -> dict[PolicyId, Any]:
        """Fetch the learners' current weights (and keep them for recreating a learner that dies)."""
        policy_ids = [p for p in self.policy_ids if p in self.groups] if policy_ids is None else policy_ids
        for pid in policy_ids:
            self._where(pid)
            self.weights[pid] = self._call(pid, "get_weights")
        return {pid: self.weights[pid] for pid in policy_ids}

    def set_weights(self, policy_id: PolicyId, weights: Any) -> None:
        self._where(policy_id)
        self.weights[policy_id] = weights
        self._call(policy_id, "set_weights", weights)

    # ---- resources and health -------------------------------------------------------------------
    def resource_bundles(self) -> list[dict[str, float]]:
        """Every shard's reservation: its replay actor, then one bundle per policy slot."""
        out: list[dict[str, float]] = []
        for cap in self.plan.shard_capacities():
            out.append({"CPU": self.replay_resources.num_cpus, "GPU": 0.0})
            out.extend(
                {"CPU": self.policy_resources.num_cpus, "GPU": self.policy_resources.num_gpus} for _ in range(cap)
            )
        return out

    def node_ids(self) -> dict[str, dict]:
        """Where the actors run (Ray node ids; empty in-process): {"replay": {shard: node}, "policies": {id: node}}."""
        if not self.remote:
            return {"replay": {}, "policies": {}}
        return {"replay": self.replays.node_ids(), "policies": {pid: g.node_ids()[0] for pid, g in self.groups.items()}}

    def replay_stats(self) -> dict[PolicyId, dict[str, int]]:
        """Per-policy replay counters from every shard (a replay actor that died is recreated, empty)."""
        out: dict[PolicyId, dict[str, int]] = {}
        for stats in self.replays.foreach("stats"):
            out.update(stats)
        return out

    def check_replays(self) -> list[int]:
        """Recreate every replay actor that died (empty: its batches are gone) and hand the new
        one to its shard's learners (a reserved slot's, which live elsewhere, get it from their owner:
        ``get_replay_actor``); returns the shards whose replay actor was recreated.
        Rollout actors need the new handles too: see :meth:`replay_proxies`."""
        self.replays.foreach("ping")  # a call to a dead actor fails, and the group recreates it
        lost = [s for s, actor in self.replays.actors.items() if actor is not self._replay_actors.get(s)]
        if lost:
            proxies = self.replays.proxies(wait=True)
            for shard in lost:
                self._replay_actors[shard] = self.replays.actors[shard]
                for pid in [p for p, (s, _) in self.where.items() if s == shard and p in self.groups]:
                    self._call(pid, "set_replay", proxies[shard])
        return lost

    @property
    def num_restarts(self) -> int:
        """Policy learner actors recreated (replay actors are counted apart: :attr:`num_replay_restarts`)."""
        return self._restarts_of_removed + sum(g.num_restarts for g in self.groups.values())

    @property
    def num_replay_restarts(self) -> int:
        return self.replays.num_restarts

    def stop(self) -> None:
        for group in self.groups.values():
            group.stop()
        self.groups.clear()
        self.replays.stop()
