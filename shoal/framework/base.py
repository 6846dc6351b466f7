"""Algorithm: the shared iteration loop, metrics, evaluation, checkpoints and rollout actors.

Subclasses implement ``setup()`` (learner, rollout actors) and ``training_step()`` (the
visible execution plan) plus ``get_state``/``set_state`` for anything they add.
"""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from shoal import checkpoint as ckpt
from shoal.callbacks import Callbacks, aggregate_custom, build_callbacks
from shoal.config import AlgorithmConfig
from shoal.errors import CheckpointError, ConfigError, DivergenceError
from shoal.framework import multi_agent
from shoal.framework.checkpointing import checkpoint_meta, rebuild, restore_into, saved_norm_stats
from shoal.framework.config_changes import apply_config_changes
from shoal.framework.env_checks import describe_gym_env, describe_within_time_limit, naming_env, normalization_stats
from shoal.framework.evaluator import Evaluator
from shoal.framework.inference import DriverPredictor
from shoal.framework.multi_agent import Agents
from shoal.framework.policies import BuildLearner, PolicySet
from shoal.framework.rollout_group import base_resource_plan, rollout_group
from shoal.framework.weights_publisher import WeightsPublisher
from shoal.logging.metrics import EpisodeWindow, Timers
from shoal.process import configure_process
from shoal.rollout.env_runner import EnvRunner, RolloutMetrics
from shoal.rollout.multi_agent import MultiAgentRolloutMetrics, PolicyReturnWindows
from shoal.runtime import ActorResources
from shoal.runtime.deadline import DeadlineReached
from shoal.runtime.placement import BundleGroup, RunPlacement

COUNTERS = ("env_steps_sampled", "env_steps_trained", "time_total_s", "num_env_failures", "agent_steps_sampled")


def _reports_to_callbacks(train):
    """Wrap an algorithm's ``train()`` so that ``callbacks.on_train_result`` sees the finished result:
    once per iteration, after the outermost override (which adds its keys after ``super().train()``)."""

    @functools.wraps(train)
    def wrapper(self):
        self._train_depth = getattr(self, "_train_depth", 0) + 1
        try:
            result = train(self)
        finally:
            self._train_depth -= 1
        if self._train_depth == 0:
            self.callbacks.on_train_result(self, result)
        return result

    wrapper.reports_to_callbacks = True
    return wrapper


