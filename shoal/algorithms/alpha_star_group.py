"""A league policy trained by a learner group: K data-parallel replicas instead of one shard learner.

``resources.learner_groups: {policy_id: K}`` (e.g. ``{main: 2}``) trains each named learning
player of the league with the framework's learner group (:class:`~shoal.framework.learner_group.LearnerGroup`:
K Ray actors, a torch.distributed process group, a replica that dies replaced and the group
re-formed from a survivor's state); the other learning players keep their shard learner.

- **Where the data comes from.** The policy keeps a slot on a learner shard
  (:meth:`DistributedLearners.reserve <shoal.learn.distributed_learners.DistributedLearners.reserve>`):
  the rollout actors store its batches in that shard's replay as for any learning player. A
  round is one ``learn`` request per replica (the driver's ``LearnerGroup.add``, with no
  fragments); each replica pulls ``train_batch_size / K`` rows from the replay
  (:meth:`APPOPolicyLearner._pull <shoal.algorithms.alpha_star_learner.APPOPolicyLearner._pull>`).
- **The update is the union batch's.** The replicas first all-reduce their row counts: with none
  in the union they skip the round together; else every replica takes the steps a shard learner
  takes on the union (``num_sgd_iter`` passes of ``ceil(union rows / minibatch_size)`` steps, each
  replica's part of a step a shuffled share of its own sequences), each step's gradients
  all-reduced weighted by valid rows and advantages standardized over the union
  (:class:`~shoal.learn.distributed.UnionBatchLearner`). A replica with nothing pulled takes
  zero-weight steps, so all stay in step.
- **The post-update phase** runs on every replica after its update, as a shard learner runs it: the
  KL coefficient, the target network and the parameter average (``average_tau``) move on each
  replica alike (the coefficient on each replica's own KL measurement, as in IMPALA's and
  APPO's group; the all-reduced gradient keeps the weights equal). Rank 0's result carries the
  union's rows and the new weights; the others' are dropped by :class:`LeagueRunner`.
- **League changes.** A reset sets the new weights on every replica (between the same two rounds:
  each replica's calls run in the order the driver sent them); a freeze or removal stops the
  group and frees the slot; checkpoints hold replica 0's state and a restore gives it to all.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import numpy as np
import torch
from pydantic import Field

from shoal.algorithms.alpha_star_learner import APPOPolicyLearner
from shoal.batch import Batch
from shoal.config import ResourcesConfig
from shoal.framework.learner_group import GroupLearner, LearnerGroup
from shoal.framework.runner import RemoteLearner, ShardRunner
from shoal.learn.distributed import CollectiveError, UnionBatchLearner, all_reduce_sum_, init_process_group
from shoal.learn.distributed_learners import ReplayLost
from shoal.learn.stats import StatsMean
from shoal.learn.threads import LearnerResult
from shoal.process import configure_process
from shoal.runtime.placement import BundleGroup

PolicyId = str


# ---- config ------------------------------------------------------------------------------------------
class LeagueGroupResources(ResourcesConfig):
    """The league's learner-group keys (AlphaStar's resources section takes them)."""

    learner_groups: dict[str, int] = Field(
        default_factory=dict,
        description="Learning players trained by a learner group instead of one shard learner: {policy_id: K}, "
        "e.g. {main: 2}; K >= 2 data-parallel Ray actors of num_cpus_per_learner CPUs each (on CPUs), gradients "
        "all-reduced, pulling their shares of each train batch from the policy's shard replay. Needs remote "
        "learners (num_workers >= 1).",
    )
    learner_collective_timeout_s: float = Field(
        60.0,
        gt=0,
        description="learner_groups: how long a replica waits in an all-reduce (and the group's rendezvous) for "
        "its peers before the round counts as failed and the group is re-formed.",
    )

    def learner_backend(self) -> str:
        return "gloo"  # the group's replicas train on CPUs


def check_learner_groups(cfg: Any, learning: list[str]) -> None:
    """``resources.learner_groups``: each K an integer >= 2, each id a learning player the league
    starts with (``learning``), remote learners on CPUs. Raises ValueError naming what is allowed."""
    res = cfg.resources
    for pid, k in res.learner_groups.items():
        if pid not in learning:
            raise ValueError(
                f"resources.learner_groups names {pid!r}, which is not a learning player of this league; "
                f"its learning players are {', '.join(learning) or 'none'}"
            )
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(
                f"resources.learner_groups[{pid!r}] is {k!r}: a learner group is an integer K >= 2 replicas "
                "(leave the policy out to train it on its shard learner)"
            )
    if not res.learner_groups:
        return
    if res.num_workers < 1 or not res.learners_remote():
        raise ValueError(
            "resources.learner_groups needs Ray and remote learners: resources.num_workers >= 1 and "
            "resources.remote_learners not false (a group's replicas are Ray actors)"
        )
    if res.num_gpus > 0:
        raise ValueError(
            f"resources.learner_groups trains on CPUs; resources.num_gpus ({res.num_gpus:g}) with learner "
            "groups is not supported: set it to 0, or leave learner_groups empty"
        )
    if cfg.average_policy == "behaviour":
        raise ValueError(
            "resources.learner_groups with average_policy: behaviour is not supported (each replica would "
            "train its own average on its own share of the rows): use average_policy: parameters, or leave "
            "learner_groups empty"
        )


def group_bundles(config: Any) -> list[BundleGroup]:
    """One planned group of K learners (``num_cpus_per_learner`` CPUs each) per grouped policy."""
    res = config.resources
    key = "resources.num_cpus_per_learner, resources.learner_groups"
    return [
        BundleGroup(group_name(pid), k, res.num_cpus_per_learner, cpu_key=key) for pid, k in res.learner_groups.items()
    ]


def group_name(pid: PolicyId) -> str:
    return f"{pid} learner group"


# ---- one replica -----------------------------------------------------------------------------------
class LeagueGroupLearner(GroupLearner):
    """One replica of a league policy's learner group (a Ray actor): the ``GroupLearner`` protocol
    the driver's :class:`LearnerGroup` speaks, learning in ``add`` (one round: pull a share from the
    replay, agree on the union's rows, take its steps) instead of a learner thread."""

    def __init__(self, policy_id: str, replay: Any, config, index: int, obs_space, action_space, idle_sleep_s=0.0):
        configure_process(config.resources)
        self.config, self.index, self.policy_id = config, index, policy_id
        self.policy = APPOPolicyLearner(
            policy_id, replay, config, obs_space, action_space, idle_sleep_s, learner_cls=UnionBatchLearner
        )
        self.learner: UnionBatchLearner = self.policy.learner
        seed = None if config.seed is None else [config.seed, index, *policy_id.encode()]
        self.policy.rng = np.random.default_rng(seed)  # each replica shuffles its own sequences
        self.thread = None
        self.epoch = self.num_added = self.num_lost_fragments = 0
        self.rank, self.world_size = 0, 1
        self._results: list[LearnerResult] = []
        self._error: Optional[str] = None

    def join_group(self, address: tuple[str, int], ranks: dict[int, int], epoch: int) -> int:
        self._end_thread()
        res = self.config.resources
        self.rank, self.world_size = ranks[self.index], len(ranks)
        init_process_group(res.learner_backend(), address, self.rank, self.world_size, res.learner_collective_timeout_s)
        self.epoch, self.num_added, self._results, self._error = epoch, 0, [], None
        return self.rank

    def add(self, refs: Any, sampled_steps: int, change: Optional[tuple] = None) -> None:
        """One round (``refs`` unused: the replica pulls its share from the replay). After a failed
        collective the rounds left are skipped: the driver re-forms the group."""
        self.num_added += 1
        if self._error is not None:
            return
        try:
            self._results.append(self._round(int(sampled_steps)))
        except CollectiveError as e:
            self._error = f"learner {self.index}: {e}"

    def _round(self, sampled_steps: int) -> LearnerResult:
        policy, cfg = self.policy, self.config
        policy.learner.set_env_steps(sampled_steps)
        pulled = policy._pull(-(-cfg.train_batch_size // self.world_size))
        batches = [] if isinstance(pulled, ReplayLost) else pulled  # a lost replay: this replica's part is empty
        rows = torch.tensor([float(sum(len(b) for b in batches))], dtype=torch.float64)
        all_reduce_sum_(rows, what="row count")
        total = int(rows.item())
        if total == 0:  # nothing anywhere: every replica skips the round
            time.sleep(policy.idle_sleep_s)
            return LearnerResult(0, 0, {}, policy_id=self.policy_id)
        stats = self._steps(Batch.concat(batches) if batches else None, total)
        policy.after_update(stats)  # the post-update phase, on every replica alike
        stats.update(num_updates=self.learner.num_updates, num_nonfinite_skipped=self.learner.num_nonfinite_skipped)
        stats["replay_lost"] = float(isinstance(pulled, ReplayLost))
        lead = self.rank == 0
        return LearnerResult(
            total if lead else 0,
            total if lead else 0,
            stats,
            policy_id=self.policy_id,
            weights=policy.get_weights() if lead else None,
        )

    def _steps(self, batch: Optional[Batch], total: int) -> dict[str, Any]:
        """The union's steps: ``num_sgd_iter`` passes of ``ceil(total / minibatch_size)`` (one without
        it) all-reduced steps, this replica's part of each a share of its own shuffled sequences."""
        cfg, learner = self.config, self.learner
        T = cfg.fragment_length()
        n = 1 if cfg.minibatch_size is None else -(-total // cfg.minibatch_size)
        tensors = batch.to_torch(learner.device) if batch is not None else {}
        seqs = len(batch) // T if batch is not None else 0
        acc = StatsMean()
        learner.module.train()
        for _ in range(cfg.num_sgd_iter):
            order = torch.from_numpy(self.policy.rng.permutation(seqs))
            for part in torch.tensor_split(order, n):
                if n == 1 and seqs:
                    mb = tensors  # the whole batch, as a shard learner's one step
                elif len(part):
                    idx = ((part[:, None] * T + torch.arange(T)).reshape(-1)).to(learner.device)
                    mb = {k: v[idx] for k, v in tensors.items()}
                else:
                    mb = {}  # none of this replica's sequences in this step: a zero-weight part
                acc.add(learner.update_minibatch(mb))
        learner.module.eval()
        out = acc.mean()
        out["lr"] = learner.lr
        out.update(learner.schedule_stats())
        return out

    def report(self, wait_s: float = 0.0) -> dict[str, Any]:
        """The rounds learned since the last report (each ``add`` learns before it returns)."""
        results, self._results = self._results, []
        return {
            "index": self.index,
            "epoch": self.epoch,
            "results": results,
            "error": self._error,
            "num_updates": self.learner.num_updates,
            "added": self.num_added,
            "queued": 0,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """A whole learner state (a survivor's, a checkpoint's), or ``{"weights": ...}`` (a reset, or
        the driver's latest weights when no replica survived)."""
        if "learner" in state:
            self.policy.set_state(state)
        else:
            self.policy.set_weights(state["weights"])

    def average_weights(self) -> Optional[dict[str, np.ndarray]]:
        return self.policy.average_weights()

    def set_replay(self, replay: Any) -> None:
        self.policy.set_replay(replay)


# ---- the driver's side ------------------------------------------------------------------------------
MakeGroup = Callable[[PolicyId, int], LearnerGroup]  # (policy id, K) -> its (not yet started) group


class LeagueRunner:
    """The league's runner: a :class:`~shoal.framework.runner.ShardRunner` for the shard learners,
    a :class:`LearnerGroup` of :class:`LeagueGroupLearner` for each policy in ``grouped``
    (policy id -> K). ``make_group(pid, K)`` builds a group; ``weights`` holds each grouped policy's
    latest weights (what a group formed without a survivor starts from)."""

    def __init__(self, learners: Any, make_group: MakeGroup, grouped: Mapping[PolicyId, int]) -> None:
        self.learners, self.shards = learners, ShardRunner(learners)
        self.make_group, self.grouped = make_group, dict(grouped)
        self.groups: dict[PolicyId, LearnerGroup] = {}
        self.weights: dict[PolicyId, dict] = {}
        self._replay_restarts = learners.num_replay_restarts
        self._restarts_of_removed = self._regroups_of_removed = 0

    @classmethod
    def of(cls, algo: Any) -> LeagueRunner:
        """The runner of the league ``algo``: its shards, its ``resources.learner_groups``."""
        groups = algo.config.resources.learner_groups
        runner = cls(algo.learners, lambda pid, k: make_league_group(algo, pid, k, lambda: runner), groups)
        return runner

    def submit(self, batches: Mapping[PolicyId, Any]) -> bool:
        self._hand_new_replays()
        taken = self.shards.submit({p: s for p, s in batches.items() if p not in self.groups})
        for pid in [p for p in batches if p in self.groups]:
            group = self.groups[pid]
            rounds: list[list] = [[] for _ in range(group.num_learners)]
            taken = (not group.full() and group.add(rounds, int(batches[pid] or 0))) and taken
        return taken

    def results(self, timeout_s: float = 0.0) -> list[LearnerResult]:
        share = timeout_s / (len(self.groups) + 1)
        out = self.shards.results(share if self.groups else timeout_s)
        for pid, group in list(self.groups.items()):
            for r in group.drain(timeout_s=share):
                if r.weights is not None and pid in self.groups:  # rank 0's: the union's rows, the new weights
                    self.weights[pid] = r.weights
                    out.append(r._replace(policy_id=pid))
        return out

    def _hand_new_replays(self) -> None:
        """A recreated replay actor (``DistributedLearners.check_replays``) goes to the groups' replicas too."""
        if self.learners.num_replay_restarts == self._replay_restarts:
            return
        self._replay_restarts = self.learners.num_replay_restarts
        for pid, group in self.groups.items():
            group.group.foreach("set_replay", self.learners.get_replay_actor(pid))

    def get_weights(self, policy_id: PolicyId) -> dict[str, np.ndarray]:
        if policy_id in self.groups:
            return self.groups[policy_id].call("get_weights")
        return self.shards.get_weights(policy_id)

    def add_policy(self, policy_id: PolicyId, learner: RemoteLearner) -> None:
        if policy_id not in self.grouped:
            self.shards.add_policy(policy_id, learner)
            return
        self.learners.reserve(policy_id)  # its batches go to that shard's replay
        assert learner.weights is not None, "a grouped policy starts from given weights"
        self.weights[policy_id] = learner.weights
        group = self.make_group(policy_id, self.grouped[policy_id])
        group.start()  # formed from the weights: every replica the same
        self.groups[policy_id] = group

    def remove_policy(self, policy_id: PolicyId) -> None:
        group = self.groups.pop(policy_id, None)
        if group is not None:
            self._restarts_of_removed += group.group.num_restarts
            self._regroups_of_removed += group.num_regroups
            group.stop()
            self.weights.pop(policy_id, None)
        self.shards.remove_policy(policy_id)

    def call(self, policy_id: PolicyId, method: str, *args: Any) -> Any:
        """``method`` on the policy's learner (a group's replica 0), its result."""
        if policy_id in self.groups:
            return self.groups[policy_id].call(method, *args)
        return self.learners.call(policy_id, method, *args)

    def set_weights(self, policy_id: PolicyId, weights: dict) -> None:
        """New weights (a reset): on every replica of a group."""
        self.set_state(policy_id, {"weights": weights})

    def set_state(self, policy_id: PolicyId, state: dict[str, Any]) -> None:
        """A learner state (or ``{"weights": ...}``) for the policy's learner: every replica of a group."""
        if policy_id not in self.groups:
            if "learner" in state:
                self.learners.call(policy_id, "set_state", state)
            else:
                self.learners.set_weights(policy_id, state["weights"])
            return
        group = self.groups[policy_id]
        group.set_state(state)
        self.weights[policy_id] = state["weights"] if "weights" in state else group.call("get_weights")

    @property
    def num_restarts(self) -> int:
        """Learner actors recreated: the shard learners' and the groups' replicas."""
        groups = sum(g.group.num_restarts for g in self.groups.values() if g.group is not None)
        return self.learners.num_restarts + self._restarts_of_removed + groups

    @property
    def num_regroups(self) -> int:
        return self._regroups_of_removed + sum(g.num_regroups for g in self.groups.values())

    def hold(self) -> AbstractContextManager[Any]:
        return nullcontext()  # every learner applies a whole update per call

    def check(self) -> None:
        """Dead learners are recreated (shard learners) or replaced and the group re-formed: nothing to raise."""

    def stop(self) -> None:
        for group in self.groups.values():
            group.stop()
        self.groups.clear()
        self.shards.stop()


def make_league_group(algo: Any, policy_id: PolicyId, k: int, runner: Callable[[], LeagueRunner]) -> LearnerGroup:
    """Policy ``policy_id``'s learner group of ``k`` replicas for the league ``algo`` (its config,
    spaces, shards and planned bundles); ``runner()`` is the runner whose weights a group formed
    without a survivor starts from."""
    from shoal.runtime import make_actor_group

    cfg, res = algo.config, algo.config.resources
    name = group_name(policy_id)
    idle = cfg.learner_idle_sleep_s

    def ctor(i: int) -> tuple[tuple, dict]:  # looked up at each (re)start: the shard's current replay actor
        replay = algo.learners.get_replay_actor(policy_id)
        return (policy_id, replay, cfg, i, algo.obs_space, algo.action_space, idle), {}

    def make() -> Any:
        return make_actor_group(
            LeagueGroupLearner,
            k,
            ctor,
            remote=True,
            resources=algo.actor_resources(name, num_cpus=res.num_cpus_per_learner, num_gpus=0.0),
            max_in_flight=1 << 20,  # the group keeps its own count (LearnerGroup)
            name=name,
            first_index=0,
            about=f"alpha_star {name}",
        )

    return LearnerGroup(
        make,
        num_learners=k,
        queue_size=cfg.max_requests_in_flight_per_worker,
        local_state=lambda: {"weights": runner().weights[policy_id]},
        on_weights=lambda ref: None,  # the weights come with rank 0's results
    )


if TYPE_CHECKING:  # mypy holds the runner to the protocol
    from shoal.framework.runner import LearnerRunner

    def _conforms(runner: LeagueRunner) -> LearnerRunner:
        return runner
