"""MultiDeviceLearnerThread: data-parallel SGD over several devices with preloaded tower stacks.

Pipeline (all inside one process):

    in-queue --loader threads--> ready stacks --learner thread--> idle stacks --> loaders ...

- ``num_multi_gpu_tower_stacks`` stacks start on the idle queue. A loader thread
  (``num_data_load_threads`` of them) takes an idle stack, then a train batch from the
  in-queue, splits it into ``len(devices)`` equal shards along its rows and copies shard i
  onto device i (on CUDA in its own stream, so copies overlap the learner's compute), and
  puts the stack on the ready queue.
- The learner thread takes a ready stack and learns on it ``num_sgd_iter`` times. Each pass
  runs forward/backward of the loss on every device's replica of the module with that
  device's shard (the replicas first copy the master's weights), averages the gradients
  into the master module (the Learner's, on ``devices[0]``) and applies the Learner's
  optimizer step once. Then the stack goes back to idle and its
  :class:`~shoal.learn.threads.LearnerResult` onto the out-queue.

The towers' gradients are averaged with weights: each shard's share of the batch's valid
rows (``Col.VALID``; of its rows when there is no such column). The losses are means over the
valid rows, so that weighted sum is exactly the gradient of the whole batch on one device,
however unevenly the masked (autoreset) rows fall on the shards: N devices make the same update
as one. The loss statistics are combined with the same weights.

On CUDA devices each replica runs its forward/backward on its own stream and nothing copies
to the host between towers (the statistics stay on the device until the stack is done), so
the towers' kernels overlap; the master device waits for the replicas' streams before it
averages.

A batch must split evenly: its rows must be a multiple of ``len(devices) * rows_per_unit``
(``rows_per_unit`` keeps whole sequences together, e.g. T for IMPALA's time-major rows), or
a ``split_fn(batch, num_shards) -> list[Batch]`` decides. Anything else is a ConfigError
naming the sizes, raised by ``add()`` (and by the loader for a batch put on the queue
directly, where it reaches ``check()``).

The loss function gets, as its ``learner`` argument, a view of the master Learner whose
``module`` and ``device`` are the replica's own; every other attribute is the master's.
With only CPU devices ("fake" devices, e.g. ``["cpu", "cpu"]``) all of this runs the same
way, which is how the tests check it.
"""

from __future__ import annotations

import copy
import queue
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Mapping, Sequence

import torch

from shoal.batch import Batch
from shoal.errors import ConfigError
from shoal.learn.learner import Learner
from shoal.learn.learner_thread import LearnerThread, _positive
from shoal.learn.loading import copy_to_device
from shoal.learn.stats import StatsMean
from shoal.learn.threads import BackgroundThread, put_stop, wait_get
from shoal.logging.metrics import Phase

SplitFn = Callable[[Batch, int], Sequence[Batch]]


class _TowerView:
    """What the loss sees as ``learner`` on a replica: the replica's module and device, the master's rest."""

    def __init__(self, master: Learner, module: torch.nn.Module, device: torch.device) -> None:
        self._master, self.module, self.device = master, module, device

    def __getattr__(self, name: str):
        return getattr(self._master, name)

    def beside(self, term) -> bool:
        """A tower's loss adds every term itself: its update waits on no side thread (``Learner.beside``)."""
        return False


def shard_weights(shards: Sequence[Batch]) -> list[float]:
    """Each shard's share of the batch: of its ``Col.VALID`` rows when the batch has that column
    (losses are masked means over them), else of its rows. Equal shares when nothing is valid."""
    counts = [float(b.valid_rows()) for b in shards]
    total = sum(counts)
    return [c / total for c in counts] if total > 0 else [1.0 / len(shards)] * len(shards)


