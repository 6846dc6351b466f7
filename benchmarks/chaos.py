"""Chaos: short trainings of every algorithm while its Ray actors and its driver are SIGKILLed.

    python benchmarks/chaos.py [--budget-s 900] [--seed S] [--algos ppo,dqn,...] [--actor-kills 3] [--driver-kills 2]

Each algorithm runs ``shoal train`` (2 Ray rollout actors, or its smallest distributed form) as
a subprocess with a modest threshold. From its first iteration on, every ``--fault-every-s``
seconds, the benchmark SIGKILLs a random Ray actor process of a random type (``ray::EnvRunner``,
``ray::BatchReplay``, ...: the driver's Ray descendants by process title). Every second fault
instead (once a checkpoint exists and every earlier actor kill was seen survived) SIGKILLs the
driver and runs ``shoal resume``. Faults stop once ``--actor-kills`` and ``--driver-kills`` are
spent; the rest of the run's share of the budget is for reaching the threshold. After each
driver death it waits up to 30 s for every process of that driver's Ray to exit (the ones left
are counted as lingering, then killed) and loads every checkpoint the run lists.

A fault is survived when the run went on past it (after an actor kill: a later iteration whose
restart counters are higher; after a driver kill: the resumed driver trained again) and the run
finished by its own stop criterion (threshold or ``--stop-time`` of 0.4 x its share of the
budget in training time), with exit code 0, before its share of the budget was spent.
Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "chaos", "faults_injected", "faults_survived", "runs", "runs_reached_threshold",
"driver_kills", "resumes_ok", "corrupt_checkpoints", "lingering_processes", "budget_s", "seed",
"per_run"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
# algorithm: (shoal train arguments, the metric to reach, the threshold)
RUNS = {
    "ppo": (["ppo", "-c", "examples/ppo_cartpole_ray.yaml"], "episode_return_mean", 450.0),
    "dqn": (["dqn", "-c", "examples/dqn_cartpole.yaml", "-w", "2"], "episode_return_mean", 250.0),
    "impala": (["impala", "-c", "examples/impala_cartpole.yaml", "-w", "2"], "episode_return_mean", 300.0),
    "appo": (["appo", "-c", "examples/appo_cartpole.yaml", "-w", "2"], "episode_return_mean", 300.0),
    "apex": (["apex", "-c", "examples/apex_cartpole.yaml"], "episode_return_mean", 200.0),
    "ddppo": (["ddppo", "-c", "examples/ddppo_cartpole.yaml"], "episode_return_mean", 300.0),
    "alpha_star": (
        [
            "alpha_star",
            "-c",
            "examples/alpha_star_tictactoe.yaml",
            "-w",
            "2",
            "--no-stop-reward",
            "--set",
            "evaluation.evaluation_interval=2",
            "--set",
            "evaluation.evaluation_num_episodes=50",
            "--set",
            "resources.num_cpus_per_worker=0.5",
        ],  # its policy learner needs a CPU too
        "evaluation/win_rate_vs_random",
        0.9,
    ),
}
NOT_ACTORS = {"IDLE", "DashboardAgent", "RuntimeEnvAgent"}  # Ray's own helpers, not the run's actors
LINGER_WAIT_S = 30.0


def log(msg: str) -> None:
    print(f"[chaos] {msg}", file=sys.stderr, flush=True)


@dataclass
class RunReport:
    algo: str
    reached_threshold: bool = False
    best: float | None = None
    exit_code: int | None = None
    stopped_by_budget: bool = False  # still training when its share of the budget was spent
    actor_kills: list[str] = field(default_factory=list)
    actor_kills_continued: int = 0
    driver_kills: int = 0
    resumes_ok: int = 0
    corrupt_checkpoints: list[str] = field(default_factory=list)
    lingering_processes: int = 0
    iterations: int = 0
    restarts: int = 0


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if _running(p)]
    except psutil.Error:
        return []


def _actor_type(p: psutil.Process) -> str | None:
    """``EnvRunner`` for a process titled ``ray::EnvRunner.sample``; None for anything else."""
    try:
        title = (p.cmdline() or [""])[0]
    except psutil.Error:
        return None
    if not title.startswith("ray::"):
        return None
    kind = title[5:].split(".")[0].split()[0] if title[5:].strip() else ""
    return kind if kind and kind not in NOT_ACTORS else None


def _results(run_dir: Path | None) -> list[dict]:
    rows = []
    if run_dir is None or not (run_dir / "results.jsonl").is_file():
        return rows
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last row of a killed driver
    return rows


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _restarts(row: dict) -> float:
    return sum(v for k, v in row.items() if k.startswith("num_") and "restarts" in k and isinstance(v, (int, float)))


def _check_checkpoints(run_dir: Path, report: RunReport) -> None:
    """Load every checkpoint the run lists (and ``best``); count the ones that fail."""
    from shoal import checkpoint as ckpt
    from shoal.errors import CheckpointError

    d = run_dir / "checkpoints"
    for p in ckpt.list_checkpoints(d) + ([d / "best"] if (d / "best" / ckpt.META_FILE).is_file() else []):
        try:
            ckpt.load_checkpoint(p)
        except (CheckpointError, OSError) as e:
            if str(p) not in report.corrupt_checkpoints:
                report.corrupt_checkpoints.append(str(p))
                log(f"  CORRUPT {p}: {e}")


def _await_exit(tracked: list[psutil.Process], report: RunReport) -> None:
    """Wait for a dead driver's processes to exit; count (then kill) the ones still there."""
    deadline = time.monotonic() + LINGER_WAIT_S
    while (alive := [p for p in tracked if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if alive:
        log(f"  {len(alive)} processes of the dead driver linger: {[_safe_name(p) for p in alive]}")
        report.lingering_processes += len(alive)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass


def _safe_name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


class Chaos:
    """One algorithm's run: the driver, the faults, the checks."""

    def __init__(self, algo: str, out: Path, wall_s: float, args, rng: random.Random) -> None:
        self.algo, self.out, self.wall_s, self.args, self.rng = algo, out, wall_s, args, rng
        self.report = RunReport(algo)
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        self.run_dir: Path | None = None
        self.pending: list[tuple[int, float]] = []  # actor kills not yet seen survived: (iteration, restarts) then
        self.faults = 0
        self.retry = False  # the last fault found nothing to kill yet
        self.resuming_from: int | None = None  # after a driver kill: the checkpoint iteration resumed from
        self.killed_results: int | None = None  # the inode of results.jsonl when the driver was killed

    def _spawn(self, *cli: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "shoal", *cli],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.out / "driver.log", "a"),
        )

    def start(self) -> subprocess.Popen:
        cli, metric, threshold = RUNS[self.algo]
        stop = ["--stop-reward", str(threshold)] if metric == "episode_return_mean" else []
        return self._spawn(
            "train",
            *cli,
            *stop,
            "--stop-time",
            str(self.wall_s * 0.4),
            "--seed",
            str(self.args.seed),
            "--checkpoint-every",
            "2",
            "-q",
            "--out",
            str(self.out / "runs"),
        )

    def run(self) -> RunReport:
        proc, t0 = self.start(), time.monotonic()
        next_fault = None  # the first fault comes --first-fault-s after the first iteration
        seen: list[psutil.Process] = []  # the driver's processes at the last look, to check after it exits
        while proc.poll() is None and time.monotonic() - t0 < self.wall_s:
            time.sleep(0.5)
            seen = _tree(proc.pid) or seen
            if self.run_dir is None and (self.out / "runs").is_dir():
                self.run_dir = next(iter((self.out / "runs").iterdir()), None)
            self._resolve_pending()
            if next_fault is None and _results(self.run_dir):
                next_fault = time.monotonic() + self.args.first_fault_s
            if next_fault is not None and time.monotonic() >= next_fault:
                self.retry = False
                proc = self._fault(proc)
                seen = _tree(proc.pid)
                next_fault = time.monotonic() + (1.0 if self.retry else self.args.fault_every_s)
        if proc.poll() is None:
            log(f"  {self.algo}: wall budget spent, stopping the driver (Ctrl-C); the run did not finish")
            self.report.stopped_by_budget = True
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
        _await_exit(seen, self.report)  # a driver that exited normally leaves nothing either
        return self._finish(proc.returncode)

    def _fault(self, proc: subprocess.Popen) -> subprocess.Popen:
        from shoal import checkpoint as ckpt

        if self.resuming_from is not None:
            return proc  # let the resumed driver train first: its restart counters start afresh
        if len(self.report.actor_kills) >= self.args.actor_kills and self.report.driver_kills >= self.args.driver_kills:
            return proc  # the faults are spent: the rest of the budget is for reaching the threshold
        has_ckpt = self.run_dir is not None and ckpt.list_checkpoints(self.run_dir / "checkpoints")
        self.faults += 1
        if has_ckpt and not self.pending and self.report.driver_kills < self.args.driver_kills and self.faults % 2 == 0:
            return self._kill_driver(proc)  # every second fault, while kills are left
        actors: dict[str, list[psutil.Process]] = {}
        for p in _tree(proc.pid):
            kind = _actor_type(p)
            if kind:
                actors.setdefault(kind, []).append(p)
        if not actors:  # e.g. still starting (titled ray::IDLE): try again in a second
            self.faults -= 1
            self.retry = True
            return proc
        if len(self.report.actor_kills) >= self.args.actor_kills:
            return proc
        kind = self.rng.choice(sorted(actors))
        victim = self.rng.choice(actors[kind])
        rows = _results(self.run_dir)
        try:
            victim.kill()
        except psutil.Error:
            return proc
        self.report.actor_kills.append(kind)
        self.pending.append((rows[-1]["iteration"] if rows else 0, _restarts(rows[-1]) if rows else 0.0))
        log(f"  {self.algo}: SIGKILL {kind} (pid {victim.pid}) after {len(rows)} iterations")
        return proc

    def _kill_driver(self, proc: subprocess.Popen) -> subprocess.Popen:
        tracked = _tree(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.report.driver_kills += 1
        log(f"  {self.algo}: SIGKILL the driver ({len(tracked)} processes under it); resuming")
        _await_exit(tracked, self.report)
        _check_checkpoints(self.run_dir, self.report)
        from shoal.app.resume_point import newest_intact_checkpoint

        self.killed_results = _inode(self.run_dir / "results.jsonl")
        try:
            self.resuming_from = int(newest_intact_checkpoint(self.run_dir / "checkpoints").name.split("_")[1])
        except Exception as e:  # noqa: BLE001 - counted as a failed resume below
            log(f"  {self.algo}: no intact checkpoint to resume from: {e}")
            self.resuming_from = 10**9
        return self._spawn("resume", str(self.run_dir), "-q")

    def _resolve_pending(self) -> None:
        rows = _results(self.run_dir)
        if (
            self.resuming_from is not None
            and rows
            and rows[-1]["iteration"] > self.resuming_from
            and _inode(self.run_dir / "results.jsonl") != self.killed_results
        ):  # resume rewrote it, then added
            self.report.resumes_ok += 1  # the resumed driver trained an iteration past its checkpoint
            self.resuming_from = None
        for it, restarts in list(self.pending):
            if any(r["iteration"] > it and _restarts(r) > restarts for r in rows):
                self.pending.remove((it, restarts))
                self.report.actor_kills_continued += 1

    def _finish(self, code: int) -> RunReport:
        self._resolve_pending()
        r, (_, metric, threshold) = self.report, RUNS[self.algo]
        if self.resuming_from is not None and code == 0:  # resumed at a checkpoint that already met its criterion
            r.resumes_ok += 1
        r.exit_code = code
        rows = _results(self.run_dir)
        values = [row[metric] for row in rows if isinstance(row.get(metric), (int, float))]
        r.best = max(values) if values else None
        r.reached_threshold = r.best is not None and r.best >= threshold
        r.iterations = rows[-1]["iteration"] if rows else 0
        r.restarts = int(_restarts(rows[-1])) if rows else 0
        if self.run_dir is not None:
            _check_checkpoints(self.run_dir, r)
        if code != 0:
            tail = (self.out / "driver.log").read_text(errors="replace").strip().splitlines()[-3:]
            log(f"  {self.algo}: the driver failed: " + " | ".join(tail))
        log(
            f"  {self.algo}: exit {code}, {r.iterations} iterations, best {metric} {r.best}, "
            f"{len(r.actor_kills)} actor kills ({r.actor_kills_continued} continued), {r.driver_kills} driver kills "
            f"({r.resumes_ok} resumed), threshold {'reached' if r.reached_threshold else 'NOT reached'}"
        )
        return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=900.0, help="wall seconds for all runs together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algos", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    p.add_argument("--driver-kills", type=int, default=2, help="driver SIGKILLs (and resumes) per run, at most")
    p.add_argument("--actor-kills", type=int, default=3, help="actor SIGKILLs per run, at most")
    p.add_argument("--fault-every-s", type=float, default=5.0, help="seconds between faults")
    p.add_argument(
        "--first-fault-s", type=float, default=2.0, help="seconds from a run's first iteration to its first fault"
    )
    args = p.parse_args()
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in RUNS]
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {unknown}; choose from {', '.join(RUNS)}")
    rng = random.Random(args.seed)
    reports = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shoal-chaos-") as tmp:
        for i, algo in enumerate(algos):
            out = Path(tmp) / algo
            out.mkdir()
            share = (args.budget_s - (time.monotonic() - t0)) / (len(algos) - i)  # what earlier runs left goes on
            log(f"{algo}: {share:.0f} s wall budget")
            reports.append(Chaos(algo, out, share, args, rng).run())
    print(json.dumps(_summary(reports, args)))


def _summary(reports: list[RunReport], args) -> dict:
    injected = sum(len(r.actor_kills) + r.driver_kills for r in reports)
    survived = sum(
        r.actor_kills_continued + r.resumes_ok for r in reports if r.exit_code == 0 and not r.stopped_by_budget
    )
    return {
        "benchmark": "chaos",
        "faults_injected": injected,
        "faults_survived": survived,
        "runs": len(reports),
        "runs_reached_threshold": sum(r.reached_threshold for r in reports),
        "driver_kills": sum(r.driver_kills for r in reports),
        "resumes_ok": sum(r.resumes_ok for r in reports),
        "corrupt_checkpoints": sum(len(r.corrupt_checkpoints) for r in reports),
        "lingering_processes": sum(r.lingering_processes for r in reports),
        "budget_s": args.budget_s,
        "seed": args.seed,
        "per_run": [asdict(r) for r in reports],
    }


if __name__ == "__main__":
    main()
