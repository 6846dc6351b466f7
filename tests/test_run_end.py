"""Every way a run is told to stop keeps its work: SIGTERM behaves like Ctrl-C (checkpoint, exit
143), a second signal during the stop checkpoint only says it is saving, the third aborts the
save and leaves the previous checkpoint the newest; a full disk and an exhausted restart budget
end with one paragraph after saving what can be saved.

The process tests run a real ``shoal train`` and wait on files, never on time.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import invoke
from test_driver_kill import _wait_for

from shoal import checkpoint as ckpt
from shoal.runtime import signals

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "ppo",
    "--env",
    "CartPole-v1",
    "--seed",
    "0",
    "--set",
    "train_batch_size=256",
    "--set",
    "minibatch_size=128",
    "--set",
    "num_sgd_iter=1",
    "--no-stop-reward",
    "--stop-iters",
    "100000",
    "-q",
]


# ---- in-process -----------------------------------------------------------------------------
def test_sigterm_raises_terminated_inside_the_context_only():
    before = signal.getsignal(signal.SIGTERM)  # the default, or Ray's when a test started Ray here
    with signals.stop_on_signals():
        with pytest.raises(signals.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; the sleep is interrupted
    assert signal.getsignal(signal.SIGTERM) is before


def test_while_saving_the_first_signal_only_warns_and_the_second_aborts(capsys):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(signals.SaveAborted):
        with signals.saving():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # handled: the save goes on
            assert "press Ctrl-C again to abort" in capsys.readouterr().err
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_full_disk_ends_with_one_paragraph_and_exit_2(tmp_path, monkeypatch):
    real_save, calls = ckpt.save_checkpoint, []

    def save(path, state, meta):
        calls.append(path)
        if len(calls) > 1:  # the first checkpoint fits, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(path, state, meta)

    monkeypatch.setattr(ckpt, "save_checkpoint", save)
    r = invoke(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--seed",
        "0",
        "--set",
        "train_batch_size=256",
        "--set",
        "minibatch_size=128",
        "--set",
        "num_sgd_iter=1",
        "--no-stop-reward",
        "--stop-iters",
        "5",
        "--checkpoint-every",
        "1",
        "-q",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "No space left on device" in text and "The disk is full" in text and "shoal resume" in text
    assert "Saving a checkpoint failed too" in text and "Traceback" not in r.output
    (run,) = tmp_path.iterdir()
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000001"]


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler for the test, whatever an earlier test or the terminal left in place
    (an ignored SIGINT would make these tests about something else)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _sigint_default() -> None:
    """preexec_fn of the runs Ctrl-C is sent to: SIGINT handled as a terminal's Ctrl-C would be (a child
    inherits an ignored SIGINT, and Python then leaves it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_sigint_held_during_ray_start_is_raised_when_the_block_is_done(capsys, default_sigint):
    before = signal.getsignal(signal.SIGINT)
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with signals.sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # handled: the block goes on
            reached_the_end = True
    assert reached_the_end and signal.getsignal(signal.SIGINT) is before
    assert "stopping as soon as Ray has started; press Ctrl-C again" in capsys.readouterr().err


def test_a_second_sigint_leaves_a_block_holding_sigint_at_once(default_sigint):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with signals.sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # interrupted
            pytest.fail("the second SIGINT was held too")
    assert signal.getsignal(signal.SIGINT) is before


def _torch_full_disk_save(monkeypatch, fits: int) -> None:
    """``torch.save`` into a checkpoint's state file fails after ``fits`` successes, as it fails on
    a full disk: the file's write raises OSError ENOSPC and torch's zip writer, closing the archive,
    replaces it with a RuntimeError ("[enforce fail at inline_container.cc:672] ... unexpected pos")."""
    import torch

    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        if getattr(f, "name", "").endswith(ckpt.STATE_FILE):
            calls.append(f)
            if len(calls) > fits:
                try:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                except OSError:  # as torch does: the OSError only the context of its RuntimeError
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_torchs_error_from_a_full_disk_ends_with_one_paragraph_and_exit_2(tmp_path, monkeypatch):
    _torch_full_disk_save(monkeypatch, fits=1)  # checkpoint 1 fits; its `best` copy fills the disk
    r = invoke("train", *TINY[:-3], "--stop-iters", "5", "--checkpoint-every", "1", "-q", "--out", tmp_path)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "No space left on device" in text and "The disk is full" in text and "shoal resume" in text, text
    assert "Traceback" not in r.output and "inline_container" not in text, r.output
    (run,) = tmp_path.iterdir()
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000001"]
    assert f"The newest checkpoint (finite weights) is {run / 'checkpoints' / 'checkpoint_000001'}" in text
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no partial save left


