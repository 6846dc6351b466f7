"""torch.distributed helpers for data-parallel learners.

A data-parallel learner keeps one replica of the module per process. Every process computes
gradients on its own minibatch, the gradients are averaged over the process group with one
all-reduce per minibatch (all of them flattened into a single buffer), and every replica
applies the same averaged gradient, so replicas that start equal stay equal.

- :func:`node_ip`, :func:`free_port`: what rank 0 hands out as the rendezvous address;
- :func:`init_process_group` / :func:`destroy_process_group`: join and leave a group; joining
  first leaves any group this process was in, so a group can be re-formed after a peer died;
- :func:`flatten_grads` / :func:`unflatten_grads_`: the single-buffer layout;
- :class:`DistributedLearner`: a :class:`~shoal.learn.Learner` whose ``reduce_gradients``
  averages over the group (DD-PPO's). A failed collective (a dead peer, a timeout) raises
  :class:`CollectiveError`, which callers catch to re-form the group;
- :class:`UnionBatchLearner`: a DistributedLearner whose step is one learner's on the union of
  the replicas' batches (gradients weighted by valid rows, statistics summed over the group,
  an empty batch a zero-weight part): IMPALA's and APPO's learner group;
- :func:`form_group`: (re-)form the process group over an actor group's members and give them
  one state (DD-PPO's workers, IMPALA/APPO's learner group).
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from shoal.batch import Col
from shoal.errors import WorkerError
from shoal.learn.learner import Learner

BACKENDS = ("gloo", "nccl", "mpi")


class CollectiveError(RuntimeError):
    """A collective operation failed: a peer died or did not answer within the timeout."""


def backend_available(backend: str) -> bool:
    """Whether this torch build has ``backend`` (gloo, nccl or mpi)."""
    check = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}.get(backend)
    return bool(dist.is_available() and check is not None and check())


# ---- rendezvous ----------------------------------------------------------------------------
def node_ip() -> str:
    """This machine's outward-facing IP address (what peers on other nodes can reach).

    A UDP ``connect`` sends nothing; it only makes the kernel pick the interface that routes
    out. Without any route, fall back to the host name's address, then to loopback.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.254.254.254", 1))
        return s.getsockname()[0]
    except OSError:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    finally:
        s.close()


def free_port() -> int:
    """A TCP port that was free a moment ago (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(backend: str, address: tuple[str, int], rank: int, world_size: int, timeout_s: float) -> None:
    """Join a new process group (leaving any previous one). Every rank must call this concurrently.

    ``timeout_s`` bounds the rendezvous and every later collective, so a dead peer makes
    the survivors fail in seconds instead of hanging.
    """
    destroy_process_group()
    ip, port = address
    init_method = None if backend == "mpi" else f"tcp://{ip}:{port}"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def destroy_process_group() -> None:
    """Leave the current process group, if any. Safe after a failed collective."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group may not tear down cleanly; it is dropped either way
            pass


