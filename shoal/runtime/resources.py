"""What one actor group asks of the cluster, in one record."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ActorResources:
    """Resources and placement of every actor in one group.

    - ``num_cpus`` / ``num_gpus``: reserved per actor (a placement-group bundle each);
    - ``max_restarts``: restarts of dead actors the group allows in any ``restart_window_s`` seconds;
    - ``request_timeout_s``: a request still open after this many seconds counts as a failure of
      its actor, which is killed and recreated (None: wait as long as it takes);
    - ``start_timeout_s``: an actor not started this long after its creation, while a request
      waits on it, counts as hung the same way (None: no limit);
    - ``resource_wait_s``: how long to wait for the cluster to have room before a clear error;
    - ``address``: the Ray cluster to join (None starts or reuses a local one);
    - ``node``: None (anywhere), ``"driver"`` (this process's node) or a Ray node id;
    - ``strategy``: the placement group's, ``"PACK"`` or ``"SPREAD"`` (as many nodes as can take them);
    - ``placement``: ``(placement group, bundle indices)`` in the run's one placement group
      (:class:`~shoal.runtime.placement.RunPlacement`), one bundle per actor; None: the group
      reserves a placement group of its own.

    In-process groups (``remote=False``) ignore all of it.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_restarts: int = 100
    restart_window_s: float = 600.0
    request_timeout_s: float | None = None
    start_timeout_s: float | None = None
    resource_wait_s: float = 30.0
    address: str | None = None
    node: str | None = None
    strategy: str = "PACK"
    placement: Any = None

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"actor resources must be >= 0, got num_cpus={self.num_cpus}, num_gpus={self.num_gpus}")
        if self.restart_window_s <= 0:
            raise ValueError(f"restart_window_s must be > 0, got {self.restart_window_s}")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {self.request_timeout_s}")
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0 or None, got {self.start_timeout_s}")
        if self.strategy not in ("PACK", "SPREAD"):
            raise ValueError(f"placement strategy must be 'PACK' or 'SPREAD', got {self.strategy!r}")

    def replace(self, **changes: Any) -> "ActorResources":
        """A copy with ``changes`` applied (unknown names raise TypeError)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of_workers(cls, resources: Any, **changes: Any) -> "ActorResources":
        """What a run's ``resources`` config section gives each rollout actor, with ``changes``."""
        base = cls(
            num_cpus=resources.num_cpus_per_worker,
            max_restarts=resources.max_worker_restarts,
            restart_window_s=resources.worker_restart_window_s,
            request_timeout_s=resources.request_timeout_s,
            start_timeout_s=getattr(resources, "actor_start_timeout_s", None),
            resource_wait_s=resources.resource_wait_s,
            address=resources.address,
            strategy=resources.worker_placement,
        )
        return base.replace(**changes)
