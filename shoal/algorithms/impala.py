"""IMPALA: asynchronous sampling, V-trace, a background learner thread.

Reads in order: config, loss, training_step. The asynchronous machinery (sequences from the
rollout actors, the learner thread, train-batch assembly, weight broadcasts) is written as
functions here so that APPO reuses them without subclassing IMPALA.

Rollout actors return their fragments time-major, one sequence of ``T =
rollout_fragment_length`` steps per env, laid out sequence after sequence (rows = sequences
x T, including the masked autoreset rows). The loss views each column as ``(T, sequences)``
again, recomputes values with the current network and runs V-trace over it
(:mod:`shoal.learn.vtrace` explains how reset rows, termination and truncation are handled).
"""

from __future__ import annotations

import functools
import queue
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from pydantic import Field, model_validator

from shoal.algorithms.base import Algorithm
from shoal.batch import Batch, Col
from shoal.config import AlgorithmConfig
from shoal.learn import Learner, resolve_device
from shoal.learn.vtrace import VTraceReturns, vtrace
from shoal.models import build_actor_critic
from shoal.rollout import ActorCriticPolicy, Fragment
from shoal.logging.metrics import Phase

DEFAULT_FRAGMENT_LENGTH = 50
WAIT_S = 0.02  # longest a training step blocks on sample results or learner results