class Algorithm:
    """A built algorithm (``config.build()``): trains one iteration per ``train()``, evaluates,
    predicts, saves and restores. Rollout actors start on the first ``train()``; ``stop()`` (or
    leaving a ``with`` block) stops them. Subclasses implement ``setup`` and ``training_step``."""

    config_cls: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    """The config this algorithm takes. A subclass that sets it becomes that config class's
    ``algorithm_cls``, what its ``build()`` makes; one that inherits it (a variant of an
    algorithm) leaves the config building its parent."""

    best_metric: str = "episode_return_mean"
    """The result key that picks a run's ``checkpoints/best`` (what ``shoal evaluate RUN_DIR`` loads).

    The mean return suits single-agent training. In a zero-sum self-play league it stays near
    0 however well the players play, so a league names a figure that grows with skill instead
    (e.g. main's win rate against a fixed opponent). Iterations whose result lacks the key,
    or holds NaN, never become the best."""
    policy_cls: ClassVar[type | None] = None
    """The inference policy rollout actors, evaluation and ``predict`` build
    (``policy_cls(obs_space, action_space, config, seed)``); None for an algorithm without a
    single-agent policy (the league, the multi-agent form)."""
    best_metric_mode: str = "max"
    """``"max"``: higher values of ``best_metric`` are better; ``"min"``: lower ones (e.g. a
    time to reach a goal)."""
    evaluator_cls: ClassVar[type[Evaluator]] = Evaluator  # what evaluate() asks
    is_league: ClassVar[bool] = False
    """A league (``AlphaStar``): its policies are named players (``self.policies``, whose learners
    run elsewhere), its rollout actors play its matches (``multi_agent_runner_args``),
    ``shoal.load_policy(policy=...)`` picks one, and ``shoal evaluate`` plays its ``main``. The
    app reads this, never the algorithm's name."""
    result_keys: ClassVar[tuple[str, ...]] = (
        *("iteration", "env_steps_sampled", "env_steps_trained", "time_this_iter_s", "time_total_s"),
        *("episode_return_mean", "episode_return_min", "episode_return_max", "episode_len_mean", "episodes_total"),
        *("env_steps_per_s", "env_steps_trained_per_s", "num_worker_restarts", "num_worker_timeouts"),
        *("num_dropped_requests", "num_nonfinite_updates_skipped", "num_env_failures", "num_eval_worker_restarts"),
        "agent_steps_sampled",  # multi-agent runs
    )
    """The result keys without a ``/`` this algorithm's ``train()`` may report (those with one are
    families: ``learner/...``, ``evaluation/...``, ``custom/...``, ``timers/...``). A subclass that
    adds some lists them after its parent's: ``shoal tune`` checks its ``metric`` against them
    before Ray starts."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_cls" in cls.__dict__:
            cls.config_cls.algorithm_cls = cls
        if not getattr(cls.train, "reports_to_callbacks", False):  # a train() of its own (or of a mixin)
            cls.train = _reports_to_callbacks(cls.train)  # type: ignore[method-assign]

    def __init__(self, config: AlgorithmConfig) -> None:
        if not isinstance(config, self.config_cls):
            raise ConfigError(f"{type(self).__name__} needs a {self.config_cls.__name__}, got {type(config).__name__}.")
        self.config = config
        configure_process(config.resources)
        seed = config.seed
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.agents: Agents | None = None  # a multi_agent section's env: its agents and their spaces
        self.policies: PolicySet | None = None  # what setup() builds, for the algorithms that train by policy
        self.policy_returns = PolicyReturnWindows(100)  # per policy, with a multi_agent section
        self.env_info = describe_within_time_limit(config, self.describe_env)  # fails early on a bad env
        # defaults that depend on the env's spaces (PPO's for Box actions), for the keys left unset
        if self.env_info is not None:  # a league describes its game itself
            config = self.config = config.for_env(self.env_info.observation_space, self.env_info.action_space)
        self.norm_stats = normalization_stats(config, self.env_info, self.is_multi_agent)  # merged from the actors
        self.iteration = 0
        self.counters: dict[str, float] = {k: 0 for k in COUNTERS}
        self.episodes = EpisodeWindow(self.config.episode_window)
        self.callbacks: Callbacks = build_callbacks(config.callbacks) or Callbacks()  # the driver's instance
        self.custom_metrics: list[dict[str, float]] = []  # on_episode_end's, since the last result
        self.timers = Timers()
        self.env_runners: Any = None  # the rollout actor group (LazyActorGroup), made by setup()
        self.evaluator = self.evaluator_cls(self)
        self._predictor = DriverPredictor(self)
        self.publisher = WeightsPublisher(lambda: self.env_runners)  # the rollout actors' weights, one owner
        self.placement = RunPlacement(
            self.resource_plan(config), what=f"This {config.algo} run", wait_s=config.resources.resource_wait_s
        )
        with naming_env(config):
            self.setup()

    # ---- for subclasses -------------------------------------------------------------------
    @property
    def is_multi_agent(self) -> bool:
        """Whether the config has a ``multi_agent`` section (a PettingZoo env, several policies)."""
        return getattr(self.config, "multi_agent", None) is not None

    def describe_env(self):
        """The env's spaces and spec facts: a Gymnasium env's, or with a ``multi_agent`` section
        the first agent's (``self.agents`` holds them all). A league checks its own env instead."""
        if self.is_multi_agent:
            self.agents = Agents.describe(self.config)
            return self.agents.env_info()
        return describe_gym_env(self.config)

    def setup(self) -> None:
        raise NotImplementedError

    def build_policies(self, build: BuildLearner) -> PolicySet:
        """The policies this run trains, ``build(config, obs_space, action_space, seed)`` making each
        one's learner: the env's one policy, or every policy of a ``multi_agent`` section."""
        if self.is_multi_agent:
            return PolicySet.for_agents(self.config, self.agents, build)
        info = self.env_info
        return PolicySet.single(self.config, build(self.config, info.observation_space, info.action_space, None))

    # ---- resources ------------------------------------------------------------------------
    @classmethod
    def resource_plan(cls, config: AlgorithmConfig) -> list[BundleGroup]:
        """What a run needs, one bundle per actor: the driver, then each named group of Ray actors.

        The run reserves one placement group for all the actor bundles when its first actor starts
        (a Tune trial asks for the driver's bundle too, as its head). A subclass adds its own
        groups (Ape-X: replay shards); with ``num_workers=0`` nothing remote is planned.
        """
        return base_resource_plan(config)

    def actor_resources(self, name: str, **changes: Any) -> ActorResources:
        """What each actor of the planned group ``name`` reserves: its bundles in the run's placement
        group (reserved now, for the whole run, if this is the first group to start)."""
        from shoal import runtime

        res = self.config.resources
        runtime.start(res.address)
        return ActorResources.of_workers(res, placement=self.placement.slot(name), **changes)

    def training_step(self) -> dict[str, Any]:
        """One pass of the execution plan; returns metrics for this step."""
        raise NotImplementedError

    def get_weights(self) -> dict[str, Any]:
        """The current policy's weights as numpy arrays, by parameter name (what actors receive);
        with several policies, those of each by policy id."""
        if self.policies is None:
            raise NotImplementedError
        return self.policies.get_weights()

    def make_env_runners(
        self, policy_cls, postprocess, fragment_length: int, *, max_in_flight: int = 1, runner_cls: type = EnvRunner
    ):
        """The rollout actors: in the driver (``num_workers=0``, one runner index 0) or on Ray.

        ``max_in_flight`` bounds the asynchronous requests per actor; ``runner_cls`` is an
        EnvRunner subclass for algorithms whose actors do more (e.g. Ape-X's push to replay).
        The env kind picks the runner: with a ``multi_agent`` section it is the
        :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner`, which cuts sequences per policy
        (``policy_cls``, ``postprocess`` and ``fragment_length`` are then the section's); a
        league's is its own subclass of it (``runner_cls``). Either is built from
        ``multi_agent_runner_args(index)``.
        A recreated actor gets the last broadcast weights and whatever ``self.restart_calls()`` adds.

        The group is lazy (:class:`~shoal.runtime.lazy.LazyActorGroup`): the actors, and Ray,
        start with the first call that needs them (``start_actors()``, the first ``train()``),
        so an algorithm restored only to evaluate or save starts neither; they start with the
        latest weights broadcast and the state ``on_restart`` gives a recreated actor.
        """
        return rollout_group(
            self, policy_cls, postprocess, fragment_length, max_in_flight=max_in_flight, runner_cls=runner_cls
        )

    def multi_agent_runner_args(self, index: int):
        """A multi-agent rollout actor's ``(args, kwargs)``: every policy with its current weights."""
        assert self.agents is not None and self.policies is not None, "a multi_agent run describes its agents first"
        weights = self.get_weights()
        return self.agents.runner_args(self.config, index, weights.__getitem__, list(self.policies.trained))

    def start_actors(self) -> None:
        """Create the rollout actors now rather than on the first call that needs them.

        ``train()`` calls it before its clock starts, so iteration times leave out starting Ray
        and the actors; ``shoal.train`` calls it before writing the run directory, so a cluster
        too small for the run fails before anything is written.
        """
        if self.env_runners is not None:
            self.env_runners.start()

    def normalizer_calls(self) -> list[tuple[str, tuple]]:
        return [] if self.norm_stats is None else [("set_normalizer", (self.norm_stats.get_state(),))]

    def nonfinite_updates_skipped(self) -> int:
        """Learner updates skipped over the run for a NaN/inf loss or gradient (the result's
        ``num_nonfinite_updates_skipped``); the policies' learners, or the driver's ``self.learner``."""
        if self.policies is not None:
            return self.policies.nonfinite_skipped()
        learner = getattr(self, "learner", None)
        return int(getattr(learner, "num_nonfinite_skipped", 0))

    def restart_calls(self) -> list[tuple[str, tuple]]:
        """Extra (method, args) calls that re-sync a recreated rollout actor (global vars, replay shards...)."""
        return []

    def display_metrics(self) -> list[tuple[str, str]]:
        """The learner figures the live display shows beside the headline (``best_metric``):
        ``(result key, label)`` pairs. The default fits policy-gradient learners; an algorithm
        whose learner reports other figures overrides it. A key missing from a result shows "-"."""
        return [("learner/policy_loss", "policy_loss"), ("learner/vf_loss", "vf_loss"), ("learner/entropy", "entropy")]

    def samples_when_evaluated(self) -> bool:
        """Whether ``shoal evaluate`` samples this algorithm's actions unless told ``--greedy``
        (the default: greedy; a league on an OpenSpiel game samples, see ``AlphaStar``)."""
        return False

    def summary_lines(self, results: list[dict[str, Any]]) -> list[str]:
        """What a run's closing summary says of ``results`` (this session's iterations) when the
        mean return says little: the first line takes its place in the opening line ("Stopped on
        time: <it> after ... env steps"), the others follow. Empty (the default): the mean return."""
        return []

    def log_tensorboard_extras(self, writer, step: int) -> None:
        """Write what a result dict cannot hold (tables, images) to TensorBoard; nothing by default.

        The trainer calls it after each scheduled checkpoint (every ``checkpoint_every``
        iterations and at the stop) with the run's ``SummaryWriter`` and the env steps sampled
        so far as ``step``; a league adds its tables and win-rate heatmap.
        """

    def broadcast_weights(self) -> None:
        """Publish the current weights (one object-store put; the normalizer's merged statistics
        travel with them) and send them to every rollout actor (``self.publisher``)."""
        self.publish_weights()
        self.publisher.send()

    def publish_weights(self) -> Any:
        """A new version of the rollout actors' weights in ``self.publisher``, not yet delivered;
        returns the weights' reference. An algorithm delivers it its own way (all at once,
        with each actor's next request, or to the stale actors)."""
        return self.publisher.publish_weights(self.get_weights(), self.normalizer_calls())

    def record_rollouts(self, metrics: list[RolloutMetrics]) -> int:
        steps = 0
        for m in metrics:
            steps += m.env_steps
            self.episodes.add(m.episode_returns, m.episode_lengths)
            if self.norm_stats is not None and m.normalizer_new is not None:
                self.norm_stats.merge(m.normalizer_new)
            self.custom_metrics.extend(m.custom_metrics)
            self.counters["num_env_failures"] += getattr(m, "env_failures", 0)
            if self.is_multi_agent and isinstance(m, MultiAgentRolloutMetrics):  # env_steps: env copies' steps
                self.policy_returns.add(m)
                self.counters["agent_steps_sampled"] += m.agent_steps
        self.counters["env_steps_sampled"] += steps
        return steps

    # ---- the iteration ------------------------------------------------------------------
    @_reports_to_callbacks
    def train(self) -> dict[str, Any]:
        """Run ``training_step()`` until the per-iteration minimums are met; one result dict."""
        cfg = self.config
        self.start_actors()
        t0 = time.perf_counter()
        sampled0 = self.counters["env_steps_sampled"]
        trained0 = self.counters["env_steps_trained"]
        step_metrics: dict[str, Any] = {}
        while True:
            try:
                step_metrics.update(self.training_step())
            except DivergenceError as e:
                raise e.at_iteration(self.iteration + 1) from None
            except DeadlineReached:  # the run's time ran out in a wait on actors: that time counts
                self.counters["time_total_s"] += time.perf_counter() - t0
                raise
            elapsed = time.perf_counter() - t0
            if (
                elapsed >= cfg.min_time_s_per_iteration
                and self.counters["env_steps_sampled"] - sampled0 >= cfg.min_env_steps_per_iteration
            ):
                break
        self.iteration += 1
        self.counters["time_total_s"] += elapsed
        result = self._iteration_result(
            elapsed,
            self.counters["env_steps_sampled"] - sampled0,
            self.counters["env_steps_trained"] - trained0,
            step_metrics,
        )
        self.custom_metrics = []
        ev = cfg.evaluation
        if ev.evaluation_interval and self.iteration % ev.evaluation_interval == 0:
            evaluation = self.evaluate()
            self.callbacks.on_evaluate(self, evaluation)
            result.update({f"evaluation/{k}": v for k, v in evaluation.items()})
        result["num_eval_worker_restarts"] = self.evaluator.num_restarts
        return result

    def _iteration_result(
        self, elapsed: float, sampled: float, trained: float, step_metrics: dict[str, Any]
    ) -> dict[str, Any]:
        """The result of the iteration that just ended: counters, episode figures, rates, actor
        faults, the training step's metrics, phase timers, custom metrics, per-policy returns."""
        groups = self.env_runners
        return {
            "iteration": self.iteration,
            "env_steps_sampled": int(self.counters["env_steps_sampled"]),
            "env_steps_trained": int(self.counters["env_steps_trained"]),
            **self.episodes.metrics(),
            "time_this_iter_s": elapsed,
            "time_total_s": self.counters["time_total_s"],
            "env_steps_per_s": sampled / elapsed if elapsed > 0 else 0.0,
            "env_steps_trained_per_s": trained / elapsed if elapsed > 0 else 0.0,
            "num_worker_restarts": groups.num_restarts if groups is not None else 0,
            "num_worker_timeouts": groups.num_timeouts if groups is not None else 0,
            "num_dropped_requests": groups.num_dropped_requests if groups is not None else 0,
            "num_nonfinite_updates_skipped": self.nonfinite_updates_skipped(),
            "num_env_failures": int(self.counters["num_env_failures"]),
            **step_metrics,
            **self.timers.report(),
            **aggregate_custom(self.custom_metrics),
            **(
                {**self.policy_returns.metrics(), "agent_steps_sampled": int(self.counters["agent_steps_sampled"])}
                if self.is_multi_agent
                else {}
            ),
        }

    # ---- changing the config mid-run ------------------------------------------------------
    def update_config(self, changes: dict[str, Any]) -> None:
        """Apply ``{key: value}`` changes of ``config.mutable_keys`` to the running algorithm.

        The values are validated as the config would validate them; the learner's loss record
        is rebuilt from the changed config (:meth:`~shoal.learn.losses.LossRecord.with_config`)
        and swapped in before its next minibatch, the optimizer takes a new ``lr`` and
        ``grad_clip`` at once, an adaptive KL penalty its new ``kl_target``. Any other key is a ConfigError
        naming the keys that may change (what Tune's PBT may perturb).
        """
        apply_config_changes(self, changes)

    # ---- inference ----------------------------------------------------------------------
    def predict(
        self,
        obs,
        state: np.ndarray | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
        action_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Actions for observations, in the driver, with the current weights: ``(actions, state)``.

        ``obs`` is one observation or a batch of them. A recurrent policy takes ``state`` (None:
        the initial state; one row per observation) and returns the next one to pass back with
        the next observation; rows where ``episode_start`` is True start from the initial state.
        Without recurrence the returned state is None. ``deterministic=False`` samples the way
        training does at the current step: from the action distribution, or epsilon-greedy with
        the epsilon a DQN schedule gives after the env steps sampled so far. ``action_mask`` (bool
        or 0/1, one row per observation, as the env's ``info["action_mask"]``) keeps the actions
        among the legal ones; a Dict observation's own ``"action_mask"`` entry is read without it.
        """
        return self._predictor(obs, state, episode_start, deterministic, action_mask)

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The weights ``policy_cls`` acts with, from a checkpoint's state (``shoal.load_policy``
        builds the policy network alone from them): by default the learner's module."""
        return {k: v.numpy() for k, v in state["learner"]["module"].items()}

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, num_episodes: int | None = None, render: bool = False) -> dict[str, float]:
        """Greedy episodes with the current weights, on evaluation actors or in the driver
        (:class:`~shoal.framework.evaluator.Evaluator`). With a ``multi_agent`` section: on a
        separate runner in the driver, the mean return summed over agents, and per policy."""
        return self.evaluator.evaluate(num_episodes or self.config.evaluation.evaluation_num_episodes, render)

    def evaluation_episodes(self, n: int, explore: bool = False):
        """With a ``multi_agent`` section: at least ``n`` episodes in the driver, greedy unless
        ``explore``; their returns (summed over agents), lengths, and per-policy returns."""
        if not self.is_multi_agent:
            raise ConfigError(
                f"{type(self).__name__}.evaluation_episodes plays a multi_agent section's policies; "
                "use evaluate() for a single-agent run"
            )
        args, kwargs = self.multi_agent_runner_args(0)
        return multi_agent.evaluation_episodes(args, kwargs, n, explore)

    # ---- state and checkpoints ----------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "counters": {k: float(v) for k, v in self.counters.items()},
            "episodes": self.episodes.get_state(),
            **({"normalize": self.norm_stats.get_state()} if self.norm_stats is not None else {}),
            **(self.policies.get_state() if self.policies is not None else {}),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        self.counters.update({k: state["counters"][k] for k in COUNTERS if k in state["counters"]})
        self.episodes.set_state(state["episodes"])
        if self.policies is not None:
            self.policies.set_state(state)
        if self.norm_stats is not None:
            self.norm_stats = saved_norm_stats(state)
            for method, args in self.normalizer_calls():  # actors started (or to start) before the restore
                if self.env_runners is not None:
                    self.env_runners.foreach(method, *args, wait=False)
            self.evaluator.send_normalizer()

    def checkpoint_meta(self, **extra: Any) -> dict[str, Any]:
        """meta.json content (:func:`~shoal.framework.checkpointing.checkpoint_meta`)."""
        return checkpoint_meta(self, **extra)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory atomically; returns its path."""
        return ckpt.save_checkpoint(path, self.get_state(), self.checkpoint_meta())

    def restore(self, path: str | Path | ckpt.OpenedCheckpoint) -> None:
        """Load a checkpoint of this algorithm into this instance (weights, optimizer state, counters)."""
        restore_into(self, path)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | ckpt.OpenedCheckpoint,
        overrides: dict[str, Any] | None = None,
        trust: bool = False,
        **config_kwargs: Any,
    ) -> "Algorithm":
        """Rebuild the algorithm a checkpoint was written by, and restore its state.

        ``path``: a checkpoint, a run directory (its latest checkpoint), or a checkpoint opened by
        :func:`shoal.checkpoint.open_checkpoint` (not read again here).
        ``overrides`` is a nested dict merged into the saved config (e.g. fewer workers);
        ``config_kwargs`` replace top-level keys, e.g. ``env=my_callable`` for an env that
        was a lambda and has no import path.

        Code the checkpoint names by import path (an env factory, a custom model, callbacks...)
        is imported only when the checkpoint is signed with your key (you wrote it on this
        machine), when you give that key again, or with ``trust=True``: see :mod:`shoal.trust`.
        """
        opened = ckpt.open_checkpoint(path)
        algo, name = rebuild(opened, {**(overrides or {}), **config_kwargs}, trust)
        if cls is not Algorithm and not isinstance(algo, cls):
            raise CheckpointError(f"Checkpoint '{opened.path}' holds a '{name}' run, not {cls.__name__}.")
        algo.restore(opened)
        return algo

    def stop(self) -> None:
        if self.env_runners is not None:
            self.env_runners.stop()
        self.env_runners = None
        self.evaluator.stop()
        self.placement.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
