"""In-process actor group: the same interface as the Ray one, with plain objects.

Calls run immediately; ``submit`` queues the result for the next ``fetch_ready``. Errors
propagate (with no separate process there is nothing to restart).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Optional

# submit()'s prelude: actor id -> the calls [(method, args), ...] to send that actor before its request
Prelude = Optional[Callable[[int], list[tuple[str, tuple]]]]


class ActorGroupBase:
    num_restarts: int = 0
    num_timeouts: int = 0
    num_dropped_requests: int = 0
    max_in_flight: int = 1

    def __init__(self) -> None:
        # Returns [(method, args), ...] to replay on a recreated actor (weights, global vars).
        self.on_restart: Callable[[], list[tuple[str, tuple]]] | None = None
        self.generations: dict[int, int] = {}  # actor id -> times it was recreated; absent: never

    def generation(self, actor_id: int) -> int:
        """How often actor ``actor_id`` has been recreated. A result tagged with an older
        generation came from an actor that is gone (e.g. slots of a replay shard now empty)."""
        return self.generations.get(actor_id, 0)

    @property
    def actor_ids(self) -> list[int]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.actor_ids)

    def put(self, obj: Any) -> Any:
        return obj

    def start(self) -> "ActorGroupBase":
        """The actors exist from construction on; a lazy group creates them here."""
        return self

    # ---- what every group does (in the driver: LocalActorGroup; on Ray: RayActorGroup) -----
    actors: dict[int, Any]  # actor id -> the actor (in-process object or Ray handle)

    def proxies(self, wait: bool = False) -> dict[int, Any]:
        raise NotImplementedError

    def node_ids(self) -> dict[int, str]:
        """Where each actor runs (Ray node ids); only a Ray group has nodes."""
        raise NotImplementedError

    def foreach(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, wait: bool = True, **kwargs: Any
    ) -> list[Any]:
        raise NotImplementedError

    def call(self, actor_id: int, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def submit(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, prelude: Prelude = None, **kwargs: Any
    ) -> int:
        """Send ``method`` to each actor with fewer than ``max_in_flight`` requests open; the number
        sent. ``prelude(actor_id)`` names calls ``[(method, args), ...]`` to send that actor just
        before its request (e.g. the weights it has not had yet), so they arrive first."""
        raise NotImplementedError

    def fetch_ready(self, timeout_s: float | None = 0.0) -> list[tuple[int, Any]]:
        raise NotImplementedError

    def num_in_flight(self, actor_id: int | None = None) -> int:
        raise NotImplementedError

    def restart(self, i: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class LocalActorGroup(ActorGroupBase):
    def __init__(
        self,
        cls: type,
        num_actors: int,
        ctor: Callable[[int], tuple[tuple, dict]],
        max_in_flight: int = 1,
        first_index: int = 1,
    ) -> None:
        super().__init__()
        self.cls, self.ctor = cls, ctor
        self.actors: dict[int, Any] = {}
        for i in range(first_index, first_index + num_actors):
            args, kwargs = ctor(i)
            self.actors[i] = cls(*args, **kwargs)
        self.max_in_flight = max_in_flight
        self._ready: deque[tuple[int, Any]] = deque()
        self._in_flight: dict[int, int] = {i: 0 for i in self.actors}

    @property
    def actor_ids(self) -> list[int]:
        return list(self.actors)

    def proxies(self, wait: bool = False) -> dict[int, Any]:
        """In-process, the objects themselves stand in for proxies (their calls always return)."""
        return dict(self.actors)

    def foreach(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, wait: bool = True, **kwargs: Any
    ) -> list[Any]:
        ids = list(actor_ids) if actor_ids is not None else list(self.actors)
        results = [getattr(self.actors[i], method)(*args, **kwargs) for i in ids]
        return results if wait else []

    def call(self, actor_id: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.actors[actor_id], method)(*args, **kwargs)

    def submit(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, prelude: Prelude = None, **kwargs: Any
    ) -> int:
        n = 0
        for i in list(actor_ids) if actor_ids is not None else list(self.actors):
            if self._in_flight[i] >= self.max_in_flight:
                continue
            for before, before_args in prelude(i) if prelude else []:
                getattr(self.actors[i], before)(*before_args)
            self._ready.append((i, getattr(self.actors[i], method)(*args, **kwargs)))
            self._in_flight[i] += 1
            n += 1
        return n

    def fetch_ready(self, timeout_s: float | None = 0.0) -> list[tuple[int, Any]]:
        out = list(self._ready)
        self._ready.clear()
        for i, _ in out:
            self._in_flight[i] -= 1
        return out

    def num_in_flight(self, actor_id: int | None = None) -> int:
        return self._in_flight[actor_id] if actor_id is not None else sum(self._in_flight.values())

    def restart(self, i: int) -> None:
        """Replace actor ``i`` with a fresh one from its constructor, as the Ray group does after a
        failure: its queued results are dropped and ``on_restart()`` is replayed on it."""
        stop = getattr(self.actors[i], "stop", None)
        if stop:
            stop()
        kept = [(j, r) for j, r in self._ready if j != i]
        self.num_dropped_requests += len(self._ready) - len(kept)
        self._ready = deque(kept)
        self._in_flight[i] = 0
        args, kwargs = self.ctor(i)
        self.actors[i] = actor = self.cls(*args, **kwargs)
        self.num_restarts += 1
        self.generations[i] = self.generation(i) + 1
        for method, margs in self.on_restart() if self.on_restart else []:
            getattr(actor, method)(*margs)

    def stop(self) -> None:
        for a in self.actors.values():
            stop = getattr(a, "stop", None)
            if stop:
                stop()
        self.actors.clear()
