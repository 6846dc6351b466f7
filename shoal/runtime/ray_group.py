"""A group of Ray actors of one plain class, with in-flight tracking and restarts."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Callable, Iterable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from shoal.errors import ActorLostError, DivergenceError, NonFiniteEnvError, WorkerError
from shoal.runtime import deadline
from shoal.runtime.cluster import check_raylet, release, reserve
from shoal.runtime.local import ActorGroupBase, Prelude
from shoal.runtime.resources import ActorResources
from shoal.runtime.restarts import RestartBudget

log = logging.getLogger("shoal.runtime")
FATAL_ERRORS = (DivergenceError, NonFiniteEnvError)  # raised in an actor, they stop the run instead of restarting it
WAIT_SLICE_S = 0.5  # a long wait on actors is cut into slices; timeouts, the run's deadline and Ctrl-C act between them
START_TIMEOUTS_IN_A_ROW = 3  # an actor slot whose actor has not started this many times in a row stops the run


INLINE_BYTES = 64 * 1024  # under Ray's 100 KB limit for arguments it inlines into a call


def _nbytes(obj: Any, limit: int = INLINE_BYTES) -> int:
    """The array bytes in nested dicts/lists/tuples of arrays, tensors and scalars (weights,
    sync states); ``limit`` for anything else or once the count reaches it."""
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        total = 0
        for item in obj:
            total += _nbytes(item, limit - total)
            if total >= limit:
                return limit
        return total
    if hasattr(obj, "nbytes") and hasattr(obj, "dtype"):  # numpy array or scalar
        return int(obj.nbytes)
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):  # torch tensor
        return int(obj.element_size() * obj.numel())
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return 8 + (len(obj) if isinstance(obj, str) else 0)
    return limit


class RayActorGroup(ActorGroupBase):
    """N actors in one placement group (one bundle each): the run's (``resources.placement``) or their own.

    A request that fails because its actor died, or because the actor raised, drops that
    request (counted in ``num_dropped_requests``), recreates the actor in the same bundle,
    replays ``on_restart()`` on it and counts ``num_restarts``. A restart past ``max_restarts``
    within ``restart_window_s`` seconds (:class:`RestartBudget`) raises :class:`WorkerError`
    carrying the last failure's traceback. A request still open after ``request_timeout_s``
    counts as a failure of its actor (a hung env): one log line, the actor is killed and
    recreated the same way, and ``num_timeouts`` counts it.
    """

    def __init__(
        self,
        cls: type,
        num_actors: int,
        ctor: Callable[[int], tuple[tuple, dict]],
        resources: ActorResources,
        *,
        max_in_flight: int = 1,
        name: str = "actor",
        first_index: int = 1,
        about: str = "",
    ) -> None:
        super().__init__()
        self.cls_name = cls.__name__
        self.remote_cls = ray.remote(cls)
        self.ctor = ctor
        self.resources = resources
        self.num_cpus, self.num_gpus = resources.num_cpus, resources.num_gpus
        self.max_in_flight = max_in_flight
        self.max_restarts = resources.max_restarts
        self.restart_budget = RestartBudget(resources.max_restarts, resources.restart_window_s)
        self.name, self.about = name, about  # about: what the actors run, for log lines ("env CartPole-v1")
        self.request_timeout_s = resources.request_timeout_s
        self.ids = list(range(first_index, first_index + num_actors))
        # node: None (anywhere), "driver" (this process's node) or a Ray node id; the group's
        # placement group (or, with no resources to reserve, each actor) is pinned there.
        node = resources.node
        self.node_id = ray.get_runtime_context().get_node_id() if node == "driver" else node
        if resources.placement is not None:  # bundles in the run's placement group, which the run releases
            self.pg, self.bundle_indices = resources.placement
            self.owns_pg = False
            if len(self.bundle_indices) != num_actors:
                raise ValueError(f"{num_actors} {name}s were given {len(self.bundle_indices)} bundles")
        else:
            self.pg = reserve(
                [{"CPU": self.num_cpus, "GPU": self.num_gpus} for _ in self.ids],
                what=f"{num_actors} {name}s",
                wait_s=resources.resource_wait_s,
                node_id=self.node_id,
                strategy=resources.strategy,
            )
            self.bundle_indices, self.owns_pg = tuple(range(num_actors)), True
        self._probes: dict[int, Any] = {}  # actor id -> ref of its __ray_ready__ call
        self._up_at: dict[int, float] = {}  # actor id -> when it was first seen constructed
        self._created_at: dict[int, float] = {}  # actor id -> when it was (re)created
        self.start_timeout_s = resources.start_timeout_s
        self._start_timeouts: dict[int, int] = {}  # actor id -> its start timeouts since an actor there last started
        self._answered_at: dict[int, float] = {}  # actor id -> when its last answer was collected
        self.actors: dict[int, Any] = {i: self._create(i) for i in self.ids}
        self._in_flight: dict[Any, tuple[int, Any, str, float]] = {}  # ObjectRef -> (actor id, handle, method, sent at)
        self._data_refs: dict[Any, Any] = {}  # a data_by_ref request's ref -> the ref of its data (left in the store)
        self.num_restarts = 0
        self.num_timeouts = 0
        self.num_dropped_requests = 0
        self.last_failure: str | None = None

    def _create(self, i: int):
        check_raylet()
        actor = self._launch(i)
        self._probes[i] = actor.__ray_ready__.remote()  # done once the actor is constructed
        self._created_at[i] = time.monotonic()
        self._up_at.pop(i, None)
        self._answered_at.pop(i, None)
        return actor

    def _launch(self, i: int):
        """A new Ray actor for slot ``i``, in its bundle, constructed with ``ctor(i)``; its handle.
        (The driver-scaling benchmark overrides this to stand synthetic actors in.)"""
        args, kwargs = self.ctor(i)
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "max_restarts": 0}
        if self.pg is not None:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=self.bundle_indices[self.ids.index(i)]
            )
        elif self.node_id is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=self.node_id, soft=False)
        return self.remote_cls.options(**opts).remote(*args, **kwargs)

    @property
    def actor_ids(self) -> list[int]:
        return list(self.actors)

    def put(self, obj: Any) -> Any:
        """What to pass to many actors: ``obj`` itself when small (Ray copies it into each call,
        no object-store round trip), else one object-store reference they all read."""
        if _nbytes(obj) < INLINE_BYTES:
            return obj
        check_raylet()
        return ray.put(obj)

    def proxies(self, wait: bool = False) -> dict[int, "ActorProxy"]:
        """Picklable handles other actors can call (``proxy.add(batch)``): fire-and-forget, or
        with ``wait=True`` calls that block and return the result (raising if the actor died)."""
        return {i: ActorProxy(h, wait=wait) for i, h in self.actors.items()}

    def node_ids(self) -> dict[int, str]:
        """Where each actor runs (Ray node ids)."""
        return dict(
            zip(
                self.actors,
                ray.get(
                    [
                        h.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                        for h in self.actors.values()
                    ]
                ),
            )
        )

    # ---- failures -------------------------------------------------------------------
    def _failed(self, i: int, handle: Any, err: BaseException) -> None:
        self.num_dropped_requests += 1
        cause = getattr(err, "cause", None)
        if isinstance(cause, FATAL_ERRORS):  # a verdict on the run (diverged, NaN from the env): no restart helps
            raise cause
        if self.actors.get(i) is not handle:
            return  # that actor was already replaced after an earlier failed request
        self.last_failure = "".join(traceback.format_exception_only(type(err), err)).strip()
        log.warning("%s %d %s; recreating it", self.name, i, failure_summary(err, self.last_failure))
        self.restart(i)

    def restart(self, i: int) -> None:
        if not self.restart_budget.take():
            raise WorkerError(
                f"{self.name} {i} failed and {self.name}s were already restarted {self.max_restarts} times in the "
                f"last {self.resources.restart_window_s:g} s (resources.max_worker_restarts per "
                f"resources.worker_restart_window_s): they fail faster than restarts can help. "
                f"Last failure: {' '.join(str(self.last_failure).split())[:600]}"
            )
        old = self.actors.get(i)
        if old is not None:
            try:
                ray.kill(old, no_restart=True)
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
        # Drop what was in flight to the dead actor.
        for ref, (aid, *_) in list(self._in_flight.items()):
            if aid == i:
                del self._in_flight[ref]
                self._data_refs.pop(ref, None)
                self.num_dropped_requests += 1
        self.num_restarts += 1
        self.generations[i] = self.generation(i) + 1
        self._await_bundle(i)
        actor = self._create(i)
        for method, args in self.on_restart() if self.on_restart else []:
            getattr(actor, method).remote(*args)
        self.actors[i] = actor

    def _await_bundle(self, i: int) -> None:
        """Wait until actor ``i``'s reserved place exists, or fail clearly.

        When a node dies, Ray moves the placement-group bundles it held to nodes with room;
        until it has, an actor created in such a bundle waits unplaced (a synchronous call to it
        would hang). So wait up to ``resource_wait_s`` and then stop the run with the reason.
        """
        if self.pg is None or self.pg.wait(timeout_seconds=self.resources.resource_wait_s):
            return
        free = ray.available_resources()
        raise WorkerError(
            f"{self.name} {i} cannot be recreated: its reserved place ({self.num_cpus:g} CPUs, {self.num_gpus:g} GPUs) "
            f"was on a node that is gone, and the live nodes had no room for it within "
            f"{self.resources.resource_wait_s:g} s (resources.resource_wait_s; free now: {free.get('CPU', 0):g} CPUs, "
            f"{free.get('GPU', 0):g} GPUs). Add a node, or resume the run with fewer actors "
            f"(shoal resume RUN_DIR --workers N). Last failure:\n{self.last_failure}"
        )

    # ---- waiting --------------------------------------------------------------------------
    def _send(self, i: int, method: str, *args: Any, data_by_ref: bool = False, **kwargs: Any) -> Any:
        check_raylet()
        handle = self.actors[i]
        if data_by_ref:  # (data, info): two objects, owned by this process; only ``info`` is fetched
            data, ref = getattr(handle, method).options(num_returns=2).remote(*args, **kwargs)
            self._data_refs[ref] = data
        else:
            ref = getattr(handle, method).remote(*args, **kwargs)
        self._in_flight[ref] = (i, handle, method, time.monotonic())
        return ref

    def _collect(self, ref: Any, out: dict[Any, Any]) -> None:
        """Move a finished request's result into ``out``; a failed one restarts its actor."""
        entry = self._in_flight.pop(ref, None)
        if entry is None:
            return  # dropped by a restart
        i, handle = entry[:2]
        self._answered_at[i] = time.monotonic()
        data = self._data_refs.pop(ref, None)
        try:
            out[ref] = ray.get(ref) if data is None else (data, ray.get(ref))
        except ray.exceptions.RayError as e:
            self._failed(i, handle, e)
            return
        if self.actors.get(i) is handle:
            self._start_timeouts.pop(i, None)  # it answered, so it started

    def _up_since(self, i: int) -> float | None:
        """When actor ``i`` was free to take a request: first seen started (None while it starts:
        importing torch, building envs), or its last answer collected, whichever is later. A
        request's clock runs from the later of its sending and that, so a request queued behind
        another on the same actor is not timed while it waits its turn."""
        if i not in self._up_at:
            ready, _ = ray.wait([self._probes[i]], timeout=0)
            if not ready:
                return None
            self._up_at[i] = time.monotonic()
            self._start_timeouts.pop(i, None)
        return max(self._up_at[i], self._answered_at.get(i, 0.0))

    def _overdue(self, i: int, sent: float, now: float) -> bool:
        """Whether a request sent to actor ``i`` at ``sent`` has waited too long: ``request_timeout_s``
        from when the actor was free to take it, or, while the actor has not started,
        ``start_timeout_s`` from its creation (a constructor that hangs)."""
        up = self._up_since(i)
        if up is None:
            return self.start_timeout_s is not None and now - self._created_at.get(i, now) > self.start_timeout_s
        return self.request_timeout_s is not None and now - max(sent, up) > self.request_timeout_s

    def _expire(self) -> None:
        """Treat each request open longer than ``request_timeout_s`` (or waiting on an actor that has
        not started within ``start_timeout_s``) as a failure of its actor."""
        if self.request_timeout_s is None and self.start_timeout_s is None:
            return
        now = time.monotonic()
        overdue = [ref for ref, (i, _, _, sent) in self._in_flight.items() if self._overdue(i, sent, now)]
        done, overdue = ray.wait(overdue, num_returns=len(overdue), timeout=0) if overdue else ([], [])
        for ref in overdue:  # answered ones are left to the caller to collect
            entry = self._in_flight.get(ref)
            if entry is None or self.actors.get(entry[0]) is not entry[1]:
                continue  # dropped, or its actor already replaced
            i, _, method, sent = entry
            self.num_timeouts += 1
            where = f" ({self.about})" if self.about else ""
            if self._up_since(i) is None:
                view = self._ray_view(i)
                self.last_failure = (
                    f"the actor did not start within resources.actor_start_timeout_s={self.start_timeout_s:g} s "
                    f"({view})"
                )
                tries = self._start_timeouts[i] = self._start_timeouts.get(i, 0) + 1
                if tries >= START_TIMEOUTS_IN_A_ROW:
                    self._never_starts(i, where, view)
                log.warning(
                    "%s %d%s has not started %.1f s after its creation (resources.actor_start_timeout_s=%g; %s): "
                    "an env constructor that hangs?; killing and recreating it (try %d of %d to start it)",
                    self.name,
                    i,
                    where,
                    now - self._created_at.get(i, now),
                    self.start_timeout_s,
                    view,
                    tries + 1,
                    START_TIMEOUTS_IN_A_ROW,
                )
            else:
                self.last_failure = (
                    f"{method}() did not return within resources.request_timeout_s={self.request_timeout_s:g} s"
                )
                log.warning(
                    "%s %d%s: %s() has not returned after %.1f s (resources.request_timeout_s=%g): a hung env "
                    "or actor; killing and recreating it",
                    self.name,
                    i,
                    where,
                    method,
                    now - max(sent, self._up_since(i) or sent),
                    self.request_timeout_s,
                )
            self.restart(i)

    def _never_starts(self, i: int, where: str, view: str) -> None:
        """Stop the run: actor ``i``'s slot timed out starting :data:`START_TIMEOUTS_IN_A_ROW` times
        in a row. Recreating it again would only repeat the wait (the restart budget, counted per
        window, never runs out at one restart per ``actor_start_timeout_s``)."""
        raise WorkerError(
            f"{self.name} {i}{where} did not start {START_TIMEOUTS_IN_A_ROW} times in a row: each time the "
            f"actor's constructor had not returned {self.start_timeout_s:g} s after its creation "
            f"(resources.actor_start_timeout_s; the last one: {view}). Its env constructor probably hangs in "
            "the actor's process (waiting on a file, a server, a licence, a display?): fix the env, or raise "
            "resources.actor_start_timeout_s if it is only slow to start."
        )

    def _ray_view(self, i: int) -> str:
        """What Ray says of actor ``i`` (for a start timeout's log line): its state, its process,
        and the CPUs free in its bundle, which tell a constructor that hangs (ALIVE, with a pid)
        from one Ray never placed (PENDING_CREATION: no free share, or no worker process)."""
        try:
            info = ray._private.state.actors(self.actors[i]._actor_id.hex())
            text = f"Ray: {info.get('State', '?')}, pid {info.get('Pid') or 'none'}"
            if self.pg is not None:
                key = f"CPU_group_{self.bundle_indices[self.ids.index(i)]}_{self.pg.id.hex()}"
                text += f", {ray.available_resources().get(key, 0.0):g} CPUs free in its bundle"
            return text
        except Exception as e:  # noqa: BLE001 - a diagnostic only
            return f"Ray's view unavailable: {type(e).__name__}"

    def _wait(self, refs: list[Any], timeout_s: float | None) -> None:
        """Wait until every one of ``refs`` is done or dropped, at most ``timeout_s`` (None: no
        limit), in slices; between them expire overdue requests and check the run's deadline."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            refs = [r for r in refs if r in self._in_flight]
            left = WAIT_SLICE_S if end is None else min(WAIT_SLICE_S, end - time.monotonic())
            if not refs or left <= 0:
                return
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=left, fetch_local=True)
            if len(ready) == len(refs):
                return
            self._expire()
            deadline.check()

    # ---- synchronous --------------------------------------------------------------------
    def foreach(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, wait: bool = True, **kwargs: Any
    ) -> list[Any]:
        """Call ``method`` on each actor. Failed (or timed-out) actors are restarted and left out of the results."""
        ids = list(actor_ids) if actor_ids is not None else list(self.actors)
        if not wait:
            for i in ids:
                getattr(self.actors[i], method).remote(*args, **kwargs)
            return []
        refs = [self._send(i, method, *args, **kwargs) for i in ids]
        try:
            self._wait(refs, None)
        except BaseException:  # the deadline, Ctrl-C: these requests are abandoned
            for ref in refs:
                self._in_flight.pop(ref, None)
            raise
        out: dict[Any, Any] = {}
        for ref in refs:
            self._collect(ref, out)
        return [out[ref] for ref in refs if ref in out]

    def call(self, actor_id: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on one actor, its result; raises if the actor fails or times out (it is restarted)."""
        out = self.foreach(method, *args, actor_ids=[actor_id], **kwargs)
        if not out:
            raise ActorLostError(f"{self.name} {actor_id}: {method}() failed or timed out; {self.last_failure}")
        return out[0]

    # ---- asynchronous -------------------------------------------------------------------
    def submit(
        self,
        method: str,
        *args: Any,
        actor_ids: Iterable[int] | None = None,
        prelude: Prelude = None,
        data_by_ref: bool = False,
        **kwargs: Any,
    ) -> int:
        """Send ``method`` to each actor with fewer than ``max_in_flight`` requests open (calls
        ``prelude(i)`` names go to actor ``i`` first: Ray runs one caller's calls to an actor in order).

        ``data_by_ref``: ``method`` returns a pair ``(data, info)``; the result ``fetch_ready`` gives is
        ``(ref of data, info)``, the data left in the object store for another actor to read (a
        learner in the learner group) and never copied into this process."""
        counts: dict[int, int] = {}
        for aid, *_ in self._in_flight.values():
            counts[aid] = counts.get(aid, 0) + 1
        n = 0
        for i in list(actor_ids) if actor_ids is not None else list(self.actors):
            if counts.get(i, 0) >= self.max_in_flight:
                continue
            for before, before_args in prelude(i) if prelude else []:
                getattr(self.actors[i], before).remote(*before_args)
            self._send(i, method, *args, data_by_ref=data_by_ref, **kwargs)
            n += 1
        return n

    def fetch_ready(self, timeout_s: float | None = 0.0) -> list[tuple[int, Any]]:
        """Results of the requests finished within ``timeout_s`` (0: only what is ready now)."""
        if not self._in_flight:
            return []
        refs = list(self._in_flight)
        if timeout_s:
            self._wait(refs, timeout_s)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
        owners = {ref: self._in_flight[ref][0] for ref in ready if ref in self._in_flight}
        out: dict[Any, Any] = {}
        for ref in ready:
            self._collect(ref, out)
        self._expire()
        return [(owners[ref], r) for ref, r in out.items()]

    def num_in_flight(self, actor_id: int | None = None) -> int:
        if actor_id is None:
            return len(self._in_flight)
        return sum(1 for a, *_ in self._in_flight.values() if a == actor_id)

    def stop(self) -> None:
        for a in self.actors.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.actors.clear()
        self._in_flight.clear()
        self._data_refs.clear()
        if self.owns_pg:
            release(self.pg)
        self.pg = None
        time.sleep(0)  # let Ray process the kills