class _Towers:
    """One policy's master Learner plus a replica module per extra device."""

    def __init__(self, learner: Learner, devices: list[torch.device]) -> None:
        self.learner = learner
        self.devices = devices
        replicas = [copy.deepcopy(learner.module).to(d) for d in devices[1:]]
        self.modules = [learner.module, *replicas]
        self.views = [learner, *(_TowerView(learner, m, d) for m, d in zip(replicas, devices[1:]))]
        self.params = [[p for p in m.parameters() if p.requires_grad] for m in self.modules]
        # A compute stream per CUDA replica (the master computes on its device's current stream).
        self.streams: list[torch.cuda.Stream | None] = [
            None,
            *(torch.cuda.Stream(device=d) if d.type == "cuda" else None for d in devices[1:]),
        ]

    def update(self, shards: list[dict], weights: Sequence[float], stats: StatsMean) -> None:
        """One SGD step on the shards (one per device, ``weights`` their shares of the batch);
        adds the towers' weighted loss stats to ``stats``.

        The replicas take the master's weights first, so a master changed from outside between
        steps (``set_state`` after a restore, under the thread's lock) is what every tower uses.
        """
        self.sync_replicas()
        dev0 = self.devices[0]
        loss_fn = self.learner.loss_fn  # read once: a loss swapped in by update_config meets every tower next step
        combined: dict[str, torch.Tensor] = {}
        for module, view, params, shard, w, stream in zip(
            self.modules, self.views, self.params, shards, weights, self.streams
        ):
            with _on_stream(stream, view.device):
                for p in params:
                    p.grad = None
                loss, tower_stats = loss_fn(module, shard, view)
                loss.backward()
            for k, v in tower_stats.items():
                v = v.detach().float() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                v = v.to(dev0, non_blocking=True) * w
                combined[k] = v if k not in combined else combined[k] + v
        for stream in self.streams:
            if stream is not None:
                torch.cuda.current_stream(dev0).wait_stream(stream)
        stats.add(combined)
        self._average_gradients(weights)
        self.learner.reduce_gradients()
        self.learner.last_batch_rows = sum(len(next(iter(t.values()))) for t in shards if t)
        self.learner._last_stats = combined  # named in a divergence message if a term is NaN/inf
        norm = self.learner.apply_gradients()
        if norm is not None:
            stats.add({"grad_norm": norm})

    def _average_gradients(self, weights: Sequence[float]) -> None:
        if len(self.modules) == 1:
            return
        dev0 = self.devices[0]
        for j, master in enumerate(self.params[0]):
            grads = [(w, g) for w, ps in zip(weights[1:], self.params[1:]) if (g := ps[j].grad) is not None]
            if master.grad is None:
                if not grads:
                    continue  # a parameter the loss does not use
                master.grad = torch.zeros_like(master)
            else:
                master.grad.mul_(weights[0])
            for w, g in grads:
                master.grad.add_(g.to(dev0, non_blocking=True), alpha=w)

    @torch.no_grad()
    def sync_replicas(self) -> None:
        master = self.learner.module
        for replica in self.modules[1:]:
            for r, m in zip(replica.parameters(), master.parameters()):
                r.copy_(m, non_blocking=True)
            for rb, mb in zip(replica.buffers(), master.buffers()):
                rb.copy_(mb, non_blocking=True)


@contextmanager
def _on_stream(stream, device: torch.device):
    """Run the block on ``stream`` (after the device's current stream, e.g. the replica's weight
    copy); without a stream (CPU, or the master) on the current one."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield


class _Stack:
    """Per policy, one dict of tensors per device and the shards' weights; plus the step counts."""

    __slots__ = ("shards", "weights", "steps")

    def __init__(self) -> None:
        self.shards: dict[Any, list[dict]] = {}
        self.weights: dict[Any, list[float]] = {}
        self.steps: dict[Any, tuple[int, int]] = {}  # each policy's (env steps, agent steps)


class _Loader(BackgroundThread):
    """Moves batches from the in-queue onto the devices of an idle stack."""

    def __init__(self, owner: "MultiDeviceLearnerThread", index: int) -> None:
        super().__init__(name=f"{owner.name}-loader-{index}")
        self.owner = owner

    def step(self) -> None:
        owner = self.owner
        with self.idle():  # waiting for the learner to hand a stack back
            stack = wait_get(owner.idle_stacks, self.stopped)
        if stack is None:
            return
        item = owner.take(self.stopped, self.idle)
        if item is None:
            owner.idle_stacks.put(stack)
            return
        batch, stack.steps = item
        with owner.timers.time(Phase.LEARNER_LOAD):
            for pid, b in owner._per_policy(batch):
                shards = owner.split(pid, b)
                stack.shards[pid], stack.weights[pid] = owner.load_shards(shards), shard_weights(shards)
        owner.ready_stacks.put(stack)


