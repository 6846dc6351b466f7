"""One GPU machine, filled: each GPU preset's steady throughput, then Pong to +18 with the fastest.

    make gpu-bench                       # or: python benchmarks/gpu_bench.py
    python benchmarks/gpu_bench.py [--presets ppo,appo,impala,apex] [--window-s 40]
                                   [--pong-budget-s 300] [--pong-algo fastest|ppo|appo|impala|apex]
                                   [--profile-s 0] [--out-dir benchmarks/results] [--device cuda|cpu]

For each preset ``examples/<algo>_pong_gpu.yaml`` (sized for one GPU and 16 cores) a fresh
process trains until the learner has started and ``--warmup-s`` have passed, then for
``--window-s`` more seconds; the steady rate is the emulator frames sampled in that window over
its length. While it runs, ``nvidia-smi`` is read every half second: ``gpu_util_mean`` is the
mean GPU utilisation (%) over the window, ``gpu_mem_max_mib`` the most memory in use. The
learner's busy share comes from the algorithm's own report: Ape-X's learner thread
(``learner_busy_fraction``), IMPALA/APPO's (1 - ``learner_idle_fraction``), PPO's learn phase
over its whole iteration. ``--profile-s N`` also samples the training process with py-spy for
N seconds inside the window (``profile_<algo>.txt`` in ``--out-dir``, collapsed stacks, one
per line with its count; skipped with a note when py-spy is not installed).

Then one Pong run, in a fresh process, with the preset of the highest steady rate (or
``--pong-algo``), until the mean of the last 20 games reaches +18 or ``--pong-budget-s`` ends
(``benchmarks/atari_pong.py``, so start-up counts; its curve PNG lands in ``--out-dir``).
``--pong-budget-s 0`` skips it.

Without a CUDA device it says so on stderr, prints ``{"benchmark": "gpu_bench", "gpu": false,
...}`` and exits 0 having run nothing. ``--device cpu`` runs the same steps with the CPU standing
in for the GPU, each preset shrunk to ``--cpu-workers`` rollout actors of 2 envs (learner
devices faked, no nvidia-smi): that is how the script's logic is tested without a GPU; its
rates say nothing of a GPU machine.

Progress goes to stderr. After every step the JSON so far is written to
``<out-dir>/gpu_bench.json`` (a run cut short still leaves what it measured); the last stdout line
is the same JSON object: ``gpu``, ``device``, ``torch``, ``presets`` (per algorithm:
``frames_per_s``, ``window_s``, ``gpu_util_mean``, ``gpu_mem_max_mib``,
``learner_busy_fraction``, ``frames``, ``agent_steps``, ``seconds_to_learner_start``, or
``error``), ``fastest``, ``pong`` (``algo``, ``reached``, ``seconds_to_18``,
``agent_steps_to_18``, ``best_mean_20``, ``frames_per_s``, ``gpu_util_mean``) and ``seconds``
(the whole script).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ALGOS = ("ppo", "appo", "impala", "apex")


def log(msg: str) -> None:
    print(f"[gpu_bench] {msg}", file=sys.stderr, flush=True)


def preset_path(algo: str) -> Path:
    return REPO / "examples" / f"{algo}_pong_gpu.yaml"


def cpu_overrides(algo: str, data: dict[str, Any], workers: int) -> dict[str, Any]:
    """The preset shrunk for a CPU stand-in: a few actors of 2 envs, learner devices faked.

    Only what must change for a machine without a GPU changes; the learning keys stay."""
    res = dict(data.get("resources") or {})
    res.update(num_gpus=0, num_workers=workers, num_envs_per_worker=2)
    if algo == "apex":
        res.update(num_replay_shards=1, replay_shard_cpus=0.0)
        data["learning_starts"] = 200
        data["replay_capacity"] = 5_000
    if workers > 0:
        res["num_cpus_per_worker"] = 0.5
    data["resources"] = res
    if algo in ("appo", "impala"):
        data["fake_devices"] = True
    if algo == "ppo":
        data["train_batch_size"] = 64 * max(1, workers) * 2 if workers else 128
        data["minibatch_size"] = 64
    return data


def busy_fraction(algo: str, result: dict[str, Any]) -> float | None:
    """The learner's busy share of the last iteration, from the algorithm's own report."""
    if "learner_busy_fraction" in result:
        return float(result["learner_busy_fraction"])
    if "learner_idle_fraction" in result:
        return 1.0 - float(result["learner_idle_fraction"])
    phases = {k: float(v) for k, v in result.items() if k.startswith("timers/") and k.endswith("_ms")}
    total = sum(phases.values())
    if algo == "ppo" and total > 0 and "timers/learn_ms" in phases:
        return phases["timers/learn_ms"] / total
    return None


def steady_rate(points: list[tuple[float, int]], start: float, window_s: float) -> tuple[float, float, int] | None:
    """(frames/s, seconds, frames) between the first point at or after ``start`` and the last
    point, provided the last is at least ``window_s`` later; None when the window is not covered.

    ``points`` are (seconds, frames) after each iteration, in order."""
    after = [p for p in points if p[0] >= start]
    if len(after) < 2:
        return None
    (t0, f0), (t1, f1) = after[0], after[-1]
    if t1 - t0 < window_s or t1 <= t0:
        return None
    return (f1 - f0) / (t1 - t0), t1 - t0, f1 - f0


def child(algo: str, config_path: str, warmup_s: float, window_s: float, cpu_workers: int | None, spawn_time: float):
    """Train ``algo`` from its GPU preset until the window is covered; the JSON result."""
    import torch

    from shoal import runtime
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    data = load_yaml(config_path)
    data.pop("stop", None)
    data.pop("algo", None)
    data.setdefault("seed", 0)
    if cpu_workers is not None:
        data = cpu_overrides(algo, data, cpu_workers)
    config = get_config_class(algo)(**data)
    skip = config.env_preprocessing.frame_skip
    algo_obj = config.build()
    out: dict[str, Any] = {"algo": algo, "config": Path(config_path).name, "frames_per_s": None}
    points: list[tuple[float, int]] = []
    busy: list[float] = []
    start = None  # seconds (from spawn) at which the steady window opens
    try:
        while True:
            result = algo_obj.train()
            now = time.time()
            seconds = now - spawn_time
            frames = int(result["env_steps_sampled"]) * skip
            points.append((seconds, frames))
            trained = float(result.get("env_steps_trained", 0) or 0) > 0
            if start is None and trained and seconds >= warmup_s:
                start = seconds
                out["seconds_to_learner_start"] = round(seconds, 1)
                out["window_start_epoch"] = now
            if start is not None:
                b = busy_fraction(algo, result)
                if b is not None and seconds > start:
                    busy.append(b)
            log(f"{algo}: {seconds:.0f} s, {frames} frames" + (f", busy {busy[-1]:.2f}" if busy else ""))
            if start is not None:
                got = steady_rate(points, start, window_s)
                if got is not None:
                    rate, span, n = got
                    out.update(
                        frames_per_s=round(rate, 1),
                        window_s=round(span, 1),
                        frames=n,
                        agent_steps=n // skip,
                        window_end_epoch=now,
                        learner_busy_fraction=round(sum(busy) / len(busy), 3) if busy else None,
                    )
                    break
            if seconds > warmup_s + window_s + 300:
                out["error"] = f"the learner had not started {seconds:.0f} s in"
                break
    finally:
        algo_obj.stop()
        runtime.shutdown()
    return out


class GpuSampler:
    """``nvidia-smi`` every half second in the background: (epoch, util %, memory MiB) samples."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "500"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.time(), float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def summary(self, t0: float | None, t1: float | None) -> dict[str, float | None]:
        inside = [s for s in self.samples if t0 is not None and t1 is not None and t0 <= s[0] <= t1]
        if not inside:
            return {"gpu_util_mean": None, "gpu_mem_max_mib": None}
        return {
            "gpu_util_mean": round(sum(s[1] for s in inside) / len(inside), 1),
            "gpu_mem_max_mib": max(s[2] for s in inside),
        }


