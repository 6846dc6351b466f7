"""Checkpoints and resume after a killed driver: damaged state.pt files, leftovers of an
interrupted save, a torn results row, the best checkpoint's value, Ape-X's update count."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import flat, invoke

from shoal import checkpoint as ckpt
from shoal.errors import CheckpointError

SMALL = [
    "--set",
    "train_batch_size=128",
    "--set",
    "minibatch_size=64",
    "--set",
    "num_sgd_iter=1",
    "--envs-per-worker",
    "2",
    "--seed",
    "0",
    "-q",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A PPO run of 3 iterations with a checkpoint after each (a pristine copy; tests copy it)."""
    out = tmp_path_factory.mktemp("runs")
    r = invoke("train", "ppo", "--env", "CartPole-v1", *SMALL, "--stop-iters", 3, "--checkpoint-every", 1, "--out", out)
    assert r.exit_code == 0, r.output
    return next(out.iterdir())


@pytest.fixture
def run(run_dir, tmp_path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def _state_file(run: Path, n: int) -> Path:
    return run / "checkpoints" / f"checkpoint_{n:06d}" / ckpt.STATE_FILE


def test_empty_truncated_and_foreign_state_files_are_named(run):
    f = _state_file(run, 3)
    data = f.read_bytes()
    f.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)") as info:
        ckpt.load_checkpoint(f.parent)
    assert str(f) in str(info.value)
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        ckpt.load_checkpoint(f.parent)
    assert str(f) in str(info.value) and "weights_only" not in str(info.value)
    torch.save({"x": Path("not-a-tensor")}, f)  # a pickled object: not something shoal writes
    with pytest.raises(CheckpointError, match="other than tensors") as info:
        ckpt.load_checkpoint(f.parent)
    assert "weights_only" not in str(info.value)


def test_evaluate_with_a_damaged_checkpoint_exits_2(run):
    _state_file(run, 3).write_bytes(b"PK\x03\x04 torn")
    r = invoke("evaluate", run / "checkpoints" / "checkpoint_000003", "-n", 1)
    assert r.exit_code == 2 and "truncated or corrupt" in flat(r.output) and "Traceback" not in r.output


def test_resume_falls_back_to_the_newest_intact_checkpoint(run, caplog):
    f = _state_file(run, 3)
    f.write_bytes(f.read_bytes()[:100])
    with (run / "results.jsonl").open("a") as fh:
        fh.write('{"iteration": 4, "episode_ret')  # the torn last row of a killed driver
    r = invoke("resume", run, "--stop-iters", 4, "-q")
    assert r.exit_code == 0, r.output
    assert any("checkpoint_000003 is damaged, so the run resumes from checkpoint_000002" in m for m in caplog.messages)
    assert any("dropped a torn row" in m for m in caplog.messages)
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4]  # resumed after iteration 2: 3 and 4 again
    names = [p.name for p in ckpt.list_checkpoints(run / "checkpoints")]
    assert names[-1] == "checkpoint_000004"
    ckpt.verify_checkpoint(run / "checkpoints" / "checkpoint_000003")  # rewritten whole


def test_resume_with_no_intact_checkpoint_says_so(run):
    for n in (1, 2, 3):
        _state_file(run, n).write_bytes(b"")
    r = invoke("resume", run, "--stop-iters", 4, "-q")
    assert r.exit_code == 2 and "No intact checkpoint" in flat(r.output)


def test_leftovers_of_a_killed_save_are_cleaned_up(tmp_path):
    d = tmp_path / "checkpoints"
    ckpt.save_checkpoint(d / "checkpoint_000001", {"w": torch.ones(1)}, {"algo": "ppo"})
    ckpt.save_checkpoint(d / "best", {"w": torch.ones(1)}, {"algo": "ppo"})
    (d / ".checkpoint_000002.tmp-0123abcd").mkdir()  # killed while writing
    (d / ".best.old-89abcdef").mkdir()  # killed after the new best landed, before the old one was removed
    (d / "best").rename(d / ".best.old-fedcba98")  # ... and a best moved aside whose successor never landed
    done = ckpt.remove_leftovers(d)
    assert "restored best from .best.old-fedcba98" in done
    assert sorted(p.name for p in d.iterdir()) == ["best", "checkpoint_000001"]
    assert ckpt.load_checkpoint(d / "best")[0]["w"].item() == 1.0


def test_a_save_removes_leftovers_too(tmp_path):
    (tmp_path / ".checkpoint_000001.tmp-0123abcd").mkdir()
    ckpt.save_checkpoint(tmp_path / "checkpoint_000002", {"w": torch.ones(1)}, {"algo": "ppo"})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_000002"]


def test_resume_remembers_the_best_value(run):
    best_meta = run / "checkpoints" / "best" / ckpt.META_FILE
    meta = json.loads(best_meta.read_text())
    meta["best_value"] = 1e6  # a best no resumed iteration can reach
    best_meta.write_text(json.dumps(meta))
    r = invoke("resume", run, "--stop-iters", 5, "-q")
    assert r.exit_code == 0, r.output
    after = json.loads(best_meta.read_text())
    assert after["best_value"] == 1e6 and after["iteration"] == meta["iteration"]


def test_evaluate_weights_of_another_algorithm_is_a_clear_error(run, tmp_path):
    from shoal import DQNConfig

    with DQNConfig(env="CartPole-v1", learning_starts=10).build() as dqn:
        foreign = dqn.save(tmp_path / "dqn")
    shutil.copy(foreign / ckpt.STATE_FILE, _state_file(run, 3))
    r = invoke("evaluate", run / "checkpoints" / "checkpoint_000003", "-n", 1)
    out = flat(r.output)
    assert r.exit_code == 2 and "does not fit the ppo run" in out and "Traceback" not in r.output


def test_apex_learner_updates_continue_after_a_restore(tmp_path):
    from shoal.algorithms.apex import ApeXConfig
    from shoal.framework.base import Algorithm

    cfg = ApeXConfig(
        env="CartPole-v1",
        seed=0,
        learning_starts=128,
        train_batch_size=32,
        training_intensity=2.0,
        rollout_fragment_length=16,
        model={"hiddens": [16]},
        resources={"num_workers": 0, "num_envs_per_worker": 4, "num_replay_shards": 1},
    )
    with cfg.build() as algo:
        r = {}
        for _ in range(40):
            r = algo.train()
            if r["num_learner_updates"] >= 5:
                break
        with algo.learner_thread.hold():
            path = algo.save(tmp_path / "apex")
            saved = algo.learner_thread.num_updates
    assert saved >= 5
    with Algorithm.from_checkpoint(path) as again:
        assert again.learner_thread.num_updates == saved
        assert again.train()["num_learner_updates"] >= saved