# ---- config -----------------------------------------------------------------------------
class IMPALAConfig(AlgorithmConfig):
    algo = "impala"

    lr: float = Field(5e-4, gt=0)
    min_time_s_per_iteration: float = Field(1.0, ge=0, description="Asynchronous steps are short: report about once a second.")
    train_batch_size: int = Field(500, ge=1, description="Rows (env steps, whole sequences) per learner update.")
    vtrace_clip_rho_threshold: Optional[float] = Field(1.0, gt=0, description="V-trace rho-bar; None disables the clip.")
    vtrace_clip_pg_rho_threshold: Optional[float] = Field(1.0, gt=0, description="V-trace pg-rho-bar; None disables the clip.")
    vtrace_lambda: float = Field(1.0, gt=0, le=1, description="V-trace's lambda: scales the traces c_t (1: the paper's main form).")
    vf_loss_coeff: float = Field(0.5, ge=0)
    entropy_coeff: float = Field(0.01, ge=0)
    num_sgd_iter: int = Field(1, ge=1, description="Times the learner learns on each train batch.")
    minibatch_buffer_size: int = Field(1, ge=1, description="Train batches in the learner's ring; they are learned interleaved.")
    learner_queue_size: int = Field(16, ge=1, description="Train batches waiting for the learner; a full queue drops new ones.")
    learner_queue_timeout: float = Field(300.0, gt=0, description="Seconds the learner may wait for a batch before train() fails.")
    max_requests_in_flight_per_worker: int = Field(2, ge=1, description="Sample requests kept open per rollout actor.")
    broadcast_interval: int = Field(1, ge=1, description="Learner updates between weight broadcasts to the rollout actors.")
    num_learner_devices: Optional[int] = Field(
        None, ge=1, description="Devices the learner splits each batch over; None: one per GPU in resources.num_gpus (at least 1).")
    fake_devices: bool = Field(False, description="Run the learner devices as CPU stand-ins (tests, machines without GPUs).")
    num_multi_gpu_tower_stacks: int = Field(1, ge=1, description="Multi-device learner: batches preloaded onto the devices.")
    num_data_load_threads: int = Field(1, ge=1, description="Multi-device learner: threads that preload the stacks.")

    @model_validator(mode="after")
    def _check(self):
        T = self.fragment_length()
        if self.train_batch_size % T:
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) must be a multiple of rollout_fragment_length ({T}): "
                "the learner trains on whole sequences")
        n = self.num_devices()
        gpus = self.resources.num_gpus
        if n > 1 and not self.fake_devices and n > int(gpus):
            raise ValueError(
                f"num_learner_devices ({n}) needs as many GPUs but resources.num_gpus is {gpus:g}; "
                "set fake_devices=true to run the devices on the CPU")
        if (self.train_batch_size // T) % n:
            raise ValueError(
                f"train_batch_size ({self.train_batch_size}) holds {self.train_batch_size // T} sequences of {T} steps, "
                f"which do not divide evenly over {n} learner devices")
        if self.multi_device() and self.minibatch_buffer_size != 1:
            raise ValueError(f"minibatch_buffer_size ({self.minibatch_buffer_size}) is a setting of the single-device "
                             "learner thread; the multi-device learner (several devices, or a GPU) preloads "
                             "num_multi_gpu_tower_stacks stacks instead: leave it at 1")
        stacks = {k: getattr(self, k) for k in ("num_multi_gpu_tower_stacks", "num_data_load_threads") if getattr(self, k) != 1}
        if stacks and not self.multi_device():
            raise ValueError(f"{', '.join(f'{k} ({v})' for k, v in stacks.items())}: settings of the multi-device learner, "
                             "which runs only with several devices or a GPU (num_learner_devices, resources.num_gpus); "
                             "the single-device learner thread uses minibatch_buffer_size instead")
        return self

    def multi_device(self) -> bool:
        """Whether the learner is the multi-device one (several devices, or one GPU)."""
        devices = self.learner_devices()
        return len(devices) > 1 or devices[0] != "cpu"

    def fragment_length(self) -> int:
        """Steps per env per sample request: the V-trace sequence length T."""
        return self.rollout_fragment_length if isinstance(self.rollout_fragment_length, int) else DEFAULT_FRAGMENT_LENGTH

    def num_devices(self) -> int:
        return self.num_learner_devices or max(1, int(self.resources.num_gpus))

    def learner_devices(self) -> list[str]:
        n = self.num_devices()
        if self.fake_devices or self.resources.num_gpus <= 0:
            return ["cpu"] * n
        return [f"cuda:{i}" for i in range(n)]


# ---- loss -------------------------------------------------------------------------------
def sequence_postprocess(fragment: Fragment) -> Batch:
    """Worker-side: keep every step (reset rows masked by VALID), one env's T steps after another."""
    def seq(x: np.ndarray) -> np.ndarray:
        x = np.swapaxes(x, 0, 1)
        return x.reshape(-1, *x.shape[2:])

    return Batch({
        Col.OBS: seq(fragment.obs[:-1]),
        Col.NEXT_OBS: seq(fragment.obs[1:]),
        Col.ACTIONS: seq(fragment.actions),
        Col.ACTION_LOGP: seq(fragment.extras[Col.ACTION_LOGP]),
        Col.REWARDS: seq(fragment.rewards),
        Col.TERMINATEDS: seq(fragment.terminateds),
        Col.VALID: seq(fragment.valid),
    })


def time_major(x: torch.Tensor, T: int) -> torch.Tensor:
    """Rows laid out sequence after sequence -> (T, sequences, ...)."""
    return x.reshape(-1, T, *x.shape[1:]).transpose(0, 1)


@dataclass
class Unroll:
    """The current network over a batch of sequences, time-major (T, B)."""

    dist: Any  # action distribution over the flat rows
    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor
    bootstrap: torch.Tensor  # (B,) value of the observation after each sequence
    behaviour_logp: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor  # gamma, or 0 where the episode terminated
    valid: torch.Tensor


def unroll(module, batch: dict, T: int, gamma: float) -> Unroll:
    inputs, values = module(batch[Col.OBS])
    dist = module.dist_cls(inputs)
    last_next_obs = time_major(batch[Col.NEXT_OBS], T)[-1]
    return Unroll(
        dist=dist,
        logp=time_major(dist.logp(batch[Col.ACTIONS]), T),
        entropy=time_major(dist.entropy(), T),
        values=time_major(values, T),
        bootstrap=module.value(last_next_obs),
        behaviour_logp=time_major(batch[Col.ACTION_LOGP], T),
        rewards=time_major(batch[Col.REWARDS], T),
        discounts=gamma * (1.0 - time_major(batch[Col.TERMINATEDS], T).float()),
        valid=time_major(batch[Col.VALID], T),
    )


def vtrace_for(u: Unroll, target_logp: torch.Tensor, config: IMPALAConfig) -> VTraceReturns:
    """V-trace with ``target_logp`` as the target policy (the current network for IMPALA)."""
    return vtrace(target_logp.detach() - u.behaviour_logp, u.discounts, u.rewards, u.values.detach(), u.bootstrap.detach(),
                  u.valid, clip_rho_threshold=config.vtrace_clip_rho_threshold,
                  clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold, lambda_=config.vtrace_lambda)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def impala_loss_terms(logp, entropy, values, vs, pg_advantages, valid, *, vf_loss_coeff: float,
                      entropy_coeff: float) -> dict[str, torch.Tensor]:
    """The IMPALA objective (means over the valid steps); ``total_loss`` is minimised.

    policy_loss = -mean(logp * A)           A: V-trace pg advantages
    vf_loss     = 0.5 * mean((V - vs)^2)    vs: V-trace targets
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(H)
    """
    policy_loss = -masked_mean(logp * pg_advantages, valid)
    vf_loss, mean_entropy = value_and_entropy(values, vs, entropy, valid)
    total = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    return {"total_loss": total, "policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": mean_entropy}


def value_and_entropy(values, vs, entropy, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * mean((V - vs)^2)`` and ``mean(H)`` over the valid steps."""
    return 0.5 * masked_mean((values - vs).pow(2), valid), masked_mean(entropy, valid)


def impala_loss(module, batch: dict, learner: Learner, config: IMPALAConfig) -> tuple[torch.Tensor, dict]:
    u = unroll(module, batch, config.fragment_length(), config.gamma)
    vt = vtrace_for(u, u.logp, config)
    terms = impala_loss_terms(u.logp, u.entropy, u.values, vt.vs, vt.pg_advantages, u.valid,
                              vf_loss_coeff=config.vf_loss_coeff, entropy_coeff=config.entropy_coeff)
    loss = terms.pop("total_loss")
    stats = {k: v.detach() for k, v in terms.items()}
    stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
    return loss, stats


# ---- the asynchronous machinery (shared with APPO) -----------------------------------------
def make_learner_thread(learner: Learner, config: IMPALAConfig):
    """A LearnerThread, or the multi-device one when the config names several devices or a GPU."""
    devices = config.learner_devices()
    if config.multi_device():
        from shoal.learn.multi_device import MultiDeviceLearnerThread

        return MultiDeviceLearnerThread(
            learner, devices, num_multi_gpu_tower_stacks=config.num_multi_gpu_tower_stacks,
            num_data_load_threads=config.num_data_load_threads, num_sgd_iter=config.num_sgd_iter,
            learner_queue_size=config.learner_queue_size, learner_queue_timeout=config.learner_queue_timeout,
            rows_per_unit=config.fragment_length())
    from shoal.learn.learner_thread import LearnerThread

    return LearnerThread(learner, learner_queue_size=config.learner_queue_size,
                         minibatch_buffer_size=config.minibatch_buffer_size, num_sgd_iter=config.num_sgd_iter,
                         learner_queue_timeout=config.learner_queue_timeout)


def setup_async(algo: Algorithm, loss_fn) -> None:
    """Learner, learner thread (started by the first training step) and rollout actors."""
    cfg: IMPALAConfig = algo.config
    algo.policy_cls = ActorCriticPolicy
    if not cfg.fake_devices:
        resolve_device(cfg.resources.num_gpus)  # a clear ConfigError when GPUs are asked for but absent
    module = build_actor_critic(algo.env_info.observation_space, algo.env_info.action_space, cfg.model)
    algo.learner = Learner(module, functools.partial(loss_fn, config=cfg), lr=cfg.lr, grad_clip=cfg.grad_clip,
                           lr_schedule=cfg.lr_schedule, device=cfg.learner_devices()[0])
    algo.thread = make_learner_thread(algo.learner, cfg)
    algo.pending, algo.pending_rows = [], 0  # sequences waiting to fill a train batch
    algo.broadcast_at = 0  # thread.num_updates at the last broadcast
    algo.num_dropped_batches = 0
    algo.learner_info = {}  # the mean info of the last results drained from the thread (a report)
    algo.num_learner_results = 0  # train batches the learner has finished
    algo.env_runners = algo.make_env_runners(ActorCriticPolicy, sequence_postprocess, cfg.fragment_length(),
                                             max_in_flight=cfg.max_requests_in_flight_per_worker)
    algo.broadcast_weights()


def take_train_batches(algo: Algorithm, batches: list[Batch]) -> list[Batch]:
    """Queue sampled sequences; cut off every full train batch (whole sequences: sizes are multiples of T)."""
    size = algo.config.train_batch_size
    algo.pending.extend(batches)
    algo.pending_rows += sum(len(b) for b in batches)
    out = []
    while algo.pending_rows >= size:
        joined = Batch.concat(algo.pending)
        out.append(joined.slice(0, size))
        rest = joined.slice(size, len(joined))
        algo.pending, algo.pending_rows = ([rest] if len(rest) else []), len(rest)
    return out


def drain_learner(algo: Algorithm, wait_s: float = 0.0) -> list[dict[str, float]]:
    """Count what the learner finished (waiting up to ``wait_s`` for a first result); the new
    results' infos, one per train batch, oldest first (empty when nothing finished now).

    ``algo.learner_info`` keeps the mean over the latest results, so every result row carries
    the same ``learner/...`` keys once learning began; it is a report, never an input: a
    post-update step (APPO's KL adaptation) must run once per info returned here.
    """
    infos = []
    while True:
        try:
            env_steps, _, info = algo.thread.outqueue.get(timeout=wait_s) if wait_s > 0 else algo.thread.outqueue.get_nowait()
        except queue.Empty:
            break
        wait_s = 0.0
        algo.counters["env_steps_trained"] += env_steps
        infos.append(info)
    if infos:
        algo.num_learner_results += len(infos)
        algo.learner_info = {f"learner/{k}": float(np.mean([i[k] for i in infos if k in i])) for k in infos[0]}
    return infos


def async_training_step(algo: Algorithm, on_learner_result: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Sample (K requests in flight per actor), queue train batches, drain the learner, broadcast.

    ``on_learner_result(info)`` runs once per train batch the learner finished (a post-update
    step such as APPO's KL adaptation), never on a step that drained nothing.
    """
    cfg: IMPALAConfig = algo.config
    if algo.thread.ident is None:
        algo.thread.start()
    with algo.timers.time(Phase.SAMPLE):
        if not algo.thread.inqueue.full():  # back-pressure: no new requests while the learner is behind
            algo.env_runners.submit("sample")
        ready = [r for _, r in algo.env_runners.fetch_ready(timeout_s=WAIT_S)]
        algo.record_rollouts([m for _, m in ready])
    with algo.timers.time(Phase.ENQUEUE):
        algo.learner.set_env_steps(algo.counters["env_steps_sampled"])
        for batch in take_train_batches(algo, [b for b, _ in ready]):
            if not algo.thread.add(batch, env_steps=int(batch[Col.VALID].sum())):
                algo.num_dropped_batches += 1
    with algo.timers.time(Phase.DRAIN):
        for info in drain_learner(algo, wait_s=0.0 if ready else WAIT_S):  # nothing sampled: wait here, do not spin
            if on_learner_result is not None:
                on_learner_result(info)
    with algo.timers.time(Phase.SYNC):
        if algo.thread.num_updates - algo.broadcast_at >= cfg.broadcast_interval:
            algo.broadcast_at = algo.thread.num_updates
            algo.broadcast_weights()
    algo.thread.check()
    return {**algo.learner_info, "num_dropped_batches": algo.num_dropped_batches,
            "num_learner_results": algo.num_learner_results}


def async_state(algo: Algorithm) -> dict[str, Any]:
    with algo.thread.lock:
        return {"learner": algo.learner.get_state()}


def set_async_state(algo: Algorithm, state: dict[str, Any]) -> None:
    with algo.thread.lock:
        algo.learner.set_state(state["learner"])
    algo.broadcast_weights()


# ---- algorithm --------------------------------------------------------------------------
class IMPALA(Algorithm):
    config_cls = IMPALAConfig

    def setup(self) -> None:
        setup_async(self, impala_loss)

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.thread.get_weights()

    def training_step(self) -> dict[str, Any]:
        return async_training_step(self)

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), **async_state(self)}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        set_async_state(self, state)

    def stop(self) -> None:
        self.thread.stop()
        super().stop()
