"""WeightsPublisher: how the learned weights reach an algorithm's rollout actors, one owner for all.

Every algorithm publishes through ``Algorithm.publisher``; what differs between them is only when a
published version is delivered:

- to every actor at once (``send()``): PPO, DQN, SAC, a league's sync message;
- to each actor with its next sample request (``due(actor_id)`` as a ``submit`` prelude): IMPALA and
  APPO, so a broadcast costs the driver nothing per actor (``benchmarks/driver_scaling.py``);
- to the actors named (``send(actor_ids)``): Ape-X's actors that sampled ``max_weight_sync_delay``
  steps since their last weights.

A recreated actor is brought up to date by ``restart_calls()``: the latest published calls, or what
the publisher's ``full`` callable says when a version holds only changes (the league's message).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

Calls = list[tuple[str, tuple]]  # (actor method, args) pairs


class WeightsPublisher:
    """The latest published version of what rollout actors must hold, and who has it.

    ``group``: a callable returning the actor group (an algorithm makes its group in ``setup()``,
    after the publisher exists), or None while there is none. ``full``: the calls that bring an
    actor that has nothing up to date, when a published version is a delta; by default the
    latest version itself.
    """

    def __init__(self, group: Callable[[], Any], full: Optional[Callable[[], Calls]] = None) -> None:
        self._group = group
        self._full = full
        self.version = 0
        self.calls: Calls = []  # the latest version: what an actor that has not had it is sent
        self.sent: dict[int, tuple[int, int]] = {}  # actor id -> (its generation, the version it was sent)

    @property
    def group(self) -> Any:
        return self._group()

    def put(self, obj: Any) -> Any:
        """One object-store put of ``obj`` in the group's store (``obj`` itself without a group)."""
        group = self.group
        return obj if group is None else group.put(obj)

    def publish(self, calls: Calls) -> None:
        """A new version: ``calls`` (each argument already put, so every actor takes the same reference)."""
        self.version += 1
        self.calls = list(calls)

    def publish_weights(self, weights: Any, extra: Sequence[tuple[str, tuple]] = ()) -> Any:
        """Publish ``weights`` (one put) followed by ``extra`` calls; returns the weights' reference."""
        ref = self.put(weights)
        self.publish([("set_weights", (ref,)), *extra])
        return ref

    def send(self, actor_ids: Optional[list[int]] = None) -> None:
        """Deliver the latest version now: to every actor, or to those of ``actor_ids``."""
        group = self.group
        if group is None or not self.calls:
            return
        for method, args in self.calls:
            if actor_ids is None:
                group.foreach(method, *args, wait=False)
            else:
                group.foreach(method, *args, actor_ids=actor_ids, wait=False)
        for i in actor_ids or []:
            self.sent[i] = (group.generation(i), self.version)

    def due(self, actor_id: int) -> Calls:
        """The calls actor ``actor_id`` has not had yet (a recreated actor is sent them again)."""
        if not self.calls:
            return []
        mark = (self.group.generation(actor_id), self.version)
        if self.sent.get(actor_id) == mark:
            return []
        self.sent[actor_id] = mark
        return self.calls

    def restart_calls(self) -> Calls:
        """What a recreated (or lazily started) actor is sent to hold the latest version."""
        return self._full() if self._full is not None else list(self.calls)

    def latest(self, method: str = "set_weights") -> Any:
        """The first argument of the latest version's ``method`` call (the weights' reference), or None."""
        return next((args[0] for m, args in self.calls if m == method), None)
