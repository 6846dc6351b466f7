"""A driver killed with SIGKILL: at exact moments of a checkpoint write, and with its own Ray.

The driver is a real ``shoal train`` subprocess. Started through ``tests/pause_driver.py STAGE N
FILE``, it creates FILE and waits when its N-th save reaches STAGE; the test then kills it there. Every wait is on a file or a condition with a generous timeout, never on time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from shoal import checkpoint as ckpt
from shoal.app.resume_point import newest_intact_checkpoint
from shoal.app.trainer import resume
from shoal.framework.base import Algorithm

REPO = Path(__file__).resolve().parent.parent
PPO_ARGS = [
    "ppo",
    "--env",
    "CartPole-v1",
    "-w",
    "0",
    "--seed",
    "0",
    "--set",
    "train_batch_size=256",
    "--set",
    "minibatch_size=128",
    "--set",
    "num_sgd_iter=2",
]
UPDATES_PER_ITER = 4  # 256 / 128 minibatches x 2 epochs: Adam's step count is 4 x iteration


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def _shoal(*args: str, pause: tuple[str, int, Path] | None = None, **env: str) -> subprocess.Popen:
    """``shoal *args`` as a subprocess; with ``pause=(stage, n, file)`` through tests/pause_driver.py."""
    start = ["-m", "shoal"] if pause is None else [str(REPO / "tests" / "pause_driver.py"), *map(str, pause)]
    return subprocess.Popen(
        [sys.executable, *start, *args],
        env=_env(**env),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout_s: float = 240.0):
    """Poll ``cond()`` until it is truthy; fail if ``proc`` exits first or the (generous) timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(
                f"the driver exited (code {proc.returncode}) before {what}: "
                f"{proc.stderr.read()[-2000:] if proc.stderr else '(output in a file)'}"
            )
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"timed out waiting for {what}")


