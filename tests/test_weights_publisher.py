"""WeightsPublisher: one owner for how weights reach rollout actors; three ways to deliver a
version (all at once, with each actor's next request, to the stale ones), and what a recreated
actor is sent. In-process actor groups; the algorithms' uses of it on a small run each."""

from __future__ import annotations

import numpy as np

from shoal.framework.weights_publisher import WeightsPublisher
from shoal.runtime import make_actor_group


class _Recorder:
    """A rollout actor that records the calls it gets, in order."""

    def __init__(self, i: int) -> None:
        self.log: list[tuple] = []

    def set_weights(self, weights) -> None:
        self.log.append(("set_weights", weights))

    def set_normalizer(self, state) -> None:
        self.log.append(("set_normalizer", state))

    def sample(self) -> str:
        self.log.append(("sample",))
        return "fragment"


def _group(n: int = 3):
    return make_actor_group(_Recorder, n, lambda i: ((i,), {}), remote=False, max_in_flight=1)


def test_latest_weights_go_to_each_actor_once_just_before_its_next_request():
    group = _group()
    latest = WeightsPublisher(lambda: group)
    assert group.submit("sample", prelude=latest.due) == 3  # nothing published yet: nothing before it
    group.fetch_ready()
    latest.publish([("set_weights", ("w1",)), ("set_normalizer", ("n1",))])
    latest.publish([("set_weights", ("w2",)), ("set_normalizer", ("n2",))])  # two versions, no request between
    group.submit("sample", actor_ids=[1, 2], prelude=latest.due)
    group.fetch_ready()
    group.submit("sample", actor_ids=[1], prelude=latest.due)  # actor 1 has version 2 already
    group.fetch_ready()
    group.restart(2)  # a recreated actor is sent the latest again with its next request
    group.submit("sample", actor_ids=[2, 3], prelude=latest.due)
    logs = {i: a.log for i, a in group.actors.items()}
    assert logs[1] == [("sample",), ("set_weights", "w2"), ("set_normalizer", "n2"), ("sample",), ("sample",)]
    assert logs[2] == [("set_weights", "w2"), ("set_normalizer", "n2"), ("sample",)]
    assert logs[3] == [("sample",), ("set_weights", "w2"), ("set_normalizer", "n2"), ("sample",)]


def test_send_reaches_every_actor_or_the_named_ones_and_marks_them():
    group = _group()
    pub = WeightsPublisher(lambda: group)
    pub.send()  # nothing published: nothing sent
    ref = pub.publish_weights("w1", [("set_normalizer", ("n1",))])
    assert ref == "w1" and pub.latest() == "w1" and pub.version == 1  # in-process: the put is the object
    pub.send()
    pub.publish_weights("w2")
    pub.send(actor_ids=[2])  # the stale one only
    assert pub.due(2) == []  # actor 2 holds version 2: its next request carries nothing
    assert pub.due(3) == [("set_weights", ("w2",))]
    logs = {i: a.log for i, a in group.actors.items()}
    assert logs[1] == [("set_weights", "w1"), ("set_normalizer", "n1")]
    assert logs[2] == [("set_weights", "w1"), ("set_normalizer", "n1"), ("set_weights", "w2")]
    assert logs[3] == logs[1]


def test_a_recreated_actor_gets_the_latest_version_or_the_full_state():
    group = _group(2)
    pub = WeightsPublisher(lambda: group)
    group.on_restart = pub.restart_calls
    assert pub.restart_calls() == [] and pub.latest() is None
    pub.publish_weights("w1")
    pub.publish_weights("w2")
    group.restart(1)
    assert group.actors[1].log == [("set_weights", "w2")]
    # a version that holds only changes: a recreated actor is sent the full state instead
    full = WeightsPublisher(lambda: group, full=lambda: [("set_weights", ("everything",))])
    full.publish([("set_weights", ("delta",))])
    assert full.restart_calls() == [("set_weights", ("everything",))]
    group.on_restart = full.restart_calls
    group.restart(2)
    assert group.actors[2].log == [("set_weights", "everything")]


def test_without_a_group_publishing_keeps_the_weights_themselves():
    pub = WeightsPublisher(lambda: None)
    pub.publish_weights({"w": 1})
    pub.send()
    assert pub.latest() == {"w": 1} and pub.restart_calls() == [("set_weights", ({"w": 1},))]


def _weights_equal(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_ppo_publishes_each_update_and_a_recreated_actor_starts_from_it():
    from shoal.algorithms.ppo import PPOConfig

    algo = PPOConfig(
        env="CartPole-v1",
        seed=0,
        rollout_fragment_length=16,
        minibatch_size=32,
        num_sgd_iter=1,
        min_time_s_per_iteration=0,
    ).build()
    try:
        v0 = algo.publisher.version
        algo.train()
        assert algo.publisher.version > v0
        runners = algo.env_runners
        runners.restart(0)  # the driver's runner, recreated: it is sent the latest published weights
        assert _weights_equal(runners.call(0, "get_weights"), algo.get_weights())
    finally:
        algo.stop()
