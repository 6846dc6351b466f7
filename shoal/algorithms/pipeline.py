"""AsyncPipeline: the asynchronous data path of IMPALA and APPO, and the state it owns.

    rollout actors --sample()--> sequences --enqueue()--> train batches --> learner thread
          ^                                                                     |
          +---------- broadcast_due() / broadcast_done() <-- drain() <----------+

One object holds everything that lives between two training steps, so no algorithm keeps
pipeline state of its own and every field is written down here:

- the sample requests in flight (inside the rollout actor group: at most
  ``max_requests_in_flight_per_worker`` per actor);
- ``pending``: sampled sequences not yet cut into a train batch (whole sequences only), per
  policy when a ``multi_agent`` section trains several: each train batch holds one policy's
  sequences, and the batches cut in one step travel to the learner thread together as
  ``{policy_id: Batch}`` (its dict mode: one update step trains every policy present);
- the learner thread with its in-queue (``thread.num_dropped`` counts the train batches a
  full queue refused);
- ``learner_info``: the mean stats of the latest learner results (a report, never an input);
- ``num_learner_results``: train batches the learner has finished;
- the broadcast schedule: learner updates since the last weight broadcast.

The algorithm's ``training_step`` calls the phases in order (sample, enqueue, drain, sync)
and adds its own between them (APPO adapts its KL coefficient on each drained result).
:class:`AsyncAlgorithm` is what both algorithms share around their ``training_step``: the
policies' learners behind one learner thread, this pipeline, and the thread's hold around
weights and state. The functions at the end build the parts it wires together: the learner,
its thread and the rollout actors that return sequences.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

from shoal.algorithms.base import Algorithm
from shoal.algorithms.policies import PolicySet, build_policy_module
from shoal.batch import Batch, Col
from shoal.learn import resolve_device
from shoal.learn.policy_learner import MakeLoss, PolicyLearner
from shoal.learn.stats import mean_stats
from shoal.learn.threads import LearnerResult
from shoal.models import build_actor_critic
from shoal.rollout import ActorCriticPolicy
from shoal.rollout.postprocessing import sequence_postprocess

WAIT_S = 0.02  # longest a training step blocks on sample results or learner results


class LatestWeights:
    """The rollout actors' latest weights: published once per version (one object-store put) and
    sent to each actor with its next sample request, not to every actor at each broadcast. A
    broadcast then costs the driver nothing per actor, and each request at most one extra call,
    whatever the number of actors (``benchmarks/driver_scaling.py`` measures it)."""

    def __init__(self, group) -> None:
        self.group = group
        self.version = 0
        self.calls: list[tuple[str, tuple]] = []  # what an actor is sent: set_weights, the normalizer's
        self.sent: dict[int, tuple[int, int]] = {}  # actor id -> (its generation, the version it was sent)

    def publish(self, calls: list[tuple[str, tuple]]) -> None:
        self.version += 1
        self.calls = calls

    def due(self, actor_id: int) -> list[tuple[str, tuple]]:
        """The calls actor ``actor_id`` has not had yet (a recreated actor is sent them again)."""
        mark = (self.group.generation(actor_id), self.version)
        if not self.calls or self.sent.get(actor_id) == mark:
            return []
        self.sent[actor_id] = mark
        return self.calls


class AsyncPipeline:
    def __init__(self, env_runners, thread, *, train_batch_size: int, broadcast_interval: int) -> None:
        self.env_runners = env_runners
        self.latest = LatestWeights(env_runners)
        self.thread = thread
        self.train_batch_size = train_batch_size
        self.broadcast_interval = broadcast_interval
        self.pending: dict[Any, list[Batch]] = defaultdict(list)  # policy id (None: the only one) -> sequences
        self.pending_rows: dict[Any, int] = defaultdict(int)
        self.learner_info: dict[str, float] = {}
        self.num_learner_results = 0
        self.broadcast_at = 0  # thread.num_updates at the last broadcast

    @classmethod
    def from_config(cls, env_runners, thread, config) -> "AsyncPipeline":
        return cls(
            env_runners, thread, train_batch_size=config.train_batch_size, broadcast_interval=config.broadcast_interval
        )

    # ---- the phases, in the order a training step calls them ------------------------------
    def sample(self) -> list[tuple[Batch, Any]]:
        """Keep sample requests open (none while the learner's queue is full: back-pressure)
        and return the (sequences, metrics) that are ready, waiting at most ``WAIT_S``."""
        if self.thread.ident is None:
            self.thread.start()
        if not self.thread.inqueue.full():
            self.env_runners.submit("sample", prelude=self.latest.due)
        return [r for _, r in self.env_runners.fetch_ready(timeout_s=WAIT_S)]

    def enqueue(self, sampled: list[Any]) -> None:
        """Cut every full train batch off the pending sequences and offer it to the learner
        (``sampled``: a Batch per rollout result, or a ``{policy_id: Batch}`` with several policies)."""
        for item in self._cut_train_batches(sampled):
            parts = item.values() if isinstance(item, dict) else [item]
            steps = sum(int(b[Col.VALID].sum()) for b in parts)
            self.thread.add(item, env_steps=steps)  # a full queue drops it (counted)

    def drain(self, wait: bool) -> list[LearnerResult]:
        """The learner results finished since the last call, oldest first (waiting up to
        ``WAIT_S`` for one when ``wait``: a step that sampled nothing must not spin)."""
        results = self.thread.drain(timeout_s=WAIT_S if wait else 0.0)
        if results:
            self.num_learner_results += len(results)
            self.learner_info = mean_stats((r.stats for r in results), prefix="learner/")
        return results

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
        }

    def _cut_train_batches(self, sampled: list[Any]) -> list[Any]:
        """Train batches, each a Batch, or a ``{policy_id: Batch}`` of the policies whose turn it is."""
        for item in sampled:
            for pid, batch in item.items() if isinstance(item, dict) else [(None, item)]:
                self.pending[pid].append(batch)
                self.pending_rows[pid] += len(batch)
        cut = {pid: self._cut(pid) for pid in list(self.pending)}
        out = []
        for i in range(max(map(len, cut.values()), default=0)):
            parts = {pid: batches[i] for pid, batches in cut.items() if i < len(batches)}
            out.append(parts[None] if None in parts else parts)
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


# ---- the algorithm around the pipeline (IMPALA and APPO) ----------------------------------------
class AsyncAlgorithm(Algorithm):
    """IMPALA's and APPO's common part: each policy's learner (``_policy_learner``, the loss being
    the difference) trained by one learner thread, fed by the :class:`AsyncPipeline`. Weights and
    state are read and restored with the thread held, so never from a half-applied update."""

    policies: PolicySet  # built by setup()
    policy_cls = ActorCriticPolicy

    def setup(self) -> None:
        self.policies = self.build_policies(self._policy_learner)
        if not self.is_multi_agent:
            self.learner = self.policies.only.learner
        self.thread = make_learner_thread(self.policies.learners(), self.config)
        self.env_runners = make_sequence_runners(self)
        self.pipeline = AsyncPipeline.from_config(self.env_runners, self.thread, self.config)
        self.broadcast_weights()

    def _policy_learner(self, cfg, obs_space, action_space, seed: Optional[int] = None) -> PolicyLearner:
        raise NotImplementedError

    def display_metrics(self) -> list[tuple[str, str]]:  # V-trace's mean importance ratio too
        return self.policies.display(super().display_metrics() + [("learner/mean_rho", "mean_rho")])

    def get_weights(self):
        with self.thread.hold():  # never a half-applied update
            return super().get_weights()

    def broadcast_weights(self, groups=None) -> None:
        """The rollout actors' weights (and the normalizer's statistics) are published, one put, and
        reach each actor with its next sample request (:class:`LatestWeights`); other groups get
        them at once."""
        if groups is not None:
            super().broadcast_weights(groups)
            return
        ref = self.env_runners.put(self.get_weights())
        self._weights_ref = ref  # what a recreated actor is sent
        self.pipeline.latest.publish([("set_weights", (ref,)), *self.normalizer_calls()])

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        with self.thread.hold():
            return super().get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        with self.thread.hold():
            super().set_state(state)
        self.broadcast_weights()

    def stop(self) -> None:
        self.thread.stop()
        super().stop()


# ---- building the pipeline's parts (IMPALA and APPO) -------------------------------------------
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
    cfg, obs_space, action_space, seed: Optional[int], make_loss: MakeLoss, *, target_period: Optional[int] = None
) -> PolicyLearner:
    """One policy's actor-critic learner on the first learner device (``make_loss(config, target=, kl=)``)."""
    if not cfg.fake_devices:
        resolve_device(cfg.resources.num_gpus)  # a clear ConfigError when GPUs are asked for but absent
    module = build_policy_module(build_actor_critic, obs_space, action_space, cfg.model, seed)
    return PolicyLearner(module, cfg, make_loss, device=cfg.learner_devices()[0], target_period=target_period)


def make_sequence_runners(algo: AsyncAlgorithm):
    """Rollout actors that return time-major sequences, with requests kept in flight."""
    cfg: Any = algo.config  # IMPALA's or APPO's config
    return algo.make_env_runners(
        ActorCriticPolicy,
        sequence_postprocess,
        cfg.fragment_length(),
        max_in_flight=cfg.max_requests_in_flight_per_worker,
    )
