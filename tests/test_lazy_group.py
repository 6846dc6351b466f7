"""The lazy actor group: actors (and Ray) start on the first call that needs them.

A restored algorithm that only evaluates, reads its weights or saves starts nothing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from shoal.runtime import make_actor_group
from shoal.runtime.lazy import LazyActorGroup

CREATED: list[int] = []


class Counter:
    """Records its construction and the calls it receives."""

    def __init__(self, index: int):
        CREATED.append(index)
        self.index, self.calls = index, []

    def set(self, name, value):
        self.calls.append((name, value))

    def note(self, value):
        self.calls.append(("note", value))

    def get(self):
        return self.index, list(self.calls)


def lazy_group(n: int = 2) -> LazyActorGroup:
    CREATED.clear()
    return LazyActorGroup(
        lambda: make_actor_group(Counter, n, lambda i: ((i,), {}), remote=False, max_in_flight=2),
        n,
        first_index=1,
        max_in_flight=2,
    )


def test_nothing_is_created_until_a_call_needs_the_actors():
    g = lazy_group()
    assert g.actor_ids == [1, 2] and len(g) == 2 and g.max_in_flight == 2
    assert g.put("w") == "w"  # identity before creation
    assert g.foreach("set", "weights", 1, wait=False) == []
    assert g.fetch_ready(timeout_s=0.1) == [] and g.num_in_flight() == 0  # nothing can be in flight yet
    assert g.num_restarts == 0 and g.num_dropped_requests == 0
    g.stop()
    assert CREATED == [] and not g.created


def test_creation_replays_the_latest_setters_then_on_restart():
    g = lazy_group()
    g.on_restart = lambda: [("set", ("global_vars", 7))]
    g.foreach("set", "weights", 1, wait=False)
    g.foreach("set", "weights", 2, wait=False)  # replaces the call above: only the latest is replayed
    g.foreach("set", "weights", 3, actor_ids=[1], wait=False)  # dropped too: on_restart() also calls "set"
    g.foreach("note", 0, actor_ids=[2], wait=False)
    assert CREATED == []
    got = dict(g.foreach("get"))  # a call that waits for results creates the actors
    assert CREATED == [1, 2] and g.created
    # on_restart() describes the current state, so a recorded call of the same method yields to it
    assert got == {1: [("global_vars", 7)], 2: [("note", 0), ("global_vars", 7)]}
    assert g.on_restart is g.group.on_restart  # the real group re-syncs its recreated actors the same way
    g.foreach("set", "later", 3, wait=False)  # once created, calls go straight through
    assert dict(g.foreach("get"))[1][-1] == ("later", 3)
    g.stop()


def test_each_call_that_needs_actors_creates_them():
    for use in (
        lambda g: g.submit("get"),
        lambda g: g.call(1, "get"),
        lambda g: g.proxies(),
        lambda g: g.actors,
        lambda g: g.start(),
    ):
        g = lazy_group()
        use(g)
        assert CREATED == [1, 2] and g.created
        g.stop()
    g = lazy_group()
    assert g.submit("get") == 2 and sorted(i for i, _ in g.fetch_ready()) == [1, 2]
    g.stop()


@pytest.mark.parametrize(
    "algo, config",
    [
        ("ppo", 'PPOConfig(env="CartPole-v1", seed=0, resources={"num_workers": 2, "num_envs_per_worker": 2})'),
        ("apex", 'ApeXConfig(env="CartPole-v1", seed=0, resources={"num_workers": 2, "num_envs_per_worker": 2})'),
    ],
)
def test_a_restored_algorithm_evaluates_and_saves_without_starting_ray_or_actors(tmp_path, algo, config):
    """In a fresh process, so that no other test's Ray instance counts."""
    script = textwrap.dedent(f"""
        import sys
        from shoal import Algorithm
        from shoal.algorithms.apex import ApeXConfig
        from shoal.algorithms.ppo import PPOConfig

        cfg = {config}
        with cfg.build() as algo:
            algo.save({str(tmp_path / "a")!r})
        with Algorithm.from_checkpoint({str(tmp_path / "a")!r}) as algo:
            assert algo.evaluate(num_episodes=2)["num_episodes"] == 2
            assert algo.get_weights()
            algo.save({str(tmp_path / "b")!r})
            assert algo.env_runners.actor_ids == [1, 2] and not algo.env_runners.created
            assert not getattr(algo, "shards", algo.env_runners).created  # Ape-X: its replay shards neither
        import ray
        print("ray started:", ray.is_initialized())
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "ray started: False" in p.stdout
    assert (tmp_path / "b" / "state.pt").is_file()