def test_torchs_failed_write_on_a_full_disk_is_an_oserror(tmp_path, monkeypatch):
    """Without the OSError behind it (torch writing by path), a failed write with no space left is ENOSPC."""
    import shutil

    import torch

    def save(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(OSError) as e:
        ckpt.save_checkpoint(tmp_path / "checkpoint_000001", {"w": torch.zeros(3)}, {})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "checkpoint_000001" / "state.pt")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 0, 10**9))
    with pytest.raises(RuntimeError, match="inline_container"):  # space left: not a full disk, left as it is
        ckpt.save_checkpoint(tmp_path / "checkpoint_000001", {"w": torch.zeros(3)}, {})
    assert list(tmp_path.iterdir()) == []


def test_a_signal_after_an_iteration_is_counted_saves_the_one_before(tmp_path):
    """The window the process test below can hit by chance: iteration 3 counted, its row not yet written."""
    r = invoke(
        "train",
        *TINY,
        "--set",
        "callbacks=hook_helpers:TerminatedAtThree",
        "--checkpoint-every",
        "1000",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 143, r.output
    (run,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (last,) = ckpt.list_checkpoints(run / "checkpoints")
    meta = ckpt.read_meta(last)
    assert last.name == "checkpoint_000002" and meta["iteration"] == rows[-1]["iteration"] == 2
    assert meta["env_steps_sampled"] == rows[-1]["env_steps_sampled"]


# ---- a real driver ---------------------------------------------------------------------------
def _start(tmp_path: Path, *extra: str, pause: tuple[str, int, Path] | None = None) -> subprocess.Popen:
    """``shoal train`` with its output in ``tmp_path/out.txt`` (read with :func:`_output`); with
    ``pause=(stage, n, file)`` through tests/pause_driver.py, stopped at that moment of a save."""
    log = open(tmp_path / "out.txt", "w")
    start = ["-m", "shoal"] if pause is None else [str(REPO / "tests" / "pause_driver.py"), *map(str, pause)]
    return subprocess.Popen(
        [sys.executable, *start, "train", *TINY, "--out", str(tmp_path / "runs"), *extra],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_sigint_default,
    )


def _output(tmp_path: Path) -> str:
    return (tmp_path / "out.txt").read_text()


def _rows(tmp_path: Path) -> int:
    runs = list((tmp_path / "runs").glob("*/results.jsonl"))
    return len(runs[0].read_text().splitlines()) if runs else 0


@pytest.mark.parametrize("workers", ["0", "1"])
def test_sigterm_saves_the_last_iteration_and_exits_143(tmp_path, workers):
    proc = _start(tmp_path, "--workers", workers, "--checkpoint-every", "1000")
    _wait_for(lambda: _rows(tmp_path) >= 3, proc, "three iterations")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=180)
    out = _output(tmp_path)
    assert proc.returncode == 143, out
    assert "Terminated (SIGTERM)" in out and "Traceback" not in out, out
    assert "Token authentication" not in out, out  # Ray's note about its own default, for a local instance
    (run,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (last,) = ckpt.list_checkpoints(run / "checkpoints")
    meta = ckpt.read_meta(last)
    assert meta["iteration"] == rows[-1]["iteration"] >= 3  # the checkpoint is the last finished iteration
    assert meta["env_steps_sampled"] == rows[-1]["env_steps_sampled"]


def test_third_signal_aborts_the_stop_save_and_leaves_no_partial_checkpoint(tmp_path):
    paused = tmp_path / "paused"
    proc = _start(
        tmp_path, "--workers", "0", "--checkpoint-every", "1000", pause=("state", 1, paused)
    )  # the first save (the stop one) waits after state.pt
    _wait_for(lambda: _rows(tmp_path) >= 2, proc, "two iterations")
    proc.send_signal(signal.SIGINT)
    _wait_for(paused.exists, proc, "the stop checkpoint to be half written")
    proc.send_signal(signal.SIGINT)  # second: says it is saving, and the save goes on
    _wait_for(lambda: "press Ctrl-C again to abort the save" in _output(tmp_path), proc, "the second signal's note")
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)  # third: aborts the save
    proc.wait(timeout=120)
    out = _output(tmp_path)
    assert proc.returncode == 130, out
    assert "press Ctrl-C again to abort the save" in out and "abandoned on the third signal" in out, out
    assert "Traceback" not in out, out
    (run,) = (tmp_path / "runs").iterdir()
    assert ckpt.list_checkpoints(run / "checkpoints") == []
    assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())  # the half-written one is gone