class MultiDeviceLearnerThread(LearnerThread):
    def __init__(
        self,
        learner: Learner | Mapping[str, Learner],
        devices: Sequence[torch.device | str],
        *,
        num_multi_gpu_tower_stacks: int = 1,
        num_data_load_threads: int = 1,
        num_sgd_iter: int = 1,
        learner_queue_size: int = 16,
        learner_queue_timeout: float = 300.0,
        rows_per_unit: int = 1,
        split_fn: SplitFn | None = None,
        name: str = "shoal-multi-device-learner",
    ) -> None:
        super().__init__(
            learner,
            learner_queue_size=learner_queue_size,
            num_sgd_iter=num_sgd_iter,
            learner_queue_timeout=learner_queue_timeout,
            name=name,
        )
        _positive("num_multi_gpu_tower_stacks", num_multi_gpu_tower_stacks)
        _positive("num_data_load_threads", num_data_load_threads)
        _positive("rows_per_unit", rows_per_unit)
        if not devices:
            raise ConfigError("devices is empty: give at least one device, e.g. ['cpu'] or ['cuda:0', 'cuda:1'].")
        self.devices = [torch.device(d) for d in devices]
        for pid, ln in self.learners.items():
            self._check_master(pid, ln)
        self.rows_per_unit = int(rows_per_unit)
        self.split_fn = split_fn
        self.towers = {pid: _Towers(ln, self.devices) for pid, ln in self.learners.items()}
        self.idle_stacks: queue.Queue = queue.Queue()
        self.ready_stacks: queue.Queue = queue.Queue()
        for _ in range(int(num_multi_gpu_tower_stacks)):
            self.idle_stacks.put(_Stack())
        self.loaders = [_Loader(self, i) for i in range(int(num_data_load_threads))]

    # ---- driver side -------------------------------------------------------------------
    def validate(self, batch) -> None:
        super().validate(batch)
        if self.split_fn is None:
            for pid, b in self._per_policy(batch):
                self._check_divisible(pid, len(b))

    def start(self) -> None:
        for loader in self.loaders:
            loader.start()
        super().start()

    def check(self) -> None:
        for loader in self.loaders:
            loader.check()
        super().check()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        for loader in self.loaders:
            loader.stopped.set()
        put_stop(self.inqueue, len(self.loaders))
        put_stop(self.idle_stacks, len(self.loaders))
        put_stop(self.ready_stacks)
        for loader in self.loaders:
            loader.stop(timeout_s)
        super().stop(timeout_s)

    def add_learner(self, policy_id: str, learner: Learner) -> None:
        """As the one-device thread's; the policy's towers are built first, outside the lock (the
        loaders read ``towers`` without it, so it is replaced, never changed in place)."""
        self._check_master(policy_id, learner)
        towers = _Towers(learner, self.devices)
        with self.lock:
            self.towers = {**self.towers, policy_id: towers}
            super().add_learner(policy_id, learner)

    def remove_learner(self, policy_id: str) -> None:
        with self.lock:
            super().remove_learner(policy_id)
            self.towers = {pid: t for pid, t in self.towers.items() if pid != policy_id}

    def _check_master(self, pid, learner: Learner) -> None:
        if learner.device != self.devices[0]:
            raise ConfigError(
                f"the learner{'' if pid is None else f' of policy {pid!r}'} is on {learner.device} but devices[0] is "
                f"{self.devices[0]}: the master copy must live on the first device."
            )

    # ---- loading (loader threads) ------------------------------------------------------
    def _check_divisible(self, pid, rows: int) -> None:
        d, u = len(self.devices), self.rows_per_unit
        if rows % (d * u):
            unit = f" in whole units of rows_per_unit={u} rows" if u > 1 else ""
            who = "" if pid is None else f" for policy {pid!r}"
            raise ConfigError(
                f"The train batch{who} has {rows} rows, which does not divide evenly over {d} devices{unit}: "
                f"its size must be a multiple of {d * u}. Change train_batch_size (or the number of devices)."
            )

    def split(self, pid, batch: Batch) -> list[Batch]:
        d = len(self.devices)
        if self.split_fn is not None:
            shards = list(self.split_fn(batch, d))
            if len(shards) != d:
                raise ValueError(f"split_fn returned {len(shards)} shards for {d} devices")
            return shards
        self._check_divisible(pid, len(batch))
        size = len(batch) // d
        return [batch.slice(i * size, (i + 1) * size) for i in range(d)]

    def load_shards(self, shards: Sequence[Batch]) -> list[dict]:
        """Shard i onto device i (on CUDA through a copy stream of this loader thread)."""
        out = []
        for i, (device, shard) in enumerate(zip(self.devices, shards)):
            # the towers use them on their own streams: keep them alive for those
            towers = [t.streams[i] for t in self.towers.values() if t.streams[i]] if device.type == "cuda" else []
            out.append(copy_to_device(shard, device, consumers=towers))
        return out

    # ---- learning (learner thread) -----------------------------------------------------
    def step(self) -> None:
        with self.idle(), self.timers.time(Phase.LEARNER_LOAD_WAIT):
            stack = wait_get(self.ready_stacks, self.stopped)
        if stack is None:
            return
        stats = {pid: StatsMean() for pid in stack.shards}
        for _ in range(self.num_sgd_iter):
            with self.lock, self.timers.time(Phase.LEARNER_GRAD):
                for pid, shards in stack.shards.items():
                    if pid in self.towers:  # else it left while its batch was loaded
                        self.towers[pid].update(shards, stack.weights[pid], stats[pid])
                self.num_updates += 1
            self.yield_to_readers()
        steps = stack.steps
        stack.shards, stack.weights, stack.steps = {}, {}, {}
        self.idle_stacks.put(stack)
        self.publish_round(steps, stats)


__all__ = ["MultiDeviceLearnerThread"]