# ---- gradients -----------------------------------------------------------------------------
def flatten_grads(params: Sequence[torch.Tensor], *tail: torch.Tensor) -> torch.Tensor:
    """All gradients in one contiguous 1-D buffer, in ``params`` order (a missing grad is zeros),
    followed by ``tail`` (e.g. a weight reduced in the same all-reduce)."""
    return torch.cat([*((p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params), *tail])


def unflatten_grads_(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Write ``flat`` (laid out as :func:`flatten_grads` made it) back into each ``p.grad``."""
    offset = 0
    for p in params:
        n = p.numel()
        g = flat[offset : offset + n].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        offset += n
    if offset != flat.numel():
        raise ValueError(f"gradient buffer has {flat.numel()} elements, the parameters {offset}")


def all_reduce_sum_(t: torch.Tensor, spin: bool = False, what: str = "gradient") -> None:
    """Sum ``t`` in place over the current group; a failed collective raises :class:`CollectiveError`.

    ``spin``: wait for the result by polling (yielding the CPU to any other runnable thread)
    instead of sleeping. A worker that reaches the all-reduce first waits for its peer; when
    it sleeps, its (virtual) CPU goes idle and waking it again when the peer's data arrives
    can take milliseconds (figures in benchmarks/README.md). A collective that fails
    still ends the wait (the work completes with the error).
    """
    try:
        if spin:
            work = dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
            while not work.is_completed():
                os.sched_yield()
            work.wait()
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    except RuntimeError as e:  # DistBackendError and gloo's plain RuntimeErrors alike
        raise CollectiveError(f"{what} all-reduce failed: {e}") from e


def all_reduce_mean_(flat: torch.Tensor, spin: bool = False) -> None:
    """Average ``flat`` in place over the current group (sum, then divide: gloo has no AVG op), every
    replica counting the same (DD-PPO's minibatches; :class:`UnionBatchLearner` weighs them by rows).
    ``spin``: see :func:`all_reduce_sum_`."""
    all_reduce_sum_(flat, spin)
    flat.div_(dist.get_world_size())


class DistributedLearner(Learner):
    """A Learner whose gradients are averaged over the torch.distributed group at every minibatch.

    Outside a process group, or alone in one, it behaves like a plain Learner.
    ``spin_wait``: poll for each all-reduce's result instead of sleeping (see
    :func:`all_reduce_mean_`); for processes that have a CPU of their own.
    ``allreduce_s`` and ``num_allreduces`` accumulate the time spent averaging (flatten,
    all-reduce, copy back) and how many times.
    """

    def __init__(self, *args, spin_wait: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spin_wait = spin_wait
        self.allreduce_s = 0.0
        self.num_allreduces = 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def reduce_gradients(self) -> None:
        if self.world_size == 1:
            return  # alone in the group (or in none): the mean is the gradient itself
        t0 = time.perf_counter()
        flat = flatten_grads(self.params)
        all_reduce_mean_(flat, spin=self.spin_wait)
        unflatten_grads_(self.params, flat)
        self.allreduce_s += time.perf_counter() - t0
        self.num_allreduces += 1


class UnionBatchLearner(DistributedLearner):
    """A DistributedLearner whose step is the step one learner takes on the union of the replicas'
    batches (IMPALA's and APPO's learner group), for a loss that is a mean over its batch's valid
    rows (``Col.VALID``; every row without that column), as theirs is:

    - the gradient: replica i's is that of a mean over its n_i valid rows, so it counts n_i / N
      of the union's (N the sum of the n_i). One all-reduce of the flat ``n_i * grad_i`` with
      n_i appended, divided by the summed N; an unweighted mean, when the replicas hold
      different numbers of valid rows (an episode ended inside a fragment), is not the union's;
    - statistics over the batch: the loss sums what it needs over the group with
      ``sum_over_group`` (advantage standardization: the valid steps' count, sum and sum of
      squares, :func:`~shoal.learn.stats.standardize_over_group`), so it standardizes over the
      union, not over its own part;
    - a replica with nothing to learn (an empty batch ``{}``: every fragment of its round was lost)
      still takes its step: zero sums of the lengths the loss declares
      (``loss_fn.group_sum_sizes()``) in the loss's place, a zero-weight gradient, then the same
      optimizer step as its peers, so no all-reduce ever pairs steps of different rounds.

    A single learner's path is untouched: outside a process group (or alone in one) the loss's
    sums are its own and nothing is reduced.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sum_over_group = self._sum_over_group
        self.num_empty_steps = 0  # steps taken with an empty batch (zero weight)
        self._weight: Optional[torch.Tensor] = None  # the valid rows of the batch being learned
        self._sums: list[int] = []  # the lengths of what the loss summed over the group this step

    def _declared_sums(self) -> tuple[int, ...]:
        declared = getattr(self.loss_fn, "group_sum_sizes", None)
        return tuple(declared()) if declared is not None else ()

    def _sum_over_group(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the group (a new tensor; ``t`` itself alone in a group)."""
        self._sums.append(t.numel())
        if self.world_size == 1:
            return t
        t0 = time.perf_counter()
        out = t.detach().clone()
        all_reduce_sum_(out, spin=self.spin_wait, what="statistics")
        self.allreduce_s += time.perf_counter() - t0
        return out

    def compute_gradients(self, batch: dict) -> dict:
        self._sums = []
        if not batch:  # nothing this round: a zero-weight part in the group's collectives
            self.optimizer.zero_grad(set_to_none=True)
            self.last_batch_rows = 0
            self._weight = torch.zeros((), device=self.device)
            for n in self._declared_sums():
                self._sum_over_group(torch.zeros(n, dtype=torch.float64, device=self.device))
            self._last_stats = {}
            self.num_empty_steps += 1
            return {}
        valid = batch.get(Col.VALID)
        if valid is not None:
            self._weight = valid.sum().float()
        else:
            self._weight = torch.tensor(float(len(next(iter(batch.values())))), device=self.device)
        stats = super().compute_gradients(batch)
        if tuple(self._sums) != self._declared_sums():
            raise RuntimeError(
                f"the loss {type(self.loss_fn).__name__} summed vectors of lengths {tuple(self._sums)} over the "
                f"learner group, but its group_sum_sizes() declares {self._declared_sums()}: a replica with an "
                "empty batch makes the declared sums in its place, so they must match or the collectives pair up wrong"
            )
        return stats

    def reduce_gradients(self) -> None:
        if self.world_size == 1:
            return
        t0 = time.perf_counter()
        assert self._weight is not None, "compute_gradients first"
        one = torch.ones(1, dtype=self.params[0].dtype, device=self.params[0].device)
        buf = flatten_grads(self.params, one).mul_(self._weight.to(one.dtype))  # [n_i * grad_i, n_i]
        all_reduce_sum_(buf, spin=self.spin_wait)
        flat = buf[:-1].div_(buf[-1].clamp(min=1.0))  # / N; when N is 0 every part is zero
        unflatten_grads_(self.params, flat)
        self.allreduce_s += time.perf_counter() - t0
        self.num_allreduces += 1


# ---- forming a group of actors -------------------------------------------------------------------
def form_group(
    group: Any,
    source: Optional[int],
    members: dict[int, Any],
    local_state: Callable[[], Any],
    *,
    get_state: str,
    set_state: str,
    join_args: tuple = (),
    what: str = "process group",
) -> Optional[int]:
    """A new process group over the actors of ``group`` (its lowest id hosts the rendezvous), then
    one state for all; returns the actor whose state they took (None: ``local_state()``'s).

    Each actor has ``rendezvous_address()`` and ``join_group(address, ranks, *join_args)`` (``ranks``:
    actor id -> rank; every actor joins at once). ``source`` is the actor whose ``get_state()`` the
    others get through ``set_state``; None, or a source that was replaced meanwhile (it is not its
    ``members`` entry any more), means ``local_state()``. An actor that dies while the group forms
    is recreated by ``group`` and the formation starts again, at most ``group.max_restarts`` times.
    """
    for _ in range(group.max_restarts + 1):
        restarts = group.num_restarts
        ids = sorted(group.actor_ids)
        address = group.foreach("rendezvous_address", actor_ids=ids[:1])
        if address:
            group.foreach("join_group", address[0], {i: r for r, i in enumerate(ids)}, *join_args)
        state = group.foreach(get_state, actor_ids=[source]) if source is not None else [local_state()]
        if group.num_restarts == restarts and state:
            break
        source = None if source is None or group.actors.get(source) is not members.get(source) else source
    else:
        raise WorkerError(f"could not form a {what} over {len(group)} actors")
    group.foreach(set_state, group.put(state[0]), actor_ids=[i for i in ids if i != source])
    return source