def failure_summary(err: BaseException, text: str) -> str:
    """One line on why an actor's request failed: a lost node is named as such, not as a Ray traceback."""
    if isinstance(err, ray.exceptions.ActorDiedError) and ("node has died" in text or "node was terminated" in text):
        return "was lost with its node (the Ray node it ran on died)"
    if isinstance(err, ray.exceptions.ActorUnavailableError):
        return "is unreachable (its process or node is gone, or the network is down)"
    return f"failed ({text.splitlines()[0][:200]})"


class ActorProxy:
    """Calls a Ray actor's methods without waiting: ``proxy.method(*args)`` sends and returns nothing.

    Handed to other actors (e.g. Ape-X rollout actors writing into replay shards); a call to
    a dead actor is lost, and the owner re-sends fresh proxies after a restart. With
    ``wait=True`` a call blocks and returns the result, as the in-process object would
    (e.g. a policy learner pulling batches from its shard's replay actor); a call to an actor
    that died raises :class:`~shoal.errors.ActorLostError`.
    """

    def __init__(self, handle: Any, wait: bool = False) -> None:
        self.handle = handle
        self.wait = wait

    def __getattr__(self, method: str):
        if method.startswith("__") or method in ("handle", "wait"):
            raise AttributeError(method)
        remote_method = getattr(self.handle, method)
        if self.wait:

            def call(*args, **kwargs):
                try:
                    return ray.get(remote_method.remote(*args, **kwargs))
                except ray.exceptions.RayActorError as e:
                    raise ActorLostError(f"{method}() on a dead actor: {type(e).__name__}") from None

            return call
        return lambda *args, **kwargs: remote_method.remote(*args, **kwargs) and None
