"""Atomic checkpoints (shoal.checkpoint) and algorithm save / restore / reproducibility."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from shoal import checkpoint as ckpt
from shoal.algorithms.ppo import PPO, PPOConfig
from shoal.errors import CheckpointError
from shoal.framework.base import Algorithm

torch.set_num_threads(1)


def state(x: float = 1.0) -> dict:
    return {
        "iteration": 3,
        "counters": {"env_steps_sampled": 100.0},
        "weights": {"w": torch.full((2, 3), x), "b": torch.arange(3)},
        "names": ["a", "b"],
        "lr": 1e-3,
    }


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def assert_state_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_state_equal(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
        else:
            assert a[k] == b[k]


def test_save_load_round_trip(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "ck", state(), {"algo": "ppo", "iteration": 3})
    assert p == tmp_path / "ck"
    assert (p / "state.pt").is_file() and (p / "meta.json").is_file()
    loaded, meta = ckpt.load_checkpoint(p)
    assert_state_equal(loaded, state())
    assert meta["format"] == "shoal-checkpoint" and meta["format_version"] == 1
    assert meta["algo"] == "ppo" and meta["iteration"] == 3
    assert meta == json.loads((p / "meta.json").read_text())
    assert leftovers(tmp_path) == []


def test_state_loads_with_weights_only(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "ck", state(2.0), {"algo": "ppo"})
    loaded = torch.load(p / "state.pt", weights_only=True)
    assert_state_equal(loaded, state(2.0))


def test_save_creates_parents(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "a" / "b" / "ck", state(), {})
    assert ckpt.read_meta(p)["format"] == "shoal-checkpoint"


def test_overwrite_replaces_and_leaves_no_temp_dirs(tmp_path):
    p = tmp_path / "ck"
    ckpt.save_checkpoint(p, state(1.0), {"iteration": 1})
    (p / "stale.txt").write_text("from the first save")
    ckpt.save_checkpoint(p, state(5.0), {"iteration": 2})
    loaded, meta = ckpt.load_checkpoint(p)
    assert_state_equal(loaded, state(5.0))
    assert meta["iteration"] == 2
    assert not (p / "stale.txt").exists()  # replaced as a whole, not merged
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ck"]


def test_failing_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    p = tmp_path / "ck"
    ckpt.save_checkpoint(p, state(1.0), {"iteration": 1})

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(p, state(9.0), {"iteration": 2})
    monkeypatch.undo()
    loaded, meta = ckpt.load_checkpoint(p)
    assert_state_equal(loaded, state(1.0))
    assert meta["iteration"] == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ck"]  # no temp directory left


def test_failing_first_save_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("nope")))
    with pytest.raises(RuntimeError):
        ckpt.save_checkpoint(tmp_path / "ck", state(), {})
    assert list(tmp_path.iterdir()) == []


def test_missing_path(tmp_path):
    for fn in (ckpt.load_checkpoint, ckpt.read_meta, ckpt.resolve_checkpoint):
        with pytest.raises(CheckpointError, match="does not exist"):
            fn(tmp_path / "nope")


def test_directory_that_is_not_a_checkpoint(tmp_path):
    d = tmp_path / "something"
    d.mkdir()
    (d / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="not a shoal checkpoint"):
        ckpt.read_meta(d)
    with pytest.raises(CheckpointError, match="No shoal checkpoint found"):
        ckpt.load_checkpoint(d)
    # meta.json present but state.pt missing
    (d / "meta.json").write_text(json.dumps({"format": "shoal-checkpoint"}))
    with pytest.raises(CheckpointError, match="not a shoal checkpoint"):
        ckpt.load_checkpoint(d)


def test_meta_with_other_format(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "ck", state(), {})
    (p / "meta.json").write_text(json.dumps({"format": "other-tool", "format_version": 1}))
    with pytest.raises(CheckpointError, match="not a shoal checkpoint.*lacks format 'shoal-checkpoint'"):
        ckpt.load_checkpoint(p)
    (p / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not JSON"):
        ckpt.load_checkpoint(p)
    (p / "meta.json").write_text(json.dumps({"format": "shoal-checkpoint", "format_version": 99}))
    with pytest.raises(CheckpointError, match="newer shoal"):
        ckpt.load_checkpoint(p)


def test_corrupt_state(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "ck", state(), {})
    (p / "state.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="Cannot load"):
        ckpt.load_checkpoint(p)


def test_pickled_code_is_refused(tmp_path):
    p = ckpt.save_checkpoint(tmp_path / "ck", state(), {})
    torch.save({"obj": np.random.default_rng(0)}, p / "state.pt")  # not loadable with weights_only
    with pytest.raises(CheckpointError, match="Cannot load"):
        ckpt.load_checkpoint(p)


def test_resolve_checkpoint_in_run_dir(tmp_path):
    run = tmp_path / "run"
    cdir = run / "checkpoints"
    for i in (1, 2, 10):
        ckpt.save_checkpoint(cdir / f"checkpoint_{i:06d}", state(float(i)), {"iteration": i})
    ckpt.save_checkpoint(cdir / "best", state(0.5), {"iteration": 2})
    (cdir / "checkpoint_000011").mkdir()  # no meta.json: ignored
    assert [p.name for p in ckpt.list_checkpoints(cdir)] == [
        "checkpoint_000001",
        "checkpoint_000002",
        "checkpoint_000010",
    ]
    assert ckpt.resolve_checkpoint(run) == cdir / "checkpoint_000010"
    assert ckpt.resolve_checkpoint(run, prefer="best") == cdir / "best"
    assert ckpt.resolve_checkpoint(cdir) == cdir / "checkpoint_000010"
    assert ckpt.resolve_checkpoint(cdir, prefer="best") == cdir / "best"
    assert ckpt.resolve_checkpoint(cdir / "checkpoint_000002") == cdir / "checkpoint_000002"
    loaded, meta = ckpt.load_checkpoint(run)
    assert meta["iteration"] == 10
    # only best: used for either preference
    run2 = tmp_path / "run2"
    ckpt.save_checkpoint(run2 / "checkpoints" / "best", state(), {"iteration": 4})
    assert ckpt.resolve_checkpoint(run2) == run2 / "checkpoints" / "best"
    # an empty run directory
    (tmp_path / "run3" / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="No shoal checkpoint found"):
        ckpt.resolve_checkpoint(tmp_path / "run3")
    assert ckpt.list_checkpoints(tmp_path / "missing") == []


def test_an_opened_checkpoint_reads_its_meta_once_and_its_state_when_first_asked(tmp_path, monkeypatch):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run / "checkpoints" / "checkpoint_000001", state(1.0), {"iteration": 1})
    ckpt.save_checkpoint(run / "checkpoints" / "best", state(2.0), {"iteration": 1})
    loads, real_load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(f) or real_load(f, *a, **k))
    opened = ckpt.open_checkpoint(run, prefer="best", run=False)
    assert opened.path == run / "checkpoints" / "best" and str(opened) == str(opened.path)
    assert opened.meta["iteration"] == 1 and opened.meta["format"] == ckpt.FORMAT
    assert loads == []  # nothing loaded until the state is asked for
    assert opened.state["weights"]["w"][0, 0].item() == 2.0
    assert opened.state is opened.state and len(loads) == 1  # loaded once, then kept
    assert ckpt.open_checkpoint(opened, run=False) is opened  # an opened checkpoint is not opened again
    assert ckpt.open_checkpoint(run, run=False).path == run / "checkpoints" / "checkpoint_000001"
    # an algorithm's checkpoint must say what rebuilds it: checked on the meta already read
    with pytest.raises(ckpt.DamagedCheckpoint, match="its 'algo' is missing"):
        ckpt.open_checkpoint(opened)
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.open_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="not a shoal checkpoint"):
        ckpt.open_checkpoint(run / "checkpoints", resolve=False, run=False)  # the directory itself


# ---- algorithm level ----------------------------------------------------------------------
def small_config(**kw) -> PPOConfig:
    return PPOConfig(
        env="CartPole-v1",
        seed=0,
        train_batch_size=512,
        minibatch_size=256,
        num_sgd_iter=2,
        resources={"num_envs_per_worker": 4},
        **kw,
    )


VOLATILE = ("time", "timers/", "per_s")


def deterministic(result: dict) -> dict:
    return {k: v for k, v in result.items() if not any(w in k for w in VOLATILE)}


def weights_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    algo = small_config().build()
    results = [algo.train() for _ in range(2)]
    path = algo.save(tmp_path_factory.mktemp("algo") / "checkpoint_000002")
    yield algo, results, path
    algo.stop()


def test_algorithm_checkpoint_meta_and_state(trained):
    algo, results, path = trained
    meta = ckpt.read_meta(path)
    assert meta["algo"] == "ppo" and meta["iteration"] == 2
    assert meta["env_steps_sampled"] == results[-1]["env_steps_sampled"]
    assert PPOConfig.from_dict(meta["config"]) == algo.config
    raw = torch.load(path / "state.pt", weights_only=True)
    assert raw["iteration"] == 2
    assert set(raw["learner"]) >= {"module", "optimizer", "extra", "num_updates"}
    # 2 iterations x 2 epochs x 2 minibatches (a ~500-row batch in 256-row minibatches)
    assert raw["learner"]["num_updates"] == 8


def test_from_checkpoint_restores_and_continues(trained):
    algo, results, path = trained
    restored = Algorithm.from_checkpoint(path)
    try:
        assert isinstance(restored, PPO)
        assert restored.iteration == 2
        assert restored.counters == algo.counters
        assert restored.episodes.total == results[-1]["episodes_total"]
        assert restored.learner.extra_state == algo.learner.extra_state
        assert restored.learner.num_updates == algo.learner.num_updates
        for k, v in algo.learner.module.state_dict().items():
            torch.testing.assert_close(restored.learner.module.state_dict()[k], v, rtol=0, atol=0)
        # the optimizer moments came back too
        o1, o2 = algo.learner.optimizer.state_dict()["state"], restored.learner.optimizer.state_dict()["state"]
        assert o1.keys() == o2.keys()
        for k in o1:
            torch.testing.assert_close(o2[k]["exp_avg"], o1[k]["exp_avg"], rtol=0, atol=0)
        # the rollout actors got the restored weights
        weights_equal(restored.env_runners.call(0, "get_weights"), algo.get_weights())
        r = restored.train()
        assert r["iteration"] == 3
        assert r["env_steps_sampled"] > results[-1]["env_steps_sampled"]
        assert r["env_steps_trained"] > results[-1]["env_steps_trained"]
        assert r["episodes_total"] >= results[-1]["episodes_total"]
        # PPO.from_checkpoint works too, with overrides
        again = PPO.from_checkpoint(path, overrides={"resources": {"num_envs_per_worker": 2}})
        try:
            assert again.config.resources.num_envs_per_worker == 2 and again.iteration == 2
        finally:
            again.stop()
    finally:
        restored.stop()


def test_restore_with_explicit_fragment_length(tmp_path):
    cfg = PPOConfig(
        env="CartPole-v1",
        seed=0,
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=1,
        resources={"num_envs_per_worker": 2},
    )
    with cfg.build() as algo:
        algo.train()
        path = algo.save(tmp_path / "ck")
    restored = Algorithm.from_checkpoint(path)
    try:
        assert restored.iteration == 1
        assert restored.config.fragment_length() == 32
        assert restored.train()["iteration"] == 2
    finally:
        restored.stop()


def test_restore_wrong_algorithm(trained, tmp_path):
    _, _, path = trained
    p = tmp_path / "ck"
    st, meta = ckpt.load_checkpoint(path)
    ckpt.save_checkpoint(
        p, st, {**{k: v for k, v in meta.items() if k not in ("format", "format_version")}, "algo": "nope"}
    )
    with pytest.raises(Exception, match="nope"):
        Algorithm.from_checkpoint(p)


def test_reproducible_with_seed():
    def run():
        algo = small_config().build()
        try:
            return [algo.train() for _ in range(2)], algo.get_weights()
        finally:
            algo.stop()

    (r1, w1), (r2, w2) = run(), run()
    for a, b in zip(r1, r2):
        da, db = deterministic(a), deterministic(b)
        assert "episode_return_mean" in da and "learner/policy_loss" in da
        assert da == db
    weights_equal(w1, w2)
    # and a different seed differs
    algo = small_config().copy_with({"seed": 1}).build()
    try:
        r3 = algo.train()
        assert deterministic(r3) != deterministic(r1[0])
    finally:
        algo.stop()