def run_preset(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    """One preset's steady throughput in a fresh process (with the GPU sampled and, if asked, py-spy)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        algo,
        "--warmup-s",
        str(args.warmup_s),
        "--window-s",
        str(args.window_s),
    ]
    if args.device == "cpu":
        cmd += ["--cpu-workers", str(args.cpu_workers or 0)]
    sampler = GpuSampler()
    sampler.start()
    spawn = time.time()
    proc = subprocess.Popen(cmd + ["--spawn-time", repr(spawn)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    spy = None
    if args.profile_s > 0:
        spy = start_profile(algo, proc.pid, args)
    try:
        stdout, _ = proc.communicate(timeout=args.warmup_s + args.window_s + 420)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        sampler.stop()
        return {"algo": algo, "error": "timed out"}
    finally:
        if spy is not None:
            spy.wait()
    sampler.stop()
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"algo": algo, "error": f"exited with code {proc.returncode}"}
    out = json.loads(lines[-1])
    out.update(sampler.summary(out.pop("window_start_epoch", None), out.pop("window_end_epoch", None)))
    if spy is not None:
        out["profile"] = str(Path(args.out_dir) / f"profile_{algo}.txt")
    return out


def start_profile(algo: str, pid: int, args: argparse.Namespace) -> subprocess.Popen | None:
    """py-spy on the training process for ``--profile-s`` seconds, starting ``--warmup-s`` in."""
    spy = shutil.which("py-spy")
    if spy is None:
        log("py-spy is not installed: no profile")
        return None
    path = Path(args.out_dir) / f"profile_{algo}.txt"
    script = (
        f"sleep {args.warmup_s + 5:g}; exec {spy} record --pid {pid} --duration {args.profile_s:g} "
        f"--rate 50 --nonblocking --threads --format raw --output {path}"
    )
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_pong(algo: str, args: argparse.Namespace) -> dict[str, Any]:
    """``atari_pong.py`` on the GPU preset of ``algo`` for ``--pong-budget-s``; its JSON, GPU sampled."""
    config = preset_path(algo)
    if args.device == "cpu":  # the preset shrunk as for the throughput runs, in a file beside the results
        from shoal.config import load_yaml

        data = cpu_overrides(algo, load_yaml(str(config)), args.cpu_workers or 0)
        config = Path(args.out_dir) / f"{algo}_pong_cpu_standin.yaml"
        config.write_text(json.dumps(data))  # JSON is YAML
    sampler = GpuSampler()
    sampler.start()
    t0 = time.time()
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "atari_pong.py"),
        "--algo",
        algo,
        "--config",
        str(config),
        "--budget-s",
        str(args.pong_budget_s),
        "--out-dir",
        str(args.out_dir),
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, timeout=args.pong_budget_s + 900)
    sampler.stop()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"algo": algo, "error": f"atari_pong.py exited with code {proc.returncode}"}
    r = json.loads(lines[-1])
    keep = ("reached", "seconds_to_18", "agent_steps_to_18", "best_mean_20", "final_mean_20", "frames")
    out = {"algo": algo, "budget_s": args.pong_budget_s, **{k: r.get(k) for k in keep}}
    out["frames_per_s"] = round(r["frames_per_s"], 1) if r.get("frames_per_s") else None
    out["learner_busy_fraction"] = r.get("learner_busy_fraction")
    out["png"] = r.get("png")
    out.update(sampler.summary(t0, time.time()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description="Each GPU Pong preset's steady frames/s, then Pong to +18; one JSON line.")
    p.add_argument("--presets", default=",".join(ALGOS), help=f"comma-separated, of {', '.join(ALGOS)}")
    p.add_argument("--warmup-s", type=float, default=15.0, help="seconds from process start before the window")
    p.add_argument("--window-s", type=float, default=40.0, help="seconds of steady training measured per preset")
    p.add_argument("--pong-budget-s", type=float, default=300.0, help="the Pong run's budget; 0 skips it")
    p.add_argument("--pong-algo", default="fastest", help="fastest (by steady frames/s) or an algorithm")
    p.add_argument("--profile-s", type=float, default=0.0, help="py-spy seconds inside each window (0: none)")
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when one is visible")
    p.add_argument("--cpu-workers", type=int, default=None, help="--device cpu: rollout actors per preset (0)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        r = child(
            args.child, str(preset_path(args.child)), args.warmup_s, args.window_s, args.cpu_workers, args.spawn_time
        )
        print(json.dumps(r), flush=True)
        return

    import torch

    presets = [a.strip() for a in args.presets.split(",") if a.strip()]
    bad = [a for a in presets if a not in ALGOS]
    if bad or (args.pong_algo not in ("fastest", *ALGOS)):
        raise SystemExit(
            f"gpu_bench: presets and --pong-algo must be of {', '.join(ALGOS)}; got {bad or args.pong_algo}"
        )
    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else None)
    out: dict[str, Any] = {"benchmark": "gpu_bench", "gpu": cuda, "torch": torch.__version__}
    if device is None or (device == "cuda" and not cuda):
        log("no GPU: torch sees no CUDA device on this machine; nothing was run (--device cpu runs the CPU stand-in)")
        print(json.dumps({**out, "presets": {}, "fastest": None, "pong": None}))
        return
    args.device = device
    out["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (stand-in)"
    out["cpus"] = os.cpu_count()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    out["presets"] = {}

    def save() -> None:
        out["seconds"] = round(time.time() - t_start, 1)
        (out_dir / "gpu_bench.json").write_text(json.dumps(out) + "\n")

    for algo in presets:
        log(f"{algo}: {preset_path(algo).name}, {args.window_s:g} s window after {args.warmup_s:g} s")
        out["presets"][algo] = run_preset(algo, args)
        log(f"{algo}: {out['presets'][algo]}")
        save()
    rates = {a: r["frames_per_s"] for a, r in out["presets"].items() if r.get("frames_per_s")}
    out["fastest"] = max(rates, key=rates.__getitem__) if rates else None
    pong_algo = out["fastest"] if args.pong_algo == "fastest" else args.pong_algo
    out["pong"] = None
    if args.pong_budget_s > 0 and pong_algo is not None:
        log(f"Pong to +18 with {pong_algo}, budget {args.pong_budget_s:g} s")
        out["pong"] = run_pong(pong_algo, args)
    save()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