# ---- one writer per run directory -------------------------------------------------------------
HOLDER = """
import sys, time
from pathlib import Path
from shoal.app.run_lock import run_lock
with run_lock(Path(sys.argv[1])):
    Path(sys.argv[2]).write_text("held")
    time.sleep(600)
"""


def test_a_second_process_is_told_who_holds_the_run_directory(tmp_path):
    from shoal.app.run_lock import LOCK_FILE, run_lock
    from shoal.errors import RunDirectoryError

    run, held = tmp_path / "run", tmp_path / "held"
    (run / "checkpoints").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), str(held)])
    try:
        _wait_for(held.exists, holder, "the holder to take the lock")
        with pytest.raises(RunDirectoryError, match=f"in use: shoal process {holder.pid} on "):
            with run_lock(run):
                pass
        r = invoke("resume", str(run))
        assert r.exit_code == 2 and f"shoal process {holder.pid}" in r.output, r.output
    finally:
        holder.kill()  # SIGKILL: the operating system drops the lock with the process
        holder.wait()
    with run_lock(run):
        assert json_pid(run / LOCK_FILE) == os.getpid()
    assert not (run / LOCK_FILE).exists()


def json_pid(path: Path) -> int:
    return int(json.loads(path.read_text())["pid"])


def test_a_deleted_results_file_is_started_anew(tmp_path, caplog):
    from shoal.logging.writers import JsonlWriter

    w = JsonlWriter(tmp_path / "results.jsonl")
    w.write({"iteration": 1})
    (tmp_path / "results.jsonl").unlink()
    with caplog.at_level("WARNING"):
        w.write({"iteration": 2})
        w.write({"iteration": 3})
    w.close()
    rows = [json.loads(line)["iteration"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows == [2, 3]
    assert sum("deleted or replaced" in r.message for r in caplog.records) == 1


# ---- a driver killed inside ray.init -------------------------------------------------------------
INIT_THEN_HANG = """
import sys, time
from pathlib import Path
import ray

real_init = ray.init

def init(*args, **kwargs):  # Ray's processes are all up, but shoal's start() has not returned
    out = real_init(*args, **kwargs)
    Path(sys.argv[1]).write_text("inside ray.init")
    time.sleep(600)
    return out

ray.init = init
from shoal import runtime
runtime.start(num_cpus=1)
"""


def test_a_driver_killed_inside_ray_init_leaves_no_ray_process(tmp_path):
    import psutil

    inside = tmp_path / "inside"
    proc = subprocess.Popen(
        [sys.executable, "-c", INIT_THEN_HANG, str(inside)], cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    _wait_for(inside.exists, proc, "Ray to start", timeout_s=180)
    driver = psutil.Process(proc.pid)
    started = {(p.pid, p.create_time()) for p in driver.children(recursive=True)}
    assert any("raylet" in p.name() for p in driver.children(recursive=True))
    proc.kill()
    proc.wait()

    def alive() -> list[int]:
        out = []
        for pid, ct in started:
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - ct) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.Error:
                pass
        return out

    deadline = time.monotonic() + 60  # the agents alone stay > 30 s without the watchdog
    while alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(), f"Ray processes left: {alive()}"


def _ctrl_c_when_the_raylet_appears(proc: subprocess.Popen, tmp_path) -> str:
    """SIGINT to ``proc`` as soon as its local raylet exists; its output once it has ended with 130."""
    import psutil

    def raylet() -> bool:
        try:
            return any(p.name() == "raylet" for p in psutil.Process(proc.pid).children())
        except psutil.Error:
            return False

    _wait_for(raylet, proc, "the raylet", timeout_s=240)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the run went on after Ctrl-C: {_output(tmp_path)[-2000:]}")
    out = _output(tmp_path)
    assert proc.returncode == 130, out
    return out


def test_ctrl_c_while_ray_starts_ends_the_run_as_ctrl_c_does(tmp_path):
    """SIGINT as soon as the local raylet exists (inside ray.init): the run stops there with exit
    130 and one paragraph, instead of the interrupt being lost in Ray's start-up."""

    proc = _start(tmp_path, "--workers", "1")  # no stop but 100000 iterations: training on would not end

    out = _ctrl_c_when_the_raylet_appears(proc, tmp_path)
    text = " ".join(out.split())
    assert "Interrupted while the run was starting" in text and "no run directory was written" in text, out
    assert "Traceback" not in out, out
    assert not list((tmp_path / "runs").glob("*/results.jsonl"))


def test_ctrl_c_while_resume_starts_ends_with_a_paragraph_and_leaves_the_run_as_it_was(tmp_path):
    """SIGINT as soon as `shoal resume`'s raylet exists (the algorithm being rebuilt from its
    checkpoint): exit 130 and one paragraph saying the run directory is as it was, not a bare 130."""

    first = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal",
            "train",
            *TINY[:-3],
            "--stop-iters",
            "1",
            "-q",
            "--out",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    (run,) = (tmp_path / "runs").iterdir()
    results = (run / "results.jsonl").read_text()
    with open(tmp_path / "out.txt", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "resume", str(run), "--stop-iters", "100000", "--workers", "1", "-q"],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_sigint_default,
        )

    out = _ctrl_c_when_the_raylet_appears(proc, tmp_path)
    text = " ".join(out.split())
    assert "Interrupted while the run was resuming" in text and f"shoal resume {run}" in text, out
    assert "Traceback" not in out and "Aborted" not in out, out
    assert (run / "results.jsonl").read_text() == results  # nothing trained, nothing appended
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000001"]


# ---- the local raylet killed under a run ---------------------------------------------------------
def test_the_raylet_watch_counts_a_killed_unreaped_process_as_gone():
    import psutil

    from shoal.runtime.cluster import _alive

    child = subprocess.Popen(["sleep", "60"])
    try:
        assert _alive(psutil.Process(child.pid))
        child.kill()  # not reaped: a zombie until wait()
        process = psutil.Process(child.pid)
        deadline = time.monotonic() + 60
        while _alive(process) and time.monotonic() < deadline:  # not child.poll(): that would reap it
            time.sleep(0.01)
        assert not _alive(process) and process.status() == psutil.STATUS_ZOMBIE
    finally:
        child.wait()


def test_rays_report_of_a_dead_local_raylet_is_one_line_and_actor_output_passes(monkeypatch):
    import ray._private.worker as ray_worker

    from shoal.runtime import cluster

    printed: list[dict] = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data))
    monkeypatch.setattr(cluster, "_raylet", object())  # a local raylet this process started
    cluster._condense_raylet_death_dump()
    dump = "Raylet is terminated. Termination is unexpected. Last 20 lines:\n" + "    [state-dump] x\n" * 20
    actor = {"lines": ["step 1", "Raylet is terminated."], "pid": 4242, "is_err": False}
    for data in (actor, {"lines": [dump], "pid": "raylet", "is_err": False}) * 2:
        ray_worker.print_to_stdstream(data, ignore_prefix=False)
    assert printed[0] is actor and printed[2] is actor and len(printed) == 3  # the second agent's copy: not again
    (line,) = printed[1]["lines"]
    assert line.startswith("Raylet is terminated; its last log lines are in") and "\n" not in line
    monkeypatch.setattr(cluster, "_raylet", None)  # no local raylet (a remote cluster's report): as it was
    ray_worker.print_to_stdstream({"lines": [dump], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printed[-1]["lines"] == [dump]


def test_a_killed_raylet_ends_the_run_with_a_message_and_a_checkpoint(tmp_path):
    import psutil

    proc = _start(tmp_path, "--workers", "1", "--checkpoint-every", "1000")
    _wait_for(lambda: _rows(tmp_path) >= 2, proc, "two iterations")
    (raylet,) = [p for p in psutil.Process(proc.pid).children() if p.name() == "raylet"]
    raylet.kill()
    proc.wait(timeout=120)
    out = _output(tmp_path)
    assert proc.returncode == 2, out
    text = " ".join(out.split())
    assert "raylet process died" in text and "shoal resume" in text and "Traceback" not in out, out
    # Ray's report of the death (20 lines of the raylet's log, from each of its two agents) is one
    # line naming that log, not 42 lines of state dump before shoal's paragraph
    lines = [line for line in out.splitlines() if line.strip()]
    (paragraph,) = [i for i, line in enumerate(lines) if "The local Ray instance stopped" in line]
    assert paragraph <= 2 and len(lines) <= 4 and "[state-dump]" not in out, out
    assert sum("Raylet is terminated" in line for line in lines) <= 1, out
    (run,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (last,) = ckpt.list_checkpoints(run / "checkpoints")
    assert ckpt.read_meta(last)["iteration"] == rows[-1]["iteration"] >= 2
