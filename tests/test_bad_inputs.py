"""Bad inputs, every command and algorithm: each one exits 2 with one paragraph that names the
input and says what is allowed, shows no traceback, and leaves nothing half-done behind.

One table: a row is an id, the argv of ``shoal ...`` (``{tmp}`` is the row's temp directory; a
row with ``runs`` gets a copy of a one-iteration PPO run in ``{tmp}/run``, and of a DQN one in
``{tmp}/dqn``), an optional setup that writes or damages the files the row needs, and words the
message must contain. Rows run in-process with typer's CliRunner; those whose point is a real
process (a cluster address) run ``python -m shoal`` as a subprocess. ``train`` rows write to
``{tmp}/runs``; no row may add, remove or change any file under its temp directory. Usage errors
of click itself (an option's declared range or type) keep click's format and are marked ``usage``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest
from helpers import invoke

MAX_LINES = 1  # the error paragraph (notes about presets and stop criteria come only once a run starts)
TINY_PPO = [
    "--set",
    "train_batch_size=64",
    "--set",
    "minibatch_size=32",
    "--set",
    "num_sgd_iter=1",
    "--envs-per-worker",
    "2",
    "--seed",
    "0",
    "-q",
]


@dataclass
class Row:
    id: str
    argv: list[str]
    expect: tuple[str, ...]  # each must appear in the message (case-insensitive, whitespace collapsed)
    setup: Optional[Callable[[Path], None]] = None
    subprocess: bool = False
    runs: Optional[str] = field(default=None)  # "ppo" or "ppo+dqn": the row gets copies of those trained runs
    usage: bool = False  # click's own usage error (an option's declared range): "Usage: ..." and a boxed line
    absent: tuple[str, ...] = ()  # each must not appear in the output (case-insensitive)


def _write(name: str, data: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        p = tmp / name
        p.write_bytes(data) if isinstance(data, bytes) else p.write_text(data)

    return setup


def _state(data: bytes | None) -> Callable[[Path], None]:
    """Replace the best checkpoint's state.pt with ``data`` (None: remove it)."""

    def setup(tmp: Path) -> None:
        for c in (tmp / "run" / "checkpoints").iterdir():
            f = c / "state.pt"
            size = f.stat().st_size
            if data is None:
                f.unlink()
            else:
                f.write_bytes(data if data != b"TRUNCATE" else f.read_bytes()[: size // 2])

    return setup


def _empty_run(tmp: Path) -> None:
    """A run directory whose results.jsonl holds no row yet (its first iteration has not ended)."""
    (tmp / "empty").mkdir()
    (tmp / "empty" / "results.jsonl").touch()


def _meta_missing(tmp: Path) -> None:
    (tmp / "run" / "checkpoints" / "best" / "meta.json").unlink()


def _dqn_weights_in_ppo(tmp: Path) -> None:
    dqn_state = next((tmp / "dqn" / "checkpoints").glob("checkpoint_*/state.pt"))
    for c in (tmp / "run" / "checkpoints").iterdir():
        shutil.copy(dqn_state, c / "state.pt")


def _torn_run_yaml(tmp: Path) -> None:
    (tmp / "run" / "run.yaml").write_bytes(b"\x00\xff\xfe binary")


def _not_a_run(tmp: Path) -> None:
    (tmp / "notarun").mkdir()
    (tmp / "notarun" / "notes.txt").write_text("my notes")


def _meta_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """Apply ``edit`` to the meta.json of every checkpoint of the copied run (its signature left as is)."""

    def setup(tmp: Path) -> None:
        import json

        for c in (tmp / "run" / "checkpoints").iterdir():
            meta = json.loads((c / "meta.json").read_text())
            edit(meta)
            (c / "meta.json").write_text(json.dumps(meta))

    return setup


def _shell_env_at(tmp_marker: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        def edit(meta: dict) -> None:
            meta["config"]["env"] = "subprocess:run"
            meta["config"]["env_config"] = {"args": ["touch", str(tmp / tmp_marker)]}

        _meta_edit(edit)(tmp)

    return setup


def _evil_callbacks(tmp: Path) -> None:
    """A module in the working directory that leaves a file when imported, named by meta.json's callbacks."""

    def edit(meta: dict) -> None:
        meta["config"]["callbacks"] = "shoal_probe_hooks:Hooks"

    _meta_edit(edit)(tmp)


def _meta_without(key: str) -> Callable[[Path], None]:
    return _meta_edit(lambda meta: meta.pop(key))


def _meta_set(key: str, value) -> Callable[[Path], None]:
    return _meta_edit(lambda meta: meta.__setitem__(key, value))


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


RANDOM_BYTES = bytes(range(256)) * 64
T = ["train"]
PPO = ["train", "ppo", "--env", "CartPole-v1"]

ROWS = [
    # ---- the algorithm name ----
    Row("unknown-algo-train", ["train", "ppoo", "--env", "CartPole-v1"], ("ppoo", "ppo")),
    Row("unknown-algo-config", ["config", "dqnn"], ("dqnn", "dqn")),
    # ---- config files ----
    Row("yaml-missing-file", PPO + ["-c", "{tmp}/nope.yaml"], ("nope.yaml", "does not exist")),
    Row(
        "yaml-list",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("c.yaml", "mapping", "list"),
        _write("c.yaml", "- lr: 1\n- gamma: 2\n"),
    ),
    Row("yaml-scalar", PPO + ["-c", "{tmp}/c.yaml"], ("c.yaml", "mapping"), _write("c.yaml", "42\n")),
    Row("yaml-binary", PPO + ["-c", "{tmp}/c.yaml"], ("c.yaml", "utf-8"), _write("c.yaml", RANDOM_BYTES[128:200])),
    Row(
        "yaml-tab",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("c.yaml", "not valid yaml", "line"),
        _write("c.yaml", "lr: 0.001\nresources:\n\tnum_workers: 2\n"),
    ),
    Row("yaml-no-env", ["train", "ppo", "-c", "{tmp}/c.yaml"], ("no env", "--env"), _write("c.yaml", "")),
    Row("yaml-other-algo", PPO + ["-c", "{tmp}/c.yaml"], ("c.yaml", "dqn", "ppo"), _write("c.yaml", "algo: dqn\n")),
    Row(
        "yaml-stop-not-mapping",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("stop", "mapping", "iterations"),
        _write("c.yaml", "stop: 100\n"),
    ),
    Row(
        "yaml-stop-unknown-key",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("stop", "reward, env_steps"),
        _write("c.yaml", "stop: {steps: 100}\n"),
    ),
    Row("yaml-section-scalar", PPO + ["-c", "{tmp}/c.yaml"], ("resources",), _write("c.yaml", "resources: 4\n")),
    Row("yaml-alias-bomb", PPO + ["-c", "{tmp}/c.yaml"], ("c.yaml", "alias bomb", "100,000"), _write("c.yaml", BOMB)),
    Row(
        "yaml-recursive-alias",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("c.yaml", "recursive alias"),
        _write("c.yaml", "model: &m {hiddens: [64], x: *m}\n"),
    ),
    Row(
        "yaml-duplicate-key",
        PPO + ["-c", "{tmp}/c.yaml"],
        ("c.yaml", "'lr' is given twice", "line 2"),
        _write("c.yaml", "lr: 0.001\nlr: 0.1\n"),
    ),
    Row("yaml-empty-list", PPO + ["-c", "{tmp}/c.yaml"], ("c.yaml", "mapping", "list"), _write("c.yaml", "[]\n")),
    Row(
        "set-alias-bomb",
        PPO + ["--set", "env_config={" + BOMB.replace("\n", ", ") + "}"],
        ("--set env_config", "alias bomb"),
    ),
    # ---- --set ----
    Row("set-without-equals", PPO + ["--set", "lr"], ("--set", "key=value", "'lr'")),
    Row("set-empty-key", PPO + ["--set", "=3"], ("--set", "key=value")),
    Row("set-malformed-value", PPO + ["--set", "model.hiddens=[64,"], ("model.hiddens", "[64,")),
    Row("set-unknown-key", PPO + ["--set", "lrr=0.1"], ("lrr", "did you mean 'lr'")),
    Row("set-unknown-section-key", PPO + ["--set", "resources.num_workrs=2"], ("num_workrs", "resources.num_workers")),
    Row("set-key-in-other-section", PPO + ["--set", "num_workers=2"], ("num_workers", "resources.num_workers")),
    Row(
        "set-section-and-value",
        PPO + ["--set", "resources=2", "--set", "resources.num_workers=1"],
        ("resources", "section"),
    ),
    # ---- wrong types, per section ----
    Row("ppo-lr-string", PPO + ["--set", "lr=fast"], ("'lr'", "fast", "number")),
    Row("ppo-gamma-above-1", PPO + ["--set", "gamma=1.5"], ("gamma", "1.5")),
    Row("ppo-batch-negative", PPO + ["--set", "train_batch_size=-5"], ("train_batch_size", "-5")),
    Row("ppo-hiddens-negative", PPO + ["--set", "model.hiddens=[-1]"], ("model.hiddens", "-1", "positive")),
    Row("ppo-hiddens-zero", PPO + ["--set", "model.hiddens=[64,0]"], ("model.hiddens", "positive")),
    Row("ppo-hiddens-string", PPO + ["--set", "model.hiddens=big"], ("model.hiddens", "big")),
    Row("ppo-activation", PPO + ["--set", "model.activation=sigmoid"], ("activation", "tanh, relu, elu")),
    Row(
        "ppo-evaluation-type",
        PPO + ["--set", "evaluation.evaluation_interval=often"],
        ("evaluation.evaluation_interval", "often"),
    ),
    Row("ppo-env-config-unknown-kwarg", PPO + ["--set", "env_config.gravity=3"], ("gravity", "env_config")),
    Row("workers-negative", PPO + ["--workers", "-1"], ("num_workers", "-1", "greater than or equal to 0")),
    Row("envs-per-worker-zero", PPO + ["--envs-per-worker", "0"], ("num_envs_per_worker", "0")),
    Row("envs-per-worker-absurd", PPO + ["--envs-per-worker", "100000000"], ("num_envs_per_worker", "100000000", "GB")),
    Row(
        "conv-kernel-larger-than-image",
        ["train", "ppo", "--env", "shoal.envs.pixel_catch:PixelCatch", "--set", "model.conv_filters=[[8,11,1]]"],
        ("conv_filters", "11x11", "10x10"),
    ),
    Row("batch-absurd", PPO + ["--set", "train_batch_size=1000000000000"], ("train_batch_size=1000000000000", "GB")),
    Row("hiddens-absurd", PPO + ["--set", "model.hiddens=[100000000,100000000]"], ("model.hiddens", "GB")),
    Row(
        "impala-lstm-absurd",
        [
            "train",
            "impala",
            "--env",
            "CartPole-v1",
            "--set",
            "model.use_lstm=true",
            "--set",
            "model.lstm_cell_size=1000000000",
        ],
        ("model.lstm_cell_size=1000000000", "GB"),
    ),
    Row(
        "apex-replay-absurd",
        ["train", "apex", "--env", "CartPole-v1", "--set", "replay_capacity=100000000000000"],
        ("replay_capacity", "GB", "nothing was allocated"),
    ),
    Row("appo-workers-negative", ["train", "appo", "--env", "CartPole-v1", "--workers", "-3"], ("num_workers", "-3")),
    Row(
        "alpha-star-league-without-type",
        ["train", "alpha_star", "--env", "pettingzoo.classic:tictactoe_v3", "--set", "league.num_main_exploiters=1"],
        ("league", "'type' key"),
    ),
    Row(
        "ddppo-backend",
        ["train", "ddppo", "--env", "CartPole-v1", "--set", "torch_distributed_backend=pigeon"],
        ("torch_distributed_backend", "gloo, nccl, mpi", "pigeon"),
    ),
    Row(
        "ddppo-batch-mode",
        ["train", "ddppo", "--env", "CartPole-v1", "--set", "batch_mode=complete_episodes"],
        ("batch_mode", "truncate_episodes"),
    ),
    Row(
        "impala-vtrace-clip-negative",
        ["train", "impala", "--env", "CartPole-v1", "--set", "vtrace_clip_rho_threshold=-1"],
        ("vtrace_clip_rho_threshold", "-1"),
    ),
    Row(
        "appo-pettingzoo-without-multi-agent",
        ["train", "appo", "--env", "pettingzoo.classic:tictactoe_v3"],
        ("tictactoe_v3", "multi_agent"),
    ),
    Row(
        "ppo-multi-agent-policies-scalar",
        ["train", "ppo", "--env", "pettingzoo.classic:tictactoe_v3", "--set", "multi_agent.policies=5"],
        ("multi_agent.policies", "dictionary"),
    ),
    Row(
        "dqn-epsilon-above-1",
        ["train", "dqn", "--env", "CartPole-v1", "--set", "exploration_final_eps=2"],
        ("exploration_final_eps", "less than or equal to 1"),
    ),
    Row(
        "alpha-star-workers-negative",
        ["train", "alpha_star", "--env", "pettingzoo.classic:tictactoe_v3", "--workers", "-3"],
        ("num_workers", "-3"),
    ),
    Row(
        "minibatch-above-batch",
        PPO + ["--set", "minibatch_size=100000", "--set", "train_batch_size=64"],
        ("minibatch_size", "train_batch_size"),
    ),
    Row("fragment-zero", PPO + ["--set", "rollout_fragment_length=0"], ("rollout_fragment_length", "'auto'")),
    Row("env-config-scalar", PPO + ["--set", "env_config=5"], ("env_config", "dictionary")),
    Row("seed-string", PPO + ["--set", "seed=abc"], ("seed", "abc", "integer")),
    Row("custom-model-missing", PPO + ["--set", "model.custom=nosuch.mod:Net"], ("nosuch.mod:Net", "package.module")),
    Row("callbacks-missing", PPO + ["--set", "callbacks=nosuch:Cb"], ("nosuch:Cb", "package.module")),
    Row("normalize-not-bool", PPO + ["--set", "normalize.obs=maybe"], ("normalize.obs", "maybe", "boolean")),
    Row("lr-schedule-point", PPO + ["--set", "lr_schedule=[[0]]"], ("lr_schedule[0]", "[env_steps, lr]")),
    Row("lr-schedule-decreasing", PPO + ["--set", "lr_schedule=[[100,0.1],[0,0.2]]"], ("lr_schedule", "increasing")),
    Row(
        "address-malformed",
        PPO + ["--set", "resources.address=my cluster"],
        ("resources.address", "my cluster", "host:port"),
    ),
    Row("config-is-directory", PPO + ["-c", "{tmp}"], ("is a directory",)),
    # ---- stop criteria and run settings ----
    Row("stop-reward-nan", PPO + ["--stop-reward", "nan"], ("reward", "nan", "finite")),
    Row("stop-reward-inf", PPO + ["--stop-reward", "inf"], ("reward", "inf", "finite")),
    Row("stop-steps-negative", PPO + ["--stop-steps", "-5"], ("env_steps", "-5")),
    Row("stop-iters-zero", PPO + ["--stop-iters", "0"], ("iterations", "0")),
    Row("stop-time-negative", PPO + ["--stop-time", "-1"], ("time_s", "-1")),
    Row("stop-reward-contradiction", PPO + ["--stop-reward", "100", "--no-stop-reward"], ("--no-stop-reward",)),
    Row("checkpoint-every-zero", PPO + ["--checkpoint-every", "0"], ("checkpoint_every", "at least 1")),
    Row("seed-negative", PPO + ["--seed", "-5"], ("seed", "-5", "greater than or equal to 0")),
    Row("seed-too-large", PPO + ["--seed", str(2**32)], ("seed", str(2**32), "2130706431")),
    Row("out-not-a-directory", PPO + ["--out", "/dev/null"], ("--out", "/dev/null", "not a directory")),
    # /proc passes the permission bits for root, yet no directory can be made in it
    Row("out-uncreatable", PPO + ["--out", "/proc/x/runs"], ("--out", "'/proc'", "not a writable directory")),
    Row("ppo-vf-loss-coeff-inf", PPO + ["--set", "vf_loss_coeff=inf"], ("vf_loss_coeff", "finite")),
    Row(
        "ppo-init-log-std-inf",
        ["train", "ppo", "--env", "Pendulum-v1", "--set", "model.init_log_std=inf"],
        ("model.init_log_std", "finite"),
    ),
    # ---- envs ----
    Row("env-unknown-id", ["train", "ppo", "--env", "CartPol-v1"], ("CartPol-v1", "did you mean", "CartPole-v1")),
    Row("env-import-missing-module", ["train", "ppo", "--env", "no_such_pkg.envs:make"], ("no_such_pkg",)),
    Row(
        "env-factory-raises",
        ["train", "ppo", "--env", "bad_envs:raising_env"],
        ("bad_envs:raising_env", "maze.txt is missing"),
    ),
    Row("env-factory-not-env", ["train", "ppo", "--env", "bad_envs:not_an_env"], ("bad_envs:not_an_env", "int")),
    Row(
        "env-unsupported-obs-space",
        ["train", "ppo", "--env", "bad_envs:TextObsEnv", "--stop-iters", "1"],
        ("bad_envs:TextObsEnv", "Text", "Dict or Tuple"),
    ),
    Row("env-import-empty-module", ["train", "ppo", "--env", ":make"], ("':make'", "module before the colon")),
    Row(
        "env-old-gym-api",
        ["train", "ppo", "--env", "bad_envs:OldGymApiEnv"],
        ("bad_envs:OldGymApiEnv", "old gym API", "(obs, info)"),
    ),
    Row(
        "pettingzoo-to-ppo",
        ["train", "ppo", "--env", "pettingzoo.classic:tictactoe_v3"],
        ("tictactoe_v3", "multi_agent"),
    ),
    Row(
        "pettingzoo-parallel-env-to-ppo",  # the spelling of the multi-agent guide
        ["train", "ppo", "--env", "pettingzoo.classic.rps_v2:parallel_env"],
        ("rps_v2:parallel_env", "PettingZoo (multi-agent) env", "multi_agent section"),
    ),
    Row(
        "pettingzoo-aec-env-to-appo",
        ["train", "appo", "--env", "pettingzoo.classic.tictactoe_v3:env"],
        ("tictactoe_v3:env", "PettingZoo (multi-agent) env", "multi_agent section"),
    ),
    Row(
        "gymnasium-to-alpha-star",
        ["train", "alpha_star", "--env", "CartPole-v1"],
        ("CartPole-v1", "single-agent Gymnasium", "PettingZoo"),
    ),
    Row("dqn-box-actions", ["train", "dqn", "--env", "Pendulum-v1"], ("Pendulum-v1", "Discrete")),
    Row("apex-box-actions", ["train", "apex", "--env", "Pendulum-v1"], ("Pendulum-v1", "Discrete")),
    # ---- each algorithm's own keys ----
    Row(
        "dqn-replay-absurd",
        ["train", "dqn", "--env", "CartPole-v1", "--set", "replay_capacity=100000000000000"],
        ("replay_capacity", "GB"),
    ),
    Row(
        "dqn-target-freq-zero",
        ["train", "dqn", "--env", "CartPole-v1", "--set", "target_network_update_freq=0"],
        ("target_network_update_freq", "0"),
    ),
    Row("dqn-lstm", ["train", "dqn", "--env", "CartPole-v1", "--set", "model.use_lstm=true"], ("use_lstm",)),
    Row(
        "apex-shards-zero",
        ["train", "apex", "--env", "CartPole-v1", "--set", "resources.num_replay_shards=0"],
        ("num_replay_shards", "0"),
    ),
    Row(
        "impala-fragment-string",
        ["train", "impala", "--env", "CartPole-v1", "--set", "rollout_fragment_length=long"],
        ("rollout_fragment_length", "long"),
    ),
    Row(
        "appo-clip-negative",
        ["train", "appo", "--env", "CartPole-v1", "--set", "clip_param=-0.2"],
        ("clip_param", "-0.2"),
    ),
    Row("ddppo-no-workers", ["train", "ddppo", "--env", "CartPole-v1", "--workers", "0"], ("num_workers", "1")),
    Row(
        "alpha-star-league-unknown",
        ["train", "alpha_star", "--env", "pettingzoo.classic:tictactoe_v3", "--set", "league=alpha_sta"],
        ("league", "alpha_sta"),
    ),
    # ---- evaluate ----
    Row("evaluate-missing-path", ["evaluate", "{tmp}/nothing"], ("nothing", "does not exist")),
    Row("evaluate-not-a-run", ["evaluate", "{tmp}/notarun"], ("notarun", "checkpoint"), _not_a_run),
    Row(
        "evaluate-meta-missing",
        ["evaluate", "{tmp}/run/checkpoints/best"],
        ("best", "meta.json"),
        _meta_missing,
        runs="ppo",
    ),
    Row(
        "evaluate-meta-corrupt",
        ["evaluate", "{tmp}/run/checkpoints/best"],
        ("meta.json",),
        _write("run/checkpoints/best/meta.json", "{not json"),
        runs="ppo",
    ),
    Row("evaluate-state-empty", ["evaluate", "{tmp}/run"], ("state.pt", "empty"), _state(b""), runs="ppo"),
    Row(
        "evaluate-state-truncated",
        ["evaluate", "{tmp}/run"],
        ("state.pt", "truncated"),
        _state(b"TRUNCATE"),
        runs="ppo",
    ),
    Row("evaluate-state-random", ["evaluate", "{tmp}/run"], ("state.pt",), _state(RANDOM_BYTES), runs="ppo"),
    Row(
        "evaluate-other-algo-weights",
        ["evaluate", "{tmp}/run"],
        ("state.pt", "ppo", "another algorithm"),
        _dqn_weights_in_ppo,
        runs="ppo+dqn",
    ),
    Row(
        "evaluate-checkpoint-choice",
        ["evaluate", "{tmp}/run", "--checkpoint", "newest"],
        ("newest", "best, last"),
        runs="ppo",
    ),
    Row(
        "evaluate-episodes-zero",
        ["evaluate", "{tmp}/run", "--episodes", "0"],
        ("--episodes", "greater than or equal to 1"),
        runs="ppo",
        usage=True,
    ),
    Row(
        "evaluate-episodes-word",
        ["evaluate", "{tmp}/run", "--episodes", "ten"],
        ("--episodes", "valid integer"),
        runs="ppo",
        usage=True,
    ),
    Row(
        "evaluate-opponent-single-agent", ["evaluate", "{tmp}/run", "--opponent", "random"], ("--opponent",), runs="ppo"
    ),
    Row("evaluate-video-episodes-alone", ["evaluate", "{tmp}/run", "--video-episodes", "2"], ("--video",), runs="ppo"),
    Row(
        "evaluate-seed-negative",
        ["evaluate", "{tmp}/run", "--seed", "-1"],
        ("--seed", "greater than or equal to 0"),
        runs="ppo",
        usage=True,
    ),
    Row(
        "evaluate-video-suffix",
        ["evaluate", "{tmp}/run", "--video", "{tmp}/out.txt"],
        ("--video", ".txt", ".mp4"),
        runs="ppo",
    ),
    Row(
        "evaluate-video-unwritable",
        ["evaluate", "{tmp}/run", "--video", "/dev/null/out.mp4"],
        ("--video", "/dev/null", "not a writable directory"),
        runs="ppo",
    ),
    Row(
        "evaluate-video-uncreatable",
        ["evaluate", "{tmp}/run", "--video", "/proc/x/out.mp4"],
        ("--video", "'/proc'", "not a writable directory"),
        runs="ppo",
    ),
    Row(
        "evaluate-meta-shell-env",
        ["evaluate", "{tmp}/run"],
        ("env 'subprocess:run'", "--trust", "signed"),
        _shell_env_at("pwned"),
        runs="ppo",
    ),
    Row(
        "evaluate-meta-callbacks-module",
        ["evaluate", "{tmp}/run"],
        ("callbacks 'shoal_probe_hooks:Hooks'", "--trust"),
        _evil_callbacks,
        runs="ppo",
    ),
    Row(
        "evaluate-meta-no-algo",
        ["evaluate", "{tmp}/run"],
        ("meta.json", "'algo' is missing"),
        _meta_without("algo"),
        runs="ppo",
    ),
    Row(
        "evaluate-meta-no-config",
        ["evaluate", "{tmp}/run"],
        ("meta.json", "'config' is missing"),
        _meta_without("config"),
        runs="ppo",
    ),
    Row(
        "evaluate-meta-no-iteration",
        ["evaluate", "{tmp}/run"],
        ("meta.json", "'iteration' is missing"),
        _meta_without("iteration"),
        runs="ppo",
    ),
    Row(
        "evaluate-meta-algo-number",
        ["evaluate", "{tmp}/run"],
        ("meta.json", "'algo' is int 7"),
        _meta_set("algo", 7),
        runs="ppo",
    ),
    # ---- resume ----
    Row(
        "resume-meta-shell-env",
        ["resume", "{tmp}/run", "--stop-iters", "5"],
        ("env 'subprocess:run'", "--trust"),
        _shell_env_at("pwned"),
        runs="ppo",
    ),
    Row(
        "resume-meta-no-config",
        ["resume", "{tmp}/run", "--stop-iters", "5"],
        ("meta.json", "'config' is missing"),
        _meta_without("config"),
        runs="ppo",
    ),
    Row("resume-missing", ["resume", "{tmp}/nothing"], ("nothing", "does not exist")),
    Row("resume-not-a-run", ["resume", "{tmp}/notarun"], ("notarun", "run directory"), _not_a_run),
    Row("resume-binary-run-yaml", ["resume", "{tmp}/run"], ("run.yaml",), _torn_run_yaml, runs="ppo"),
    Row(
        "resume-all-state-corrupt",
        ["resume", "{tmp}/run", "--stop-iters", "9"],
        ("state.pt",),
        _state(RANDOM_BYTES),
        runs="ppo",
    ),
    Row("resume-no-checkpoints", ["resume", "{tmp}/run"], ("checkpoint",), _state(None), runs="ppo"),
    Row(
        "resume-all-state-empty",
        ["resume", "{tmp}/run", "--stop-iters", "9"],
        ("state.pt", "empty", "start a new one", "config.yaml"),
        _state(b""),
        runs="ppo",
        absent=("earlier",),  # no earlier checkpoint is there to resume from
    ),
    Row(
        "resume-meta-no-iteration",
        ["resume", "{tmp}/run", "--stop-iters", "5"],
        ("meta.json", "'iteration' is missing"),
        _meta_without("iteration"),
        runs="ppo",
    ),
    Row(
        "resume-meta-iteration-word",
        ["resume", "{tmp}/run", "--stop-iters", "5"],
        ("meta.json", "'iteration' is str 'three'", "whole number"),
        _meta_set("iteration", "three"),
        runs="ppo",
    ),
    Row(
        "resume-meta-iteration-negative",  # was taken as is: the run trained past its stop
        ["resume", "{tmp}/run"],
        ("meta.json", "'iteration' is int -3", "at least 0"),
        _meta_set("iteration", -3),
        runs="ppo",
    ),
    Row(
        "resume-stop-reward-nan",
        ["resume", "{tmp}/run", "--stop-reward", "nan"],
        ("reward", "nan", "finite"),
        runs="ppo",
    ),
    Row(
        "resume-stop-reward-contradiction",
        ["resume", "{tmp}/run", "--stop-reward", "100", "--no-stop-reward"],
        ("--stop-reward 100", "--no-stop-reward", "contradict"),
        runs="ppo",
    ),
    Row("resume-stop-steps-negative", ["resume", "{tmp}/run", "--stop-steps", "-5"], ("env_steps", "-5"), runs="ppo"),
    Row("resume-workers-negative", ["resume", "{tmp}/run", "--workers", "-1"], ("num_workers", "-1"), runs="ppo"),
    Row(
        "resume-run-yaml-keep-word",
        ["resume", "{tmp}/run"],
        ("run.yaml", "keep_checkpoints", "'three'"),
        _write("run/run.yaml", "stop: {iterations: 5}\ncheckpoint_every: 1\nkeep_checkpoints: three\n"),
        runs="ppo",
    ),
    # ---- export ----
    Row("export-format", ["export", "{tmp}/run", "--format", "tflite"], ("tflite", "torchscript", "onnx"), runs="ppo"),
    Row("export-missing", ["export", "{tmp}/nothing"], ("nothing", "does not exist")),
    Row("export-state-random", ["export", "{tmp}/run"], ("state.pt",), _state(RANDOM_BYTES), runs="ppo"),
    Row("export-out-directory", ["export", "{tmp}/run", "--out", "{tmp}"], ("--out", "is a directory"), runs="ppo"),
    Row(
        "export-out-unwritable",
        ["export", "{tmp}/run", "--out", "/dev/null/policy.pt"],
        ("--out", "not a writable directory"),
        runs="ppo",
    ),
    Row(
        "export-out-uncreatable",
        ["export", "{tmp}/run", "--out", "/proc/x/policy.pt"],
        ("--out", "'/proc'", "not a writable directory"),
        runs="ppo",
    ),
    Row(
        "export-meta-shell-env",
        ["export", "{tmp}/run"],
        ("env 'subprocess:run'", "--trust"),
        _shell_env_at("pwned"),
        runs="ppo",
    ),
    # ---- league ----
    Row("league-missing", ["league", "{tmp}/nothing"], ("nothing", "does not exist")),
    Row("keep-checkpoints-zero", PPO + ["--keep-checkpoints", "0"], ("keep_checkpoints", "at least 1")),
    Row("config-yaml-unknown-algo", ["config", "nope", "--yaml"], ("nope", "ppo, dqn")),
    Row("league-not-a-league", ["league", "{tmp}/run"], ("run", "league"), runs="ppo"),
    Row(
        "tune-grid-late-bad-value",
        ["tune", "-c", "{tmp}/t.yaml"],
        ("search key 'lr'", "-1", "number 3"),
        _write(
            "t.yaml",
            "algo: ppo\nconfig: {env: CartPole-v1}\nsearch: {lr: {grid: [0.001, 0.0001, -1]}}\nstop: {iterations: 2}\n",
        ),
    ),
    Row(
        "tune-metric-unknown",  # was Ray's traceback from the first trial, after Ray started, and a tune directory
        ["tune", "-c", "{tmp}/t.yaml", "--out", "{tmp}/runs"],
        ("metric 'episode_reward_mean'", "did you mean 'episode_return_mean'", "learner/..."),
        _write(
            "t.yaml",
            "algo: ppo\nconfig: {env: CartPole-v1}\nsearch: {lr: {grid: [0.001, 0.0001]}}\n"
            "metric: episode_reward_mean\nstop: {iterations: 2}\n",
        ),
    ),
    # ---- plot ----
    Row(
        "plot-out-uncreatable",
        ["plot", "{tmp}/run", "-o", "/proc/x/curves.png"],
        ("--out", "'/proc'", "not a writable directory"),
        runs="ppo",
    ),
    Row(
        "plot-empty-results",
        ["plot", "{tmp}/empty", "-o", "{tmp}/c.png"],
        ("{tmp}/empty/results.jsonl", "no result rows"),
        _empty_run,
    ),
    # ---- cluster addresses: a real process ----
    Row("address-unreachable", PPO + ["--workers", "1", "--address", "127.0.0.1:1"], ("127.0.0.1:1",), subprocess=True),
    Row(
        "address-ray-client-unreachable",
        PPO + ["--workers", "1", "--address", "ray://127.0.0.1:1"],
        ("ray://127.0.0.1:1",),
        subprocess=True,
    ),
]


def test_the_table_is_large_and_distinct():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)) and len(ids) >= 50
    commands = {r.argv[0] for r in ROWS}
    assert commands >= {"train", "evaluate", "resume", "config", "league", "export"}
    algos = {r.argv[1] for r in ROWS if r.argv[0] == "train"}
    assert algos >= {"ppo", "dqn", "apex", "impala", "appo", "ddppo", "alpha_star"}


def _tiny_run(out: Path, algo: str, extra: list[str]) -> Path:
    r = invoke("train", algo, "--env", "CartPole-v1", "--stop-iters", "1", "--out", str(out), *extra)
    assert r.exit_code == 0, r.output
    return next(out.iterdir())


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A one-iteration PPO run and a one-iteration DQN run on CartPole (pristine; rows copy them)."""
    base = tmp_path_factory.mktemp("trained")
    dqn = [
        "--set",
        "learning_starts=32",
        "--set",
        "train_batch_size=32",
        "--set",
        "rollout_fragment_length=16",
        "--envs-per-worker",
        "2",
        "--seed",
        "0",
        "-q",
    ]
    return {"ppo": _tiny_run(base / "ppo", "ppo", TINY_PPO), "dqn": _tiny_run(base / "dqn", "dqn", dqn)}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _invoke(argv: list[str], as_subprocess: bool) -> tuple[int, str]:
    if not as_subprocess:
        r = invoke(*argv)
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            import traceback

            return 1, "".join(traceback.format_exception(r.exception))
        return r.exit_code, r.output
    p = subprocess.run(
        [sys.executable, "-m", "shoal", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_exits_2_with_one_paragraph(row: Row, tmp_path: Path, request, caplog):
    if row.runs:
        runs = request.getfixturevalue("trained")
        shutil.copytree(runs["ppo"], tmp_path / "run")
        if "dqn" in row.runs:
            shutil.copytree(runs["dqn"], tmp_path / "dqn")
    if row.setup:
        row.setup(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in row.argv]
    if argv[0] == "train" and "--out" not in argv:
        argv += ["--out", str(tmp_path / "runs")]
    before = _tree(tmp_path)
    caplog.clear()
    code, output = _invoke(argv, row.subprocess)
    # a warning logged on the way is a line the user sees too (pytest takes it from the CLI's stderr)
    output += "".join(f"{r.getMessage()}\n" for r in caplog.records if r.levelno >= logging.WARNING)
    text = " ".join(output.translate({ord(c): " " for c in "│╭╮╰╯"}).split())
    assert code == 2, output
    assert "Traceback" not in output and 'File "' not in output, output
    assert "weights_only" not in output, output  # never pass on torch's advice to unpickle a file
    if row.usage:
        assert output.startswith("Usage: shoal") and text.count("Invalid value") == 1, output
    else:
        assert "╭" not in output and text.count("error:") == 1, output
        assert len([line for line in output.splitlines() if line.strip()]) <= MAX_LINES, output
    for word in row.expect:
        assert word.replace("{tmp}", str(tmp_path)).lower() in text.lower(), f"{word!r} not in: {output}"
    for word in row.absent:
        assert word.lower() not in text.lower(), f"{word!r} in: {output}"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "a run directory was created"
    assert _tree(tmp_path) == before, "files changed"


def test_memory_estimate_is_the_sum_of_envs_fragments_and_batch(monkeypatch):
    """8 CartPole envs (4 float32 = 16 bytes an observation, so 4 x 16 + 64 = 128 bytes a step):
    8 x 64 KiB = 524,288 for the envs, 8 x (500 + 1) x 128 = 513,024 for 'auto' fragments of
    4000 / 8 = 500 steps, 4000 x 128 = 512,000 for the batch: 1,549,312 bytes in all."""
    import gymnasium as gym

    from shoal import PPOConfig, process
    from shoal.envs.make import check_env_memory
    from shoal.errors import ConfigError

    cfg = PPOConfig(env="CartPole-v1", train_batch_size=4000, resources={"num_envs_per_worker": 8})
    space = gym.make("CartPole-v1").observation_space
    monkeypatch.setattr(process, "available_memory_bytes", lambda: 1_549_312)
    check_env_memory(cfg, space)
    monkeypatch.setattr(process, "available_memory_bytes", lambda: 1_549_311)
    with pytest.raises(ConfigError, match="train_batch_size=4000 is too large"):
        check_env_memory(cfg, space)


def test_unreachable_address_fails_without_ray():
    """The TCP check alone: a refused port is a ResourceError naming the address; 'auto' is left to Ray."""
    import socket

    from shoal.errors import ResourceError
    from shoal.runtime.cluster import check_reachable

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ResourceError, match=f"'ray://127.0.0.1:{port}'.*nothing accepts connections"):
        check_reachable(f"ray://127.0.0.1:{port}", timeout_s=2.0)
    check_reachable("auto")
    check_reachable(None)
