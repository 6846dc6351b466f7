"""An actor group that creates its actors on the first call that needs them.

A restored algorithm that only evaluates, reads its weights or saves never needs rollout
actors; with this group it starts neither them nor Ray (which the real group would start).
Same interface as :class:`~shoal.runtime.local.LocalActorGroup` and the Ray group:

- known without creating anything: ``actor_ids``, ``len``, the counters and generations (0), ``put`` (the
  object itself, as in-process), ``fetch_ready`` / ``num_in_flight`` (nothing can be in flight);
- recorded, not sent: ``foreach(..., wait=False)``, the calls that set state (weights, global
  vars). Only the latest call per method and ``actor_ids`` is kept;
- creating the group: ``start()`` and every call that needs actors (``submit``, ``call``,
  ``foreach`` that waits, ``proxies``, ``node_ids``, ``actors``, ``restart``). The new actors
  get the recorded calls, then ``on_restart()``: the calls that bring a recreated actor up to
  date bring a new one up to date too, and a recorded call of a method ``on_restart()`` also
  makes is dropped, since ``on_restart()`` describes the current state.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from shoal.runtime.local import ActorGroupBase, Prelude


class LazyActorGroup(ActorGroupBase):
    def __init__(
        self, create: Callable[[], ActorGroupBase], num_actors: int, *, first_index: int = 1, max_in_flight: int = 1
    ) -> None:
        self.group: ActorGroupBase | None = None
        super().__init__()
        self._create = create
        self._ids = list(range(first_index, first_index + num_actors))
        self.max_in_flight = max_in_flight
        self._recorded: dict[tuple[str, tuple[int, ...] | None], tuple[tuple, dict]] = {}

    # ---- creation --------------------------------------------------------------------------
    @property
    def created(self) -> bool:
        return self.group is not None

    def start(self) -> ActorGroupBase:
        """Create the actors now (once) and bring them up to date; returns the real group."""
        if self.group is None:
            group = self._create()
            group.on_restart = self._on_restart
            sync = self._on_restart() if self._on_restart else []
            synced = {method for method, _ in sync}
            for (method, ids), (args, kwargs) in self._recorded.items():
                if method not in synced:
                    group.foreach(method, *args, actor_ids=ids, wait=False, **kwargs)
            for method, args in sync:
                group.foreach(method, *args, wait=False)
            self._recorded.clear()
            self.group = group
        return self.group

    @property
    def on_restart(self):
        return self._on_restart

    @on_restart.setter
    def on_restart(self, fn) -> None:
        self._on_restart = fn
        if self.group is not None:
            self.group.on_restart = fn

    # ---- known without actors ----------------------------------------------------------------
    @property
    def actor_ids(self) -> list[int]:
        return self.group.actor_ids if self.group is not None else list(self._ids)

    @property
    def num_restarts(self) -> int:
        return self.group.num_restarts if self.group is not None else 0

    @property
    def num_timeouts(self) -> int:
        return self.group.num_timeouts if self.group is not None else 0

    @property
    def num_dropped_requests(self) -> int:
        return self.group.num_dropped_requests if self.group is not None else 0

    def generation(self, actor_id: int) -> int:
        return self.group.generation(actor_id) if self.group is not None else 0

    def put(self, obj: Any) -> Any:
        return self.group.put(obj) if self.group is not None else obj

    def fetch_ready(self, timeout_s: float | None = 0.0) -> list[tuple[int, Any]]:
        return self.group.fetch_ready(timeout_s) if self.group is not None else []

    def num_in_flight(self, actor_id: int | None = None) -> int:
        return self.group.num_in_flight(actor_id) if self.group is not None else 0

    def foreach(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, wait: bool = True, **kwargs: Any
    ) -> list[Any]:
        if self.group is None and not wait:
            key = (method, tuple(actor_ids) if actor_ids is not None else None)
            self._recorded.pop(key, None)  # re-insert: replayed in the order of the latest calls
            self._recorded[key] = (args, kwargs)
            return []
        return self.start().foreach(method, *args, actor_ids=actor_ids, wait=wait, **kwargs)

    # ---- need the actors -----------------------------------------------------------------------
    def submit(
        self, method: str, *args: Any, actor_ids: Iterable[int] | None = None, prelude: Prelude = None, **kwargs: Any
    ) -> int:
        return self.start().submit(method, *args, actor_ids=actor_ids, prelude=prelude, **kwargs)

    def call(self, actor_id: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.start().call(actor_id, method, *args, **kwargs)

    def proxies(self, wait: bool = False) -> dict[int, Any]:
        return self.start().proxies(wait=wait)

    def node_ids(self) -> dict[int, str]:
        return self.start().node_ids()

    @property
    def actors(self) -> dict[int, Any]:
        return self.start().actors

    def restart(self, i: int) -> None:
        self.start().restart(i)

    def stop(self) -> None:
        """Stop the actors if they were created; a later call that needs them creates new ones."""
        if self.group is not None:
            self.group.stop()
        self.group = None
        self._recorded.clear()