def _kill_at(tmp_path: Path, stage: str, n: int, args: list[str]) -> Path:
    """Run ``shoal train *args`` until its n-th save reaches ``stage``, SIGKILL it there; the run directory."""
    flag = tmp_path / "paused"
    proc = _shoal(
        "train",
        *args,
        "--no-stop-reward",
        "--stop-iters",
        "500",
        "--checkpoint-every",
        "1",
        "--keep-checkpoints",
        "2",
        "-q",
        "--out",
        str(tmp_path / "runs"),
        pause=(stage, n, flag),
    )
    try:
        _wait_for(flag.exists, proc, f"save stage '{stage}' #{n}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def _assert_listed_checkpoints_load(ckpt_dir: Path) -> list[Path]:
    listed = ckpt.list_checkpoints(ckpt_dir)
    assert listed, "no complete checkpoint"
    for p in listed + ([ckpt_dir / "best"] if (ckpt_dir / "best").exists() else []):
        state, meta = ckpt.load_checkpoint(p)  # raises on a partial or damaged one
        assert meta["iteration"] == state["iteration"]
    return listed


def _assert_same(a, b, where: str = "state") -> None:
    """Two checkpoint states hold the same values (tensors and arrays element for element)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"  # NaN == NaN here


def _assert_restores_exactly(start: Path) -> Algorithm:
    """What resume builds from ``start`` holds exactly what the checkpoint held."""
    saved, _ = ckpt.load_checkpoint(start)
    algo = Algorithm.from_checkpoint(start)
    _assert_same(saved, algo.get_state())
    return algo


def _adam_step(state: dict) -> float:
    return float(state["learner"]["optimizer"]["state"][0]["step"])


# stage, N, what the kill leaves in checkpoints/ (a regex of one directory name)
KILLS = [
    ("state", 4, r"\.(checkpoint_\d{6}|best)\.tmp-\w{8}"),  # state.pt written, meta.json not yet
    ("complete", 3, r"\.(checkpoint_\d{6}|best)\.tmp-\w{8}"),  # the new one whole, not yet renamed
    ("aside", 1, r"\.best\.old-\w{8}"),  # the old best moved aside, the new one not in place
    ("replaced", 1, r"\.best\.old-\w{8}"),  # the new best in place, the old one not yet deleted
    ("deleting", 1, r"\.checkpoint_000001\.del-\w{8}"),
]  # the oldest numbered one renamed for deletion


@pytest.mark.parametrize("stage,n,left", KILLS, ids=[k[0] for k in KILLS])
def test_ppo_driver_killed_while_saving_resumes_from_last_complete_checkpoint(tmp_path, stage, n, left):
    run_dir = _kill_at(tmp_path, stage, n, PPO_ARGS)
    ckpt_dir = run_dir / "checkpoints"
    names = [p.name for p in ckpt_dir.iterdir()]
    assert [x for x in names if re.fullmatch(left, x)], names  # killed where the test meant to
    assert ("best" in names) == (stage != "aside")
    _assert_listed_checkpoints_load(ckpt_dir)
    start = newest_intact_checkpoint(ckpt_dir)
    k = int(start.name.split("_")[1])
    saved, _ = ckpt.load_checkpoint(start)
    assert _adam_step(saved) == UPDATES_PER_ITER * k
    _assert_restores_exactly(start).stop()

    proc = _shoal("resume", str(run_dir), "--stop-iters", str(k + 1), "-q")
    assert proc.wait(timeout=240) == 0, proc.stderr.read()[-2000:]
    proc.stderr.close()
    assert not [p.name for p in ckpt_dir.iterdir() if p.name.startswith(".")]  # leftovers tidied
    listed = _assert_listed_checkpoints_load(ckpt_dir)
    assert listed[-1].name == f"checkpoint_{k + 1:06d}"
    assert (ckpt_dir / "best" / "meta.json").is_file()  # a best moved aside at the kill is back
    after, meta = ckpt.load_checkpoint(listed[-1])
    assert _adam_step(after) == UPDATES_PER_ITER * (k + 1)  # the optimizer went on, not started afresh
    assert after["counters"]["env_steps_sampled"] > saved["counters"]["env_steps_sampled"]
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, k + 2))  # nothing lost, nothing twice
    assert rows[k - 1]["env_steps_sampled"] == saved["counters"]["env_steps_sampled"]
    assert rows[k]["env_steps_sampled"] == meta["env_steps_sampled"]


def test_dqn_replay_survives_a_kill_inside_a_save(tmp_path):
    args = [
        "dqn",
        "--env",
        "CartPole-v1",
        "-w",
        "0",
        "--seed",
        "0",
        "--set",
        "checkpoint_replay=true",
        "--set",
        "min_env_steps_per_iteration=200",
        "--set",
        "learning_starts=100",
        "--set",
        "train_batch_size=32",
        "--set",
        "replay_capacity=20000",
        "--set",
        "resources.num_envs_per_worker=2",
    ]
    run_dir = _kill_at(tmp_path, "state", 4, args)
    start = newest_intact_checkpoint(run_dir / "checkpoints")
    saved, _ = ckpt.load_checkpoint(start)
    rows = saved["replay"]["buffer"]
    assert rows["size"] > 0
    _assert_restores_exactly(start).stop()  # replay rows, priorities, optimizer, counters

    k = saved["iteration"]
    resume(run_dir, stop={"iterations": k + 1}, progress=False)
    after, _ = ckpt.load_checkpoint(run_dir / "checkpoints" / f"checkpoint_{k + 1:06d}")
    new_rows = after["replay"]["buffer"]
    assert new_rows["added"] > rows["added"] and new_rows["size"] > rows["size"]
    for name, col in rows["columns"].items():  # the checkpoint's rows are still there, first
        assert torch.equal(new_rows["columns"][name][: rows["size"]], col), name
    assert float(after["learner"]["optimizer"]["state"][0]["step"]) > float(
        saved["learner"]["optimizer"]["state"][0]["step"]
    )


def test_a_checkpoint_being_deleted_is_never_listed_nor_put_back(tmp_path):
    for it in (1, 2):
        ckpt.save_checkpoint(tmp_path / f"checkpoint_{it:06d}", {"iteration": it}, {"iteration": it})
    gone = tmp_path / ".checkpoint_000001.del-0123abcd"  # what a kill inside delete_checkpoint leaves
    (tmp_path / "checkpoint_000001").rename(gone)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint_000002"]
    assert ckpt.remove_leftovers(tmp_path) == ["removed .checkpoint_000001.del-0123abcd"]  # deleted, not restored
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000002"]
    ckpt.delete_checkpoint(tmp_path / "checkpoint_000002")
    assert list(tmp_path.iterdir()) == []


def _games(league: dict) -> int:
    return sum(n for row in league["payoff"]["counts"].values() for n in row.values())


def test_alpha_star_league_survives_a_kill_inside_a_save(tmp_path):
    args = [
        "alpha_star",
        "-c",
        "examples/alpha_star_tictactoe.yaml",
        "--set",
        "min_time_s_per_iteration=0",
        "--set",
        "resources.num_envs_per_worker=4",
    ]
    run_dir = _kill_at(tmp_path, "complete", 3, args)
    start = newest_intact_checkpoint(run_dir / "checkpoints")
    saved, _ = ckpt.load_checkpoint(start)
    league = saved["league"]
    assert len(league["players"]) >= 4 and _games(league) > 0  # main and 3 random players, games played
    _assert_restores_exactly(start).stop()  # players, payoff table, weights, every learner's optimizer

    k = saved["iteration"]
    resume(run_dir, stop={"iterations": k + 1}, progress=False)
    after, _ = ckpt.load_checkpoint(run_dir / "checkpoints" / f"checkpoint_{k + 1:06d}")
    assert set(league["players"]) <= set(after["league"]["players"])  # the league went on, not started afresh
    assert after["league"]["iteration"] == league["iteration"] + 1
    assert _games(after["league"]) > _games(league)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE  # a zombie is dead, only not yet reaped
    except psutil.Error:
        return False


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``timeout_s`` of waiting for all to exit."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in procs if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def _session_processes(driver: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in driver.children(recursive=True) if _running(p)]
    except psutil.Error:
        return []


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_killed_driver_leaves_no_ray_process(tmp_path):
    proc = _shoal(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "-w",
        "2",
        "--no-stop-reward",
        "--stop-iters",
        "100000",
        "--set",
        "train_batch_size=256",
        "--set",
        "minibatch_size=128",
        "-q",
        "--out",
        str(tmp_path),
    )
    driver = psutil.Process(proc.pid)

    def two_actors_and_watchdog():
        procs = _session_processes(driver)
        names = [_cmdline(p) for p in procs]
        runners = sum("EnvRunner" in n for n in names)
        return procs if runners >= 2 and any("watchdog.py" in n for n in names) else None

    tracked = []
    try:
        _wait_for(lambda: driver.is_running() and two_actors_and_watchdog(), proc, "2 rollout actors")
        tracked = _session_processes(driver)  # raylet, gcs_server, agents, workers, the watchdog
        assert any("raylet" in _cmdline(p) for p in tracked)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    alive = _wait_gone(tracked, timeout_s=30)  # left alone, Ray's agents stay ~60 s
    for p in alive:  # do not leave them to the next test
        p.kill()
    assert not alive, f"processes of the killed driver's Ray still running: {[p.name() for p in alive]}"
