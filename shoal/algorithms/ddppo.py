"""DD-PPO: decentralized distributed PPO (Wijmans et al., 2020).

Every rollout actor is also a learner. Each round it samples ``rollout_fragment_length x
num_envs_per_worker`` steps, computes GAE, and runs ``num_sgd_iter`` epochs of minibatch SGD
on its own batch, averaging the gradients of every minibatch over a torch.distributed
process group (gloo on CPUs, nccl on GPUs, mpi where torch has it). Replicas start from the
same state and apply the same averaged gradients, so they stay identical. The driver never
trains: it gathers the rounds that have finished, aggregates metrics and, with
``keep_local_weights_in_sync``, keeps a copy of worker 0's weights for evaluation.

Fault tolerance (beyond the reference implementation, which had none for DD-PPO): when a
worker dies, the runtime recreates it; the survivors' collective fails fast (the group's
timeout), the driver forms a new process group over the survivors and the new worker, and
copies the full learner state (weights and optimizer) of one survivor to every other
member before training goes on.

The driver drives the workers through a learner runner, ``WorkerRunner``
(:mod:`shoal.framework.runner`): it starts their rounds, turns each worker's round into a
``LearnerResult`` and keeps the process group (forming, re-forming, the settled-worker calls).

Reads in order: config, the worker (sample + loss via PPO's, from ``ppo_loss.py``), training_step.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, ClassVar, Optional, Union, cast

import numpy as np
from pydantic import Field, field_validator, model_validator

from shoal.algorithms.loss_keys import PPOLossKeys
from shoal.algorithms.ppo_loss import PPOLoss, gae_postprocess, sgd_sequence_length
from shoal.config import AlgorithmConfig, ResourcesConfig
from shoal.errors import DivergenceError
from shoal.framework.base import Algorithm
from shoal.framework.policies import PolicySet
from shoal.framework.runner import WorkerRound, WorkerRunner
from shoal.learn import Learner, resolve_device
from shoal.learn.distributed import (
    BACKENDS,
    CollectiveError,
    DistributedLearner,
    backend_available,
    destroy_process_group,
    free_port,
    init_process_group,
    node_ip,
)
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.stats import mean_stats
from shoal.learn.threads import LearnerResult
from shoal.logging.metrics import Phase
from shoal.models import build_actor_critic
from shoal.process import configure_process
from shoal.rollout import ActorCriticPolicy
from shoal.rollout.env_runner import EnvRunner
from shoal.runtime import make_actor_group
from shoal.runtime.placement import BundleGroup
from shoal.seeding import component_seed


# ---- config -----------------------------------------------------------------------------
class DDPPOResourcesConfig(ResourcesConfig):
    unused_keys = {"num_gpus": "DD-PPO's driver never trains; give the workers GPUs with resources.num_gpus_per_worker"}

    num_workers: int = Field(2, description="Rollout actors, each a learner too; at least 1 (the driver never trains).")
    num_gpus_per_worker: float = Field(0.0, ge=0, description="GPUs for each worker's learner (nccl needs them).")

    @field_validator("num_workers")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError("DD-PPO needs num_workers >= 1: every worker samples and trains, the driver does neither")
        return v


_NO_CENTRAL_LEARNER = (
    "the adaptive KL penalty needs a central learner, and DD-PPO's workers each train on their own batch"
)


class DDPPOConfig(PPOLossKeys, AlgorithmConfig):
    """PPO's loss keys, run on every worker; PPO's KL penalty keys are refused with the reason (``unused_keys``)."""

    algo = "ddppo"
    mutable_keys = frozenset()  # the learners live in other processes: nothing changes mid-run
    lstm_sequences = "max_seq_len"
    min_workers: ClassVar[int] = 1
    unused_keys = {
        "train_batch_size": "DD-PPO derives the train batch: each worker trains on rollout_fragment_length x "
        "resources.num_envs_per_worker steps per round",
        "use_kl_loss": _NO_CENTRAL_LEARNER,
        "kl_coeff": _NO_CENTRAL_LEARNER,
        "kl_target": _NO_CENTRAL_LEARNER,
        "normalize": "DD-PPO's workers learn on their own samples with no driver between them to merge running "
        "statistics",
    }

    lr: float = Field(3e-4, gt=0, description="Adam learning rate of every worker (lr_schedule overrides it).")
    train_batch_size: int = Field(4096, ge=1, description="Not used: each worker's batch is derived (unused_keys).")
    rollout_fragment_length: Union[int, str] = Field(
        64, description="Steps per env per round; each worker's batch is this x num_envs_per_worker."
    )
    minibatch_size: int = Field(256, ge=1, description="Rows per SGD minibatch on each worker.")
    batch_mode: str = Field("truncate_episodes", description="Only truncate_episodes: fixed-length fragments.")
    torch_distributed_backend: str = Field(
        "gloo", description="gloo (CPUs), nccl (GPUs) or mpi (if torch was built with it)."
    )
    keep_local_weights_in_sync: bool = Field(
        True, description="Copy worker 0's weights to the driver every round (for evaluate/checkpoints)."
    )
    torch_distributed_timeout_s: float = Field(
        60.0, gt=0, description="Rendezvous and collective timeout: how soon survivors notice a dead peer."
    )
    collective_wait: str = Field(
        "auto",
        description="How a worker waits for each gradient all-reduce: spin (poll, yielding the "
        "CPU: no wake-up delay), block (sleep), or auto (spin on gloo when each worker reserves "
        "at least one CPU, else block).",
    )
    resources: DDPPOResourcesConfig = Field(
        default_factory=DDPPOResourcesConfig, description="The workers, each a sampler and a learner."
    )

    @field_validator("torch_distributed_backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"must be one of {', '.join(BACKENDS)}")
        if not backend_available(v):
            raise ValueError(f"this torch build has no '{v}' backend; use gloo")
        return v

    @field_validator("collective_wait")
    @classmethod
    def _collective_wait(cls, v: str) -> str:
        if v not in ("auto", "spin", "block"):
            raise ValueError("must be one of auto, spin, block")
        return v

    @field_validator("batch_mode")
    @classmethod
    def _truncate(cls, v: str) -> str:
        if v != "truncate_episodes":
            raise ValueError(
                "DD-PPO only supports 'truncate_episodes': every worker trains on fixed-length fragments "
                "so all replicas run the same number of minibatches per round"
            )
        return v

    @model_validator(mode="after")
    def _check_ddppo_batch(self):  # the train batch is derived: rollout_fragment_length x num_envs_per_worker
        if not isinstance(self.rollout_fragment_length, int):
            raise ValueError(
                "DD-PPO needs an integer rollout_fragment_length (it sets each worker's batch), "
                f"got {self.rollout_fragment_length!r}"
            )
        if self.minibatch_size > self.worker_batch_size():
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) is larger than each worker's batch, "
                f"rollout_fragment_length x resources.num_envs_per_worker = {self.worker_batch_size()}"
            )
        if self.torch_distributed_backend == "nccl" and self.resources.num_gpus_per_worker <= 0:
            raise ValueError(
                "torch_distributed_backend 'nccl' needs GPUs: set resources.num_gpus_per_worker > 0, or use gloo"
            )
        gpus, workers = self.resources.num_gpus_per_worker, self.resources.num_workers
        if self.torch_distributed_backend == "nccl" and gpus < 1 and workers > 1:
            raise ValueError(
                f"torch_distributed_backend 'nccl' with resources.num_gpus_per_worker {gpus:g}: Ray may "
                "put two workers on one GPU, and NCCL refuses two ranks on one device ('invalid "
                "usage'). Give each worker a whole GPU (num_gpus_per_worker: 1), or use gloo, which "
                "all-reduces the workers' GPU gradients through the host"
            )
        return self

    def fragment_length(self) -> int:
        """Steps per env per round (an integer: the validator refuses 'auto')."""
        return int(self.rollout_fragment_length)

    def spin_wait(self) -> bool:
        """Whether workers poll for all-reduce results (see ``collective_wait``)."""
        if self.collective_wait != "auto":
            return self.collective_wait == "spin"
        return self.torch_distributed_backend == "gloo" and self.resources.num_cpus_per_worker >= 1

    def worker_batch_size(self) -> int:
        return self.fragment_length() * self.resources.num_envs_per_worker

    def num_minibatches(self) -> int:
        """Minibatches (= all-reduces) per epoch on every worker, fixed: reset steps make batches a little shorter.
        A recurrent model's minibatches are whole sequences of model.max_seq_len steps (at least one)."""
        if self.model.is_recurrent():
            seqs = self.worker_batch_size() // self.model.max_seq_len
            return -(-seqs // max(1, self.minibatch_size // self.model.max_seq_len))
        return -(-self.worker_batch_size() // self.minibatch_size)


# ---- the worker: sampler and learner in one actor ------------------------------------------
def ppo_policy_learner(
    config: DDPPOConfig, obs_space, action_space, learner_cls: type[Learner] = Learner, device="cpu"
) -> PolicyLearner:
    """The policy with PPO's loss on a ``learner_cls`` learner: the driver's plain copy, or a
    worker's DistributedLearner. No KL penalty: each replica learns alone, with nothing central
    to adapt a coefficient."""
    module = build_actor_critic(obs_space, action_space, config.model)
    extra: dict[str, Any] = {"spin_wait": config.spin_wait()} if issubclass(learner_cls, DistributedLearner) else {}
    return PolicyLearner(
        module, config, lambda c, **_: PPOLoss.from_config(c), device=device, learner_cls=learner_cls, **extra
    )


class DDPPOWorker:
    """One replica: an EnvRunner and a DistributedLearner; a member of the process group."""

    def __init__(self, config: DDPPOConfig, worker_index: int) -> None:
        configure_process(config.resources)
        self.config, self.worker_index = config, worker_index
        postprocess = functools.partial(gae_postprocess, gamma=config.gamma, gae_lambda=config.gae_lambda)
        self.runner = EnvRunner(config, worker_index, ActorCriticPolicy, postprocess, config.fragment_length())
        self.policy = ppo_policy_learner(
            config,
            self.runner.obs_space,
            self.runner.action_space,
            DistributedLearner,
            resolve_device(config.resources.num_gpus_per_worker),
        )
        self.learner = cast(DistributedLearner, self.policy.learner)
        self.rng = np.random.default_rng(component_seed(config.seed, worker_index))
        self.rounds = 0  # rounds trained by the group: drives the lr schedule identically on every replica
        self.rank: Optional[int] = None

    def rendezvous_address(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def join_group(self, address: tuple[str, int], ranks: dict[int, int]) -> int:
        self.rank = ranks[self.worker_index]
        init_process_group(
            self.config.torch_distributed_backend,
            address,
            self.rank,
            len(ranks),
            self.config.torch_distributed_timeout_s,
        )
        return self.rank

    def sample_and_train(self) -> WorkerRound:
        """One round: sample, then learn with the group; its ``learned`` is the update's
        ``LearnerResult``, or the CollectiveError (a peer failed) or DivergenceError that ended it."""
        cfg = self.config
        batch, metrics = self.runner.sample()
        t0, reduce_s, reduces = time.perf_counter(), self.learner.allreduce_s, self.learner.num_allreduces
        self.learner.set_env_steps(self.rounds * cfg.worker_batch_size() * self.learner.world_size)
        try:
            stats = self.learner.update(
                batch,
                cfg.num_sgd_iter,
                cfg.minibatch_size,
                self.rng,
                num_minibatches=cfg.num_minibatches(),
                sequence_length=sgd_sequence_length(cfg),
            )
        except CollectiveError as e:
            destroy_process_group()
            return WorkerRound(metrics, CollectiveError(f"worker {self.worker_index}: {e}"))
        except DivergenceError as e:  # every replica skipped the same all-reduced updates
            return WorkerRound(metrics, DivergenceError(str(e)))
        self.rounds += 1
        weights = self.learner.get_weights()
        self.runner.set_weights(weights)
        n = max(self.learner.num_allreduces - reduces, 1)
        stats.update(
            allreduce_ms_per_minibatch=1000.0 * (self.learner.allreduce_s - reduce_s) / n,
            learn_time_s=time.perf_counter() - t0,
            sample_time_s=metrics.sample_time_s,
        )
        keep = cfg.keep_local_weights_in_sync and self.rank == 0
        rows = batch.valid_rows()
        learned = LearnerResult(rows, rows, stats, weights=weights if keep else None)
        return WorkerRound(metrics, learned, self.rounds, self.learner.num_nonfinite_skipped)

    def get_sync_state(self) -> dict[str, Any]:
        return {"learner": self.learner.get_state(), "rounds": self.rounds}

    def set_sync_state(self, state: dict[str, Any]) -> None:
        self.learner.set_state(state["learner"])
        self.rounds = int(state["rounds"])
        self.runner.set_weights(self.learner.get_weights())

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.learner.get_weights()

    def get_optimizer_state(self) -> dict[str, Any]:
        return self.learner.optimizer.state_dict()

    def stop(self) -> None:
        destroy_process_group()
        self.runner.stop()


# ---- algorithm --------------------------------------------------------------------------
class DDPPO(Algorithm):
    """The driver: starts the workers (on the first training step) and drives their rounds through
    its runner (a ``WorkerRunner``, which gathers them and re-forms the group), aggregates."""

    config_cls = DDPPOConfig
    config: DDPPOConfig
    policy_cls = ActorCriticPolicy
    result_keys = (
        *Algorithm.result_keys,
        "allreduce_ms_per_minibatch",
        "num_regroups",
        "num_failed_rounds",
        "world_size",
    )

    def setup(self) -> None:
        cfg: DDPPOConfig = self.config
        # The driver's copy: initial state for the workers, worker 0's weights when kept in sync.
        info = self.env_info
        self.policies = PolicySet.single(cfg, ppo_policy_learner(cfg, info.observation_space, info.action_space))
        self.local = self.policies.only.learner
        # Where the policy learns: in the workers. A failed round's peers wait for the collective
        # timeout; a call waits at most twice that (and 30 s) for a worker to settle.
        self.runner = WorkerRunner(dict(self.policies.trained), wait_s=2 * cfg.torch_distributed_timeout_s + 30)

    @property
    def rounds(self) -> int:
        """Rounds the group has trained (the workers' count, as last reported)."""
        return self.runner.rounds

    def get_weights(self) -> dict[str, np.ndarray]:
        if not self.config.keep_local_weights_in_sync:
            return self.runner.get_weights(self.runner.policy_id)  # a settled worker's, else the driver's copy
        return self.local.get_weights()

    def training_step(self) -> dict[str, Any]:
        runner = self.runner
        with self.timers.time(Phase.REGROUP):
            if not runner.started:
                runner.start(self._make_workers())
            else:
                runner.regroup()  # after a failed round or a recreated worker
        with self.timers.time(Phase.SAMPLE_AND_TRAIN):
            runner.submit({runner.policy_id: None})
            done = runner.results(timeout_s=math.inf)  # at least one round, unless a worker died
        with self.timers.time(Phase.AGGREGATE):
            self.record_rollouts(runner.rollouts())
            runner.check()  # a replica diverged: the run stops
            self.counters["env_steps_trained"] += sum(r.env_steps for r in done)
        with self.timers.time(Phase.SYNC):
            for r in done:
                if r.weights is not None:
                    self.local.set_weights(r.weights)
        stats = mean_stats([r.stats for r in done])
        return {
            **{f"learner/{k}": v for k, v in stats.items()},
            "allreduce_ms_per_minibatch": stats.get("allreduce_ms_per_minibatch", float("nan")),
            "num_regroups": runner.num_regroups,
            "num_failed_rounds": runner.num_failed_rounds,
            "world_size": len(self.env_runners),
        }

    def nonfinite_updates_skipped(self) -> int:
        """The workers' count (replicas skip the same all-reduced updates)."""
        return self.runner.nonfinite_skipped

    @classmethod
    def resource_plan(cls, config: AlgorithmConfig) -> list[BundleGroup]:
        """The driver (which never trains) and the workers, each sampling and learning on its CPUs and GPUs."""
        assert isinstance(config, DDPPOConfig)
        plan = [g for g in super().resource_plan(config) if g.name != "rollout actor"]
        res = config.resources
        plan.insert(
            1,
            BundleGroup(
                "DD-PPO worker",
                res.num_workers,
                res.num_cpus_per_worker,
                res.num_gpus_per_worker,
                spread=res.worker_placement == "SPREAD",
            ),
        )
        return plan

    # ---- the workers ------------------------------------------------------------------------
    def _make_workers(self) -> Any:
        """The workers' actor group (the algorithm's rollout actors); the runner forms their process group."""
        cfg, res = self.config, self.config.resources
        # A hung worker's peers wait in their all-reduce for it; given twice the collective timeout,
        # they report that round failed before the hung worker's own request times out, so only
        # the hung worker is recreated.
        timeout = (
            None if res.request_timeout_s is None else max(res.request_timeout_s, 2 * cfg.torch_distributed_timeout_s)
        )
        self.env_runners = make_actor_group(
            DDPPOWorker,
            res.num_workers,
            lambda i: ((cfg, i), {}),
            remote=True,
            resources=self.actor_resources(
                "DD-PPO worker", num_gpus=res.num_gpus_per_worker, request_timeout_s=timeout
            ),
            name="DD-PPO worker",
            about=f"env {cfg.env_name()}",
        )
        return self.env_runners

    # ---- state ------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), **self.runner.sync_state(), "num_regroups": self.runner.num_regroups}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # the driver's copy of the policy, which started workers take
        self.runner.restore(int(state["rounds"]), int(state.get("num_regroups", 0)))

    def stop(self) -> None:
        self.runner.stop()  # the workers are the rollout actors: stopped once, here
        self.env_runners = None
        super().stop()
