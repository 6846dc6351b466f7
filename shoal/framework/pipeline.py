"""AsyncPipeline: the asynchronous data path of IMPALA and APPO, and the state it owns.

    rollout actors --sample()--> sequences --enqueue()--> train batches --> runner.submit
          ^                                                                     |
          +---------- broadcast_due() / broadcast_done() <-- drain() <-- runner.results

One object holds everything that lives between two training steps, so no algorithm keeps
pipeline state of its own and every field is written down here:

- the sample requests in flight (inside the rollout actor group: at most
  ``max_requests_in_flight_per_worker`` per actor);
- ``pending``: sampled sequences not yet cut into a train batch (whole sequences only), per
  policy when a ``multi_agent`` section trains several: each train batch holds one policy's
  sequences, and the batches cut in one step travel to the learner thread together as
  ``{policy_id: Batch}`` (its dict mode: one update step trains every policy present);
- ``ready``: train batches already cut that the learner's in-queue had no room for; they go
  first at the next step, and while ``max_ready`` (one sample result's worth) wait, no new
  sample request is sent (back-pressure): none is dropped, and the learner has work while
  the next result is sampled;
- the learner runner (:mod:`shoal.framework.runner`: a ``ThreadRunner``, or a ``GroupRunner`` for a
  learner group) and its thread with the in-queue (``thread.num_dropped`` counts offers a full
  queue refused: with ``ready`` in front, none from this pipeline); the runner runs each
  result's post-update phase (APPO's KL coefficient);
- ``learner_info``: the mean stats of the latest learner results (a report, never an input);
- ``num_learner_results``: train batches the learner has finished;
- the broadcast schedule: learner updates since the last weight broadcast.

The algorithm's ``training_step`` calls the phases in order (sample, enqueue, drain, sync)
and adds its own between them.
:class:`AsyncAlgorithm` is what both algorithms share around their ``training_step``: the
policies' learners behind one learner thread, this pipeline, and the thread's hold around
weights and state. The functions at the end build the parts it wires together: the learner,
its thread and the rollout actors that return sequences.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any, Optional

from shoal import runtime
from shoal.batch import Batch
from shoal.framework.base import Algorithm
from shoal.framework.learner_group import GroupLearner, LearnerGroup, LearnerGroups
from shoal.framework.policies import PolicySet, build_policy_module
from shoal.framework.runner import GroupRunner, ThreadRunner
from shoal.framework.weights_publisher import WeightsPublisher
from shoal.learn import resolve_device
from shoal.learn.policy_learner import MakeLoss, PolicyLearner
from shoal.learn.stats import mean_stats
from shoal.learn.threads import LearnerResult
from shoal.models import build_actor_critic
from shoal.rollout import ActorCriticPolicy
from shoal.rollout.postprocessing import sequence_postprocess
from shoal.runtime import make_actor_group
from shoal.runtime.placement import BundleGroup

WAIT_S = 0.02  # longest a training step blocks on sample results or learner results


class AsyncPipeline:
    def __init__(
        self,
        env_runners,
        runner: ThreadRunner | GroupRunner,
        *,
        train_batch_size: int,
        broadcast_interval: int,
        max_ready: int = 1,
        publisher: Optional[WeightsPublisher] = None,
    ) -> None:
        self.env_runners = env_runners
        # the weights go out with each actor's next sample request (WeightsPublisher.due): a broadcast
        # costs the driver nothing per actor, and a request at most one extra call
        self.publisher = publisher or WeightsPublisher(lambda: env_runners)
        self.runner = runner  # where the policies learn: train batches in, results out
        self.thread = runner.thread  # its learner thread (or learner group): queue room, update count
        self.single = runner.single_policy  # the one policy's id; None with several
        self.train_batch_size = train_batch_size
        self.broadcast_interval = broadcast_interval
        self.pending: dict[Any, list[Batch]] = defaultdict(list)  # policy id -> sequences
        self.pending_rows: dict[Any, int] = defaultdict(int)
        self.ready: deque[dict[Any, Batch]] = deque()  # train batches by policy the in-queue had no room for
        self.max_ready = max(1, int(max_ready))  # no sample request while this many wait in ready
        self.learner_info: dict[str, float] = {}
        self.num_learner_results = 0
        self.broadcast_at = 0  # thread.num_updates at the last broadcast

    @classmethod
    def from_config(
        cls, env_runners, runner: ThreadRunner, config, publisher: Optional[WeightsPublisher] = None
    ) -> "AsyncPipeline":
        rows = config.fragment_length() * config.resources.num_envs_per_worker  # one sample result's rows
        return cls(
            env_runners,
            runner,
            train_batch_size=config.train_batch_size,
            broadcast_interval=config.broadcast_interval,
            max_ready=-(-rows // config.train_batch_size),
            publisher=publisher,
        )

    # ---- the phases, in the order a training step calls them ------------------------------
    def sample(self) -> list[tuple[Batch, Any]]:
        """Keep sample requests open (none while ``max_ready`` cut train batches wait for room in
        the learner's queue: back-pressure) and return the (sequences, metrics) that are ready,
        waiting at most ``WAIT_S``."""
        if self.thread.ident is None:
            self.thread.start()
        if len(self.ready) < self.max_ready:
            self.env_runners.submit("sample", prelude=self.publisher.due)
        return [r for _, r in self.env_runners.fetch_ready(timeout_s=WAIT_S)]

    def enqueue(self, sampled: list[Any]) -> None:
        """Cut every full train batch off the pending sequences and hand the learner, oldest
        first, as many as its queue has room for; the rest wait in ``ready`` for the next step
        (``sampled``: a Batch per rollout result, or a ``{policy_id: Batch}`` with several policies)."""
        self.ready.extend(self._cut_train_batches(sampled))
        while self.ready and not self.thread.inqueue.full():  # the driver is the queue's only producer
            if not self.runner.submit(self.ready[0]):
                break  # not taken after all: it stays first in line
            self.ready.popleft()

    def drain(self, wait: bool) -> list[LearnerResult]:
        """The learner results finished since the last call, oldest first (waiting up to
        ``WAIT_S`` for one when ``wait``: a step that sampled nothing must not spin)."""
        results = self.runner.results(timeout_s=WAIT_S if wait else 0.0)
        if results:
            self.num_learner_results += len(results)
            self.learner_info = self._learner_info(results)
        return results

    def _learner_info(self, results: list[LearnerResult]) -> dict[str, float]:
        """The mean stats of ``results``: ``learner/<stat>``, or ``learner/<id>/<stat>`` with several policies."""
        by_policy: dict[Any, list[dict]] = defaultdict(list)
        for r in results:
            by_policy[r.policy_id].append(r.stats)
        out: dict[str, float] = {}
        for pid, stats in by_policy.items():
            out.update(mean_stats(stats, "learner/" if self.single is not None else f"learner/{pid}/"))
        return out

    def broadcast_due(self) -> bool:
        """Whether ``broadcast_interval`` learner updates happened since the last broadcast."""
        return self.thread.num_updates - self.broadcast_at >= self.broadcast_interval

    def broadcast_done(self) -> None:
        self.broadcast_at = self.thread.num_updates

    def check(self) -> None:
        """Raise here if the learner thread died."""
        self.thread.check()

    def metrics(self) -> dict[str, Any]:
        return {
            **self.learner_info,
            "num_dropped_batches": self.thread.num_dropped,
            "num_learner_results": self.num_learner_results,
            "learner_backlog": len(self.ready),
        }

    def _cut_train_batches(self, sampled: list[Any]) -> list[dict[Any, Batch]]:
        """Train batches, each a ``{policy_id: Batch}`` of the policies whose turn it is."""
        for item in sampled:
            for pid, batch in item.items() if isinstance(item, dict) else [(self.single, item)]:
                self.pending[pid].append(batch)
                self.pending_rows[pid] += len(batch)
        cut = {pid: self._cut(pid) for pid in list(self.pending)}
        out = []
        for i in range(max(map(len, cut.values()), default=0)):
            out.append({pid: batches[i] for pid, batches in cut.items() if i < len(batches)})
        return out

    def _cut(self, pid) -> list[Batch]:
        """Every full train batch of ``pid``'s pending rows: one concatenation, then slices (each
        row is copied once however many batches a step cuts: with hundreds of actors, a step
        can take in hundreds of sequences)."""
        size = self.train_batch_size
        if self.pending_rows[pid] < size:
            return []
        joined = Batch.concat(self.pending[pid])
        full = len(joined) // size
        out = [joined.slice(k * size, (k + 1) * size) for k in range(full)]
        rest = joined.slice(full * size, len(joined))
        self.pending[pid], self.pending_rows[pid] = ([rest] if len(rest) else []), len(rest)
        return out


class RefPipeline(AsyncPipeline):
    """The pipeline of a learner group (``resources.num_learners`` > 1): rollout fragments stay in
    the object store and ``refs`` holds their references; every ``train_batch_size`` rows'
    worth becomes one round, ``train_batch_size / num_learners`` rows for each learner
    (:class:`~shoal.framework.learner_group.LearnerGroup`, in ``thread``'s place). A round waits
    while some learner has no room: the group never drops a batch, sampling pauses instead.

    With a ``multi_agent`` section each learning policy has its own group and its own ``refs``:
    every fragment (a ``{policy_id: Batch}``) goes to every policy's, whose members learn that
    policy's rows in it, so a policy's round is ``train_batch_size`` rows of fragments, its own
    agents' share of them. Each policy's rounds go to its group on their own."""

    def __init__(
        self,
        env_runners,
        runner: GroupRunner,
        *,
        train_batch_size: int,
        broadcast_interval: int,
        fragment_rows: int,
        publisher: WeightsPublisher,
    ) -> None:
        super().__init__(
            env_runners,
            runner,
            train_batch_size=train_batch_size,
            broadcast_interval=broadcast_interval,
            publisher=publisher,
        )
        self.per_learner = train_batch_size // (runner.group.num_learners * fragment_rows)  # fragments
        self.groups = runner.groups  # policy id -> its learner group
        self.refs: dict[str, list[Any]] = {pid: [] for pid in runner.policy_ids}  # fragments per policy

    def sample(self) -> list[tuple[Any, Any]]:
        """(fragment reference, metrics) of the fragments that are ready."""
        if self.thread.ident is None:
            self.thread.start()
        if not self.thread.full():
            self.env_runners.submit("sample", prelude=self.publisher.due, data_by_ref=True)
        return [r for _, r in self.env_runners.fetch_ready(timeout_s=WAIT_S)]

    def enqueue(self, sampled: list[Any]) -> None:
        K, n = self.thread.num_learners, self.per_learner
        for pid, refs in self.refs.items():
            refs.extend(sampled)
            group = self.groups[pid]
            while len(refs) >= K * n and not group.full():
                take = refs[: K * n]
                if not self.runner.submit({pid: [take[k * n : (k + 1) * n] for k in range(K)]}):
                    break  # the group re-formed with no room: the fragments wait for the next step
                del refs[: K * n]


# ---- the algorithm around the pipeline (IMPALA and APPO) ----------------------------------------
class AsyncAlgorithm(Algorithm):
    """IMPALA's and APPO's common part: each policy's learner (``_policy_learner``, the loss being
    the difference) trained by one learner thread, fed by the :class:`AsyncPipeline`. Weights and
    state are read and restored with the thread held, so never from a half-applied update."""

    policies: PolicySet  # built by setup()
    policy_cls = ActorCriticPolicy
    thread: Any  # the learner thread, or the LearnerGroup in its place (resources.num_learners > 1)
    result_keys = (  # the learner thread's stats(), or the learner group's
        *Algorithm.result_keys,
        *("learner_queue_size_mean", "learner_queue_size_max", "learner_idle_fraction", "num_updates"),
        *("learner_allreduce_ms", "num_lost_fragments", "num_learners", "num_learner_regroups"),
        *("num_learner_restarts", "num_learner_batches_lost", "num_learner_rounds_dropped"),
    )
    pipeline: AsyncPipeline

    def setup(self) -> None:
        self.policies = self.build_policies(self._policy_learner)
        if not self.is_multi_agent:
            self.learner = self.policies.only.learner
        self.env_runners = make_sequence_runners(self)
        cfg: Any = self.config  # IMPALA's or APPO's
        self._base_ref: Any = None  # the weights published from the driver's copies (every policy's)
        self._group_refs: dict[str, Any] = {}  # policy id -> its group's latest weights (multi_agent)
        if self._num_learners() > 1:  # K learner processes per learning policy; the driver keeps a copy
            self.thread = self._make_learner_group(None) if not self.is_multi_agent else self._make_learner_groups()
            group = GroupRunner(
                self.thread, dict(self.policies.trained), lambda: int(self.counters["env_steps_sampled"])
            )
            self.runner: ThreadRunner | GroupRunner = group
            self.pipeline = RefPipeline(
                self.env_runners,
                group,
                train_batch_size=cfg.train_batch_size,
                broadcast_interval=cfg.broadcast_interval,
                fragment_rows=cfg.fragment_length() * cfg.resources.num_envs_per_worker,
                publisher=self.publisher,
            )
        else:
            self.thread = make_learner_thread(self.policies.learners(), cfg)
            thread = self.runner = ThreadRunner(self.thread, dict(self.policies.trained))
            self.pipeline = AsyncPipeline.from_config(self.env_runners, thread, cfg, self.publisher)
        self.broadcast_weights()

    @classmethod
    def _policy_learner(
        cls, cfg, obs_space, action_space, seed: Optional[int] = None, **learner_kwargs
    ) -> PolicyLearner:
        raise NotImplementedError

    # ---- the learner groups (resources.num_learners > 1) -----------------------------------------
    def _num_learners(self) -> int:
        return int(getattr(self.config.resources, "num_learners", 1))

    @property
    def learner_group(self) -> Optional[LearnerGroup]:
        """The learner processes of a single policy when ``resources.num_learners`` > 1, else None."""
        return self.thread if isinstance(self.thread, LearnerGroup) else None

    @property
    def learner_groups(self) -> dict[Optional[str], LearnerGroup]:
        """Each learning policy's learner group by policy id (None: a single policy's); {} with the thread."""
        if isinstance(self.thread, LearnerGroups):
            return {pid: g for pid, g in self.thread.groups.items()}
        return {None: self.thread} if isinstance(self.thread, LearnerGroup) else {}

    def _policy(self, pid: Optional[str]) -> PolicyLearner:
        return self.policies.only if pid is None else self.policies[pid]

    @classmethod
    def resource_plan(cls, config) -> list[BundleGroup]:
        """The base plan, plus one bundle per learner process: K for each learning policy."""
        plan = super().resource_plan(config)
        res = config.resources
        if getattr(res, "num_learners", 1) > 1:
            ma = getattr(config, "multi_agent", None)
            names = ["learner"] if ma is None else [learner_bundle(pid) for pid in ma.trained()]
            key = "resources.num_cpus_per_learner" + ("" if ma is None else ", resources.num_learners (per policy)")
            for name in names:
                plan.append(
                    BundleGroup(name, res.num_learners, res.num_cpus_per_learner, res.num_gpus_per_learner, cpu_key=key)
                )
        return plan

    def _make_learner_groups(self) -> LearnerGroups:
        return LearnerGroups({pid: self._make_learner_group(pid) for pid in self.policies.trained})

    def _make_learner_group(self, pid: Optional[str]) -> LearnerGroup:
        """The learner group of policy ``pid`` of a ``multi_agent`` section, or of the one policy (None)."""
        cfg: Any = self.config  # IMPALA's or APPO's
        res = cfg.resources
        if pid is None:
            pcfg, name, kwargs = cfg, "learner", {}
            spaces = (self.env_info.observation_space, self.env_info.action_space)
        else:
            pcfg, name, kwargs = self.policies.configs[pid], learner_bundle(pid), {"policy_id": pid}
            agents: Any = self.agents  # a multi_agent section's
            spaces = agents.spaces[agents.agent_for(pid)]

        def make():
            return make_actor_group(
                GroupLearner,
                res.num_learners,
                lambda i: ((pcfg, i, *spaces), kwargs),
                remote=True,
                resources=self.actor_resources(
                    name, num_cpus=res.num_cpus_per_learner, num_gpus=res.num_gpus_per_learner
                ),
                max_in_flight=1 << 20,  # the group keeps its own count (LearnerGroup)
                name=name,
                first_index=0,
                about=f"{cfg.algo} {name}",
            )

        return LearnerGroup(
            make,
            num_learners=res.num_learners,
            queue_size=cfg.learner_queue_size,
            local_state=lambda: self._group_start_state(pid),
            on_weights=lambda ref: self._publish_weights(pid, ref),
        )

    def update_config(self, changes: dict[str, Any]) -> None:
        """As every algorithm's; running learner groups' members get the changed config too (their policy's)."""
        super().update_config(changes)
        for pid, group in self.learner_groups.items():
            group.apply_config(self.config if pid is None else self.policies.configs[pid], list(changes))

    def _group_start_state(self, pid: Optional[str]) -> dict[str, Any]:
        """What a learner group forms from when no learner survives to give its state (and at the
        start): the driver's copy, with the weights last published to the rollout actors (learner
        0's latest, so a group that lost every learner at once loses no training but the in-flight
        batches; the optimizer's moments are the copy's, from the last checkpoint or pull)."""
        latest = runtime.resolve(self.publisher.latest() if pid is None else self._group_refs.get(pid))
        if latest is not None:
            self._policy(pid).set_weights(latest if pid is None else latest[pid])
        return self._policy(pid).get_state()

    def _pull_learner_state(self) -> None:
        """Each policy's driver copy takes its group's learner 0's state (weights, optimizer, target)."""
        for pid, group in self.learner_groups.items():
            if group.started:
                self._policy(pid).set_state(group.call("get_state"))

    def _publish_weights(self, pid: Optional[str], ref) -> None:
        """A learner group's weights (learner 0's, put by the group) become the rollout actors' latest:
        with several policies, each group's latest ``{pid: weights}`` after the driver's full set
        (which frozen policies, and policies whose group has published nothing yet, still need)."""
        if pid is None:
            self.publisher.publish([("set_weights", (ref,)), *self.normalizer_calls()])
            return
        self._group_refs[pid] = ref
        complete = set(self._group_refs) == set(self.policies.trained) and not self.policies.frozen
        base = [] if complete or self._base_ref is None else [("set_weights", (self._base_ref,))]
        groups = [("set_weights", (r,)) for r in self._group_refs.values()]
        self.publisher.publish([*base, *groups, *self.normalizer_calls()])

    def display_metrics(self) -> list[tuple[str, str]]:  # V-trace's mean importance ratio too
        return self.policies.display(super().display_metrics() + [("learner/mean_rho", "mean_rho")])

    def get_weights(self):
        groups = self.learner_groups
        if groups:
            for pid, group in groups.items():
                if group.started:
                    self._policy(pid).set_weights(group.call("get_weights"))
            return super().get_weights()
        with self.thread.hold():  # never a half-applied update
            return super().get_weights()

    def broadcast_weights(self) -> None:
        """The rollout actors' weights (and the normalizer's statistics) are published, one put, and
        reach each actor with its next sample request (``WeightsPublisher.due``). Running learner
        groups publish their learner 0's, which the driver never fetches."""
        groups = self.learner_groups
        if groups and all(g.started for g in groups.values()):
            for group in groups.values():
                group.request_weights()
            return
        self._base_ref, self._group_refs = self.publish_weights(), {}

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        if self.learner_groups:
            self._pull_learner_state()
            return super().get_state()
        with self.thread.hold():
            return super().get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        groups = self.learner_groups
        if groups:
            super().set_state(state)
            for pid, group in groups.items():
                if group.started:
                    group.set_state(self._policy(pid).get_state())
        else:
            with self.thread.hold():
                super().set_state(state)
        self.broadcast_weights()

    def stop(self) -> None:
        self.thread.stop()
        super().stop()


# ---- building the pipeline's parts (IMPALA and APPO) -------------------------------------------
def learner_bundle(pid: str) -> str:
    """The planned group (and actor group) of policy ``pid``'s learners, with a ``multi_agent`` section."""
    return f"{pid} learner"


def make_learner_thread(learner, config):
    """A LearnerThread, or the multi-device one when the config names several devices or a GPU
    (``config.multi_device()``: one GPU with a ``minibatch_buffer_size`` ring keeps the LearnerThread);
    ``learner`` is a Learner, or ``{policy_id: Learner}`` for a thread that trains several policies."""
    devices = config.learner_devices()
    if config.multi_device():
        from shoal.learn.multi_device import MultiDeviceLearnerThread

        return MultiDeviceLearnerThread(
            learner,
            devices,
            num_multi_gpu_tower_stacks=config.num_multi_gpu_tower_stacks,
            num_data_load_threads=config.num_data_load_threads,
            num_sgd_iter=config.num_sgd_iter,
            learner_queue_size=config.learner_queue_size,
            learner_queue_timeout=config.learner_queue_timeout,
            rows_per_unit=config.fragment_length(),
        )
    from shoal.learn.learner_thread import LearnerThread

    return LearnerThread(
        learner,
        learner_queue_size=config.learner_queue_size,
        minibatch_buffer_size=config.minibatch_buffer_size,
        num_sgd_iter=config.num_sgd_iter,
        learner_queue_timeout=config.learner_queue_timeout,
    )


def make_async_policy_learner(
    cfg,
    obs_space,
    action_space,
    seed: Optional[int],
    make_loss: MakeLoss,
    *,
    target_period: Optional[int] = None,
    device: Any = None,
    **learner_kwargs: Any,
) -> PolicyLearner:
    """One policy's actor-critic learner (``make_loss(config, target=, kl=)``) on ``device``, by default
    the first learner device; ``learner_kwargs`` go to :class:`PolicyLearner` (a learner group's
    member passes ``learner_cls=DistributedLearner``)."""
    if device is None and not cfg.fake_devices:
        resolve_device(cfg.resources.num_gpus)  # a clear ConfigError when GPUs are asked for but absent
    module = build_policy_module(build_actor_critic, obs_space, action_space, cfg.model, seed)
    return PolicyLearner(
        module,
        cfg,
        make_loss,
        device=cfg.learner_devices()[0] if device is None else device,
        target_period=target_period,
        **learner_kwargs,
    )


def make_sequence_runners(algo: AsyncAlgorithm):
    """Rollout actors that return time-major sequences, with requests kept in flight."""
    cfg: Any = algo.config  # IMPALA's or APPO's config
    return algo.make_env_runners(
        ActorCriticPolicy,
        sequence_postprocess,
        cfg.fragment_length(),
        max_in_flight=cfg.max_requests_in_flight_per_worker,
    )
