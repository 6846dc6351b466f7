"""Where actors run. The only package that imports ray, and only when remote actors are asked for.

``make_actor_group(...)`` returns a :class:`LocalActorGroup` (plain objects in this process)
when ``remote=False`` and a Ray-backed group otherwise; both have the same interface:

- ``foreach(method, *args)``: call every healthy actor, wait, return the results;
- ``submit(method, *args, actor_ids=None)`` / ``fetch_ready(timeout_s)``: the asynchronous
  pattern (at most ``max_in_flight`` requests per actor; collect only what is ready);
- ``put(obj)``: one object-store put whose reference every actor can take;
- restarts of dead actors, and of actors whose request outlived ``request_timeout_s``, re-synced
  by ``on_restart``; ``num_restarts``, ``num_timeouts`` and ``num_dropped_requests`` counters;
- ``start()``: the actors exist from construction on, except in a :class:`LazyActorGroup`
  (``runtime/lazy.py``), which creates them on the first call that needs them.
"""

from __future__ import annotations

from typing import Any, Callable

from shoal.runtime.lazy import LazyActorGroup
from shoal.runtime.local import ActorGroupBase, LocalActorGroup
from shoal.runtime.resources import ActorResources


def make_actor_group(
    cls: type,
    num_actors: int,
    ctor: Callable[[int], tuple[tuple, dict]],
    *,
    remote: bool,
    resources: ActorResources | None = None,
    max_in_flight: int = 1,
    name: str = "actor",
    first_index: int = 1,
    about: str = "",
    **resource_changes: Any,
) -> ActorGroupBase:
    """Create ``num_actors`` instances of ``cls``; actor i gets ``cls(*args, **kwargs)`` from ``ctor(i)``.

    Indices start at ``first_index`` (rollout actors are 1..N; the driver's own runner is 0).
    ``resources`` says what each actor reserves and where the group goes (see
    :class:`ActorResources`); keyword arguments named like its fields change single values
    (``make_actor_group(..., remote=True, num_cpus=0.5)``). ``about`` says what the actors run
    (``"env CartPole-v1"``) in the log line of a Ray group's restart after a timeout.
    """
    resources = (resources or ActorResources()).replace(**resource_changes)
    if not remote:
        return LocalActorGroup(cls, num_actors, ctor, max_in_flight=max_in_flight, first_index=first_index)
    from shoal.runtime.cluster import start
    from shoal.runtime.ray_group import RayActorGroup

    start(resources.address)
    return RayActorGroup(
        cls, num_actors, ctor, resources, max_in_flight=max_in_flight, name=name, first_index=first_index, about=about
    )


def start(address: str | None = None, **kwargs: Any) -> None:
    """Start (or connect to) Ray. Idempotent."""
    from shoal.runtime.cluster import start as _start

    _start(address, **kwargs)


def cuda_index(gpu_id: int | str, visible: str | None) -> int:
    """The torch index (``cuda:k``) of the physical GPU ``gpu_id`` that Ray assigned to this process.

    Ray normally sets ``CUDA_VISIBLE_DEVICES`` (``visible``) to the assigned ids, so torch numbers
    them from 0 in that order; with it unset (Ray told not to set it) the id is the index itself.
    """
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if str(gpu_id) in ids:
            return ids.index(str(gpu_id))
    return int(gpu_id)


def assigned_cuda_device() -> str:
    """``cuda:k`` for the first GPU Ray assigned to this actor (it must have reserved one)."""
    import os

    import ray

    ids = ray.get_gpu_ids() if ray.is_initialized() else []
    if not ids:
        raise RuntimeError("this process was given no GPU by Ray: reserve one (num_gpus > 0) for the actor")
    return f"cuda:{cuda_index(ids[0], os.environ.get('CUDA_VISIBLE_DEVICES'))}"


def is_started() -> bool:
    """Whether this process is connected to a Ray instance (without importing Ray when it is not)."""
    import sys

    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def fetch_objects(refs: list) -> tuple[list, int]:
    """The objects behind ``refs`` (from this node's object store, or copied from another's), and
    how many were lost (their owner or node died): those are left out."""
    import ray

    try:
        return ray.get(refs), 0
    except ray.exceptions.RayError:
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayError:
                pass
        return out, len(refs) - len(out)


def resolve(obj: Any) -> Any:
    """``obj``, or the object behind it when it is a Ray object reference (what a group's ``put`` may return)."""
    import sys

    ray = sys.modules.get("ray")
    return ray.get(obj) if ray is not None and isinstance(obj, ray.ObjectRef) else obj


def shutdown() -> None:
    import sys

    if "ray" in sys.modules:
        from shoal.runtime.cluster import shutdown as _shutdown

        _shutdown()


__all__ = [
    "make_actor_group",
    "ActorResources",
    "start",
    "shutdown",
    "cuda_index",
    "assigned_cuda_device",
    "ActorGroupBase",
    "LocalActorGroup",
    "LazyActorGroup",
]
