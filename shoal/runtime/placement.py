"""One placement group per run: what an algorithm's actors need, reserved all at once.

An algorithm declares its parts (:meth:`Algorithm.resource_plan`): the driver, then named
groups of actors (rollout actors, evaluation actors, Ape-X replay shards, DD-PPO workers),
one bundle per actor. :class:`RunPlacement` reserves the bundles the run's Ray actors need in
**one** placement group when the first actor starts, failing at once with each part's needs
and the cluster's totals when the run cannot fit; each actor group then places actor *k* in
its own bundle, and a recreated actor goes back into the same bundle.

Inside a Ray Tune trial the trial has already been given exactly these bundles (the trainable
asks for them, the driver's first), so the run uses the trial's placement group instead of
reserving another.
"""

from __future__ import annotations

import dataclasses
from typing import Any

DRIVER = "driver"


@dataclasses.dataclass(frozen=True)
class BundleGroup:
    """``count`` actors named ``name`` (as in messages), each reserving ``cpus`` and ``gpus``.

    ``node``: None (any node) or ``"driver"`` (the driver's node, e.g. Ape-X replay shards).
    ``cpu_key``: the config key that sets the CPUs, for the advice when they are short.
    ``spread``: spread the run's bundles over the nodes (the placement group's strategy becomes
    SPREAD, e.g. for learner shards). ``sizes``: ``(cpus, gpus)`` per bundle where they differ
    (``count`` is then their number; ``cpus`` and ``gpus`` the largest).
    """

    name: str
    count: int
    cpus: float
    gpus: float = 0.0
    node: str | None = None
    spread: bool = False
    sizes: tuple[tuple[float, float], ...] | None = None
    cpu_key: str = "resources.num_cpus_per_worker"  # the config key that sets ``cpus``, named when CPUs are short

    def bundles(self) -> list[dict[str, float]]:
        """One bundle per actor (empty ones left out: an actor that reserves nothing needs none)."""
        sizes = self.sizes if self.sizes is not None else [(self.cpus, self.gpus)] * self.count
        out = [{k: v for k, v in (("CPU", c), ("GPU", g)) if v > 0} for c, g in sizes]
        return [b for b in out if b]

    def describe(self) -> str:
        sizes = self.sizes if self.sizes is not None else [(self.cpus, self.gpus)]
        need = " / ".join(
            " + ".join(f"{v:g} {k}" for k, v in (("CPU", c), ("GPU", g)) if v > 0) or "nothing"
            for c, g in dict.fromkeys(sizes)
        )
        return f"{self.count} {self.name}{'s' if self.count != 1 else ''} x {need}"


def tune_bundles(groups: list[BundleGroup]) -> list[dict[str, float]]:
    """The bundles a Tune trial asks for: the driver's first (Tune's head bundle, where the trainable
    runs), then one per actor that reserves anything, in plan order."""
    driver = next((g for g in groups if g.name == DRIVER), BundleGroup(DRIVER, 1, 1.0))
    head = (driver.bundles() or [{"CPU": 0.001}])[0]  # Tune wants a non-empty head bundle
    return [head] + [b for g in groups if g.name != DRIVER for b in g.bundles()]


def plan_strategy(groups: list[BundleGroup]) -> str:
    """``"SPREAD"`` when a group asks to be spread over the nodes, else ``"PACK"``."""
    return "SPREAD" if any(g.spread and g.bundles() for g in groups) else "PACK"


class RunPlacement:
    """The run's placement group and which bundles belong to each named group of actors.

    ``reserve()`` makes it (or adopts the current Tune trial's); ``slot(name)`` gives an actor
    group's ``(placement group, bundle indices)``; ``release()`` removes a group it reserved.
    """

    def __init__(self, groups: list[BundleGroup], *, what: str = "this run", wait_s: float = 30.0) -> None:
        self.groups, self.what, self.wait_s = groups, what, wait_s
        self.pg: Any = None
        self.owned = False
        self.indices: dict[str, list[int]] = {}

    def actor_groups(self) -> list[BundleGroup]:
        """The parts that reserve a bundle each (the driver is not a Ray actor outside Tune)."""
        return [g for g in self.groups if g.name != DRIVER and len(g.bundles()) == g.count > 0]

    def _assign(self, first: int) -> None:
        k = first
        for g in self.actor_groups():
            self.indices[g.name] = list(range(k, k + g.count))
            k += g.count

    def reserve(self) -> "RunPlacement":
        """Adopt the current Tune trial's placement group, or reserve one for the actors. Idempotent."""
        if self.pg is not None or not self.actor_groups():
            return self
        import ray
        from ray.util import get_current_placement_group

        current = get_current_placement_group()
        if current is not None:
            self._adopt(current)
            return self
        from shoal.runtime.cluster import reserve

        node = ray.get_runtime_context().get_node_id()
        bundles, selectors = [], []
        for g in self.actor_groups():
            bundles += g.bundles()
            selectors += [{"ray.io/node-id": node} if g.node == DRIVER else {}] * g.count
        self.pg = reserve(
            bundles,
            what=self.what,
            wait_s=self.wait_s,
            strategy=plan_strategy(self.groups),
            parts=", ".join(g.describe() for g in self.actor_groups()),
            selectors=selectors,
            cpu_hint=self.cpu_hint(),
        )
        self.owned = True
        self._assign(0)
        return self

    def _adopt(self, pg: Any) -> None:
        from shoal.errors import ResourceError

        want = tune_bundles(self.groups)
        have = pg.bundle_specs
        if len(have) < len(want):
            raise ResourceError(
                f"{self.what} runs inside a placement group of {len(have)} bundles but needs {len(want)} "
                f"({self.describe()}): ask for shoal.app.tune's resources (ShoalTrainable does)."
            )
        self.pg, self.owned = pg, False
        self._assign(1)  # bundle 0 is the trial's head: the driver

    def cpu_hint(self) -> str:
        keys = list(dict.fromkeys(g.cpu_key for g in self.actor_groups() if g.cpus > 0))
        return (
            f"Lower resources.num_workers, or what the parts reserve ({', '.join(keys)}; fractions share "
            "cores, e.g. --set resources.num_cpus_per_worker=0.5)."
        )

    def describe(self) -> str:
        return ", ".join(g.describe() for g in self.groups if g.count > 0)

    def slot(self, name: str) -> tuple[Any, tuple[int, ...]] | None:
        """``(placement group, bundle indices)`` for the actor group ``name``; None when it reserves nothing."""
        self.reserve()
        if name not in self.indices:
            return None
        return self.pg, tuple(self.indices[name])

    def release(self) -> None:
        if self.owned:
            from shoal.runtime.cluster import release

            release(self.pg)
        self.pg, self.owned, self.indices = None, False, {}
