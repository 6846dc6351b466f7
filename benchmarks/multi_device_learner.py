"""Updates per second of the multi-device learner thread, on 1 and 2 (fake or real) devices.

The learner trains an IMPALA-sized MLP (obs 64 -> 256 -> 256 -> 2 actions + 1 value) with
a policy-gradient-plus-value loss on random train batches of ``--batch-size`` rows. A feeder
keeps the in-queue full, so what is measured is the learner pipeline itself (loader threads,
tower stacks, per-device forward/backward, gradient averaging, optimizer step, replica sync).
Each setting runs ``--warmup`` seconds untimed, then ``--seconds`` timed; the settings take
turns for ``--rounds`` rounds (so load from other processes hits them alike) and each figure
is the median over its rounds.

Settings: the plain LearnerThread on devices[0] (baseline), then the multi-device thread on
``cpu`` and ``cpu,cpu`` (two fake devices: same process, same cores); on a machine with CUDA
also ``cuda:0``, ``cuda:0,cuda:0`` and, with two or more GPUs, ``cuda:0,cuda:1``.

    python benchmarks/multi_device_learner.py [--seconds 4] [--rounds 3] [--batch-size 512] [--num-sgd-iter 1]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "multi_device_learner", "updates_per_s_1_device", "updates_per_s_2_fake_devices",
"runs": [{"devices", "thread", "updates_per_s", "rows_per_s", "learner_idle_fraction", ...}], ...}``
where the two headline figures are the CPU multi-device runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time

import numpy as np
import torch

from shoal.batch import Batch, Col
from shoal.learn import Learner
from shoal.learn.learner_thread import LearnerThread
from shoal.learn.multi_device import MultiDeviceLearnerThread

OBS_DIM, HIDDEN, NUM_ACTIONS = 64, 256, 2


def log(msg: str) -> None:
    print(f"[multi_device_learner] {msg}", file=sys.stderr, flush=True)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(OBS_DIM, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh()
        )
        self.pi = torch.nn.Linear(HIDDEN, NUM_ACTIONS)
        self.v = torch.nn.Linear(HIDDEN, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def pg_value_loss(module, batch, learner):
    logits, values = module(batch[Col.OBS])
    logp = torch.log_softmax(logits, -1)
    act_logp = logp.gather(-1, batch[Col.ACTIONS].long().unsqueeze(-1)).squeeze(-1)
    pi_loss = -(act_logp * batch[Col.ADVANTAGES]).mean()
    vf_loss = 0.5 * ((values - batch[Col.VALUE_TARGETS]) ** 2).mean()
    entropy = -(logp.exp() * logp).sum(-1).mean()
    loss = pi_loss + 0.5 * vf_loss - 0.01 * entropy
    return loss, {"pi_loss": pi_loss.detach(), "vf_loss": vf_loss.detach()}


def make_batches(n: int, rows: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    return [
        Batch(
            {
                Col.OBS: rng.normal(size=(rows, OBS_DIM)).astype(np.float32),
                Col.ACTIONS: rng.integers(0, NUM_ACTIONS, size=rows),
                Col.ADVANTAGES: rng.normal(size=rows).astype(np.float32),
                Col.VALUE_TARGETS: rng.normal(size=rows).astype(np.float32),
            }
        )
        for _ in range(n)
    ]


def measure(devices: list[str], multi: bool, args, batches: list[Batch]) -> dict:
    torch.manual_seed(0)
    learner = Learner(Net(), pg_value_loss, lr=5e-4, grad_clip=40.0, device=devices[0])
    if multi:
        t = MultiDeviceLearnerThread(
            learner,
            devices,
            num_sgd_iter=args.num_sgd_iter,
            num_multi_gpu_tower_stacks=args.stacks,
            num_data_load_threads=args.loaders,
            learner_queue_size=16,
            learner_queue_timeout=60.0,
        )
    else:
        t = LearnerThread(learner, num_sgd_iter=args.num_sgd_iter, learner_queue_size=16, learner_queue_timeout=60.0)
    done = threading.Event()

    def feed():  # keep the in-queue full; the learner should never wait on data
        i = 0
        while not done.is_set():
            if t.add(batches[i % len(batches)]):
                i += 1
            else:
                time.sleep(0.001)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    t.start()
    try:
        time.sleep(args.warmup)
        t.check()
        t.stats()  # reset the windows
        u0, rows0, t0 = t.num_updates, 0, time.perf_counter()
        while not t.outqueue.empty():
            t.outqueue.get_nowait()
        time.sleep(args.seconds)
        u1, elapsed = t.num_updates, time.perf_counter() - t0
        while not t.outqueue.empty():
            rows0 += t.outqueue.get_nowait()[0]
        t.check()
        stats = t.stats()
    finally:
        done.set()
        t.stop()
        feeder.join(2.0)
    out = {
        "devices": ",".join(devices),
        "thread": "multi_device" if multi else "single",
        "updates_per_s": (u1 - u0) / elapsed,
        "rows_per_s": rows0 / elapsed,
        "learner_idle_fraction": stats["learner_idle_fraction"],
        "grad_ms": stats["timers/learner_grad_ms"],
        "load_ms": stats["timers/learner_load_ms"],
        "load_wait_ms": stats["timers/learner_load_wait_ms"],
    }
    log(
        f"{out['thread']:>12} on {out['devices']:<16} {out['updates_per_s']:8.1f} updates/s "
        f"({out['rows_per_s']:9.0f} rows/s), grad {out['grad_ms']:.2f} ms, idle {out['learner_idle_fraction']:.2f}"
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per setting and round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over all settings; figures are medians")
    p.add_argument("--warmup", type=float, default=1.5, help="untimed seconds per setting")
    p.add_argument("--batch-size", type=int, default=512, help="rows per train batch")
    p.add_argument("--num-sgd-iter", type=int, default=1)
    p.add_argument("--stacks", type=int, default=2, help="num_multi_gpu_tower_stacks")
    p.add_argument("--loaders", type=int, default=1, help="num_data_load_threads")
    p.add_argument("--torch-threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.torch_threads)
    batches = make_batches(8, args.batch_size)

    settings: list[tuple[list[str], bool]] = [(["cpu"], False), (["cpu"], True), (["cpu", "cpu"], True)]
    if torch.cuda.is_available():
        settings += [(["cuda:0"], False), (["cuda:0"], True), (["cuda:0", "cuda:0"], True)]
        if torch.cuda.device_count() >= 2:
            settings.append((["cuda:0", "cuda:1"], True))
    log(
        f"batch {args.batch_size} rows, num_sgd_iter {args.num_sgd_iter}, {args.stacks} stacks, "
        f"{args.loaders} loader(s), torch threads {torch.get_num_threads()}, cuda {torch.cuda.is_available()}"
    )
    rounds = [[measure(devs, multi, args, batches) for devs, multi in settings] for _ in range(args.rounds)]
    runs = []
    for i, first in enumerate(rounds[0]):
        run = {
            k: float(np.median([rd[i][k] for rd in rounds])) if isinstance(v, float) else v for k, v in first.items()
        }
        run["updates_per_s_rounds"] = [rd[i]["updates_per_s"] for rd in rounds]
        runs.append(run)

    def ups(devices: str) -> float:
        return next(r["updates_per_s"] for r in runs if r["devices"] == devices and r["thread"] == "multi_device")

    print(
        json.dumps(
            {
                "benchmark": "multi_device_learner",
                "updates_per_s_1_device": ups("cpu"),
                "updates_per_s_2_fake_devices": ups("cpu,cpu"),
                "single_thread_updates_per_s": runs[0]["updates_per_s"],
                "batch_size": args.batch_size,
                "rounds": args.rounds,
                "seconds_per_round": args.seconds,
                "num_sgd_iter": args.num_sgd_iter,
                "stacks": args.stacks,
                "loaders": args.loaders,
                "torch_threads": torch.get_num_threads(),
                "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"
                + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""),
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
