"""A run directory is data, not code: what a checkpoint names is imported only when vouched for;
the working directory never shadows installed packages; YAML alias bombs are refused; secrets
in URLs never reach a file shoal writes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import flat, invoke

import shoal
from shoal import PPOConfig
from shoal import checkpoint as ckpt
from shoal.config import import_path, load_yaml
from shoal.errors import ConfigError
from shoal.files import redact_secrets, safe_yaml, strip_redacted_password
from shoal.trust import (
    UntrustedCodeError,
    code_references,
    destination_references,
    import_gate,
    key_file,
    sign_meta,
    signed_by_me,
    trusted_without_asking,
)

HOOKS_MODULE = """
from pathlib import Path

import shoal

Path(__file__).with_name("imported.txt").write_text("the hooks module ran")


class Hooks(shoal.Callbacks):
    pass
"""

ENV_MODULE = """
import gymnasium as gym


def make_short_cartpole(max_steps=20):
    return gym.make("CartPole-v1", max_episode_steps=max_steps)
"""


@pytest.fixture(autouse=True)
def own_key(tmp_path_factory, monkeypatch):
    """Every test signs with a key of its own, never the user's."""
    monkeypatch.setenv("SHOAL_KEY_FILE", str(tmp_path_factory.mktemp("key") / "checkpoint.key"))


def checkpoint(tmp_path: Path, name: str = "ck", **config) -> Path:
    algo = PPOConfig(seed=0, **{"env": "CartPole-v1", **config}).build()
    try:
        return algo.save(tmp_path / name)
    finally:
        algo.stop()


def edit_meta(ck: Path, **changes) -> dict:
    meta = json.loads((ck / "meta.json").read_text())
    for key, value in changes.items():
        node = meta
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    (ck / "meta.json").write_text(json.dumps(meta))
    return meta


def as_run_dir(ck: Path) -> Path:
    run = ck.parent / "run"
    (run / "checkpoints").mkdir(parents=True)
    ck.rename(run / "checkpoints" / "checkpoint_000001")
    return run


# ---- signing ---------------------------------------------------------------------------------
def test_checkpoints_are_signed_and_a_changed_byte_breaks_the_signature(tmp_path):
    ck = checkpoint(tmp_path)
    meta = ckpt.read_meta(ck)
    assert len(meta["signature"]) == 64 and signed_by_me(meta)
    assert oct(key_file().stat().st_mode & 0o777) == "0o600"
    assert not signed_by_me({**meta, "iteration": meta["iteration"] + 1})
    assert not signed_by_me({**meta, "config": {**meta["config"], "env_config": {"max_episode_steps": 5}}})
    assert not signed_by_me({k: v for k, v in meta.items() if k != "signature"})
    assert signed_by_me(sign_meta({**meta, "iteration": 9}))


def test_another_users_key_does_not_vouch(tmp_path, monkeypatch):
    ck = checkpoint(tmp_path)
    monkeypatch.setenv("SHOAL_KEY_FILE", str(tmp_path / "other.key"))
    assert not signed_by_me(ckpt.read_meta(ck))
    assert not (tmp_path / "other.key").exists()  # checking creates no key


# ---- what needs vouching ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, path, trusted",
    [
        ("env", "CartPole-v1", True),
        ("env", "ALE/Pong-v5", True),
        ("env", "shoal/StatelessCartPole-v1", True),
        ("env", "pettingzoo.classic:tictactoe_v3", True),
        ("env", "shoal.envs.pixel_catch:PixelCatch", True),
        ("env", "subprocess:run", False),
        ("env", "os", False),  # a module name: the multi-agent form imports it
        (
            "env",
            "shoal.app.trainer:train",
            False,
        ),  # inside shoal, but not an env: its arguments would come from the file
        ("env", "shoal.envs.make:make_env", False),
        ("env", "pettingzoo.utils:wrappers", False),  # a pettingzoo module that is not an env
        ("env", "my_envs:make_maze", False),
        ("env", "openspiel:leduc_poker", True),  # built by shoal's OpenSpiel adapter, nothing imported
        ("env", "openspiel:", False),
        ("callbacks", "shoal.callbacks:Callbacks", True),
        ("callbacks", "my_hooks:Hooks", False),
        ("model.custom", "my_models:Net", False),
        ("league", "alpha_star", True),
        ("league", "my_league:Builder", False),
        ("league.type", "shoal.league.alpha_star:AlphaStarLeagueBuilder", True),
        ("league.type", "alpha_star", True),  # the presets' league: {type: alpha_star}
        ("league.type", "no_league", True),
        ("league.type", "my_league:Builder", False),
        ("multi_agent.policy_mapping", "my_maps:by_seat", False),
    ],
)
def test_what_shoal_trusts_without_asking(key, path, trusted):
    assert trusted_without_asking(key, path) is trusted


def test_code_references_finds_every_import_path_at_any_depth():
    config = {
        "env": "my_envs:make",
        "callbacks": "my_hooks:Hooks",
        "model": {"custom": "my_models:Net"},
        "league": {"type": "my_league:Builder", "size": 3},
        "multi_agent": {"policy_mapping": "my_maps:fn", "policies": {"a": {"model": {"custom": "m:A"}}, "b": None}},
        "env_config": {"env": 3},
        "lr": 0.1,
    }
    assert sorted(code_references(config)) == sorted(
        [
            ("env", "my_envs:make"),
            ("callbacks", "my_hooks:Hooks"),
            ("model.custom", "my_models:Net"),
            ("league.type", "my_league:Builder"),
            ("multi_agent.policy_mapping", "my_maps:fn"),
            ("multi_agent.policies.a.model.custom", "m:A"),
        ]
    )
    assert code_references({"env": "CartPole-v1", "multi_agent": {"policy_mapping": {"p0": "a"}}}) == [
        ("env", "CartPole-v1")
    ]


def test_the_gate_refuses_what_was_not_approved():
    assert import_path("json:dumps") is json.dumps  # no gate: a config the user gave imports freely
    with import_gate(frozenset({"json:loads"})):
        assert import_path("json:loads") is json.loads
        assert import_path("shoal.config:import_path") is import_path  # shoal's own
        with pytest.raises(UntrustedCodeError, match="'json:dumps'"):
            import_path("json:dumps")
    with import_gate(None):
        assert import_path("json:dumps") is json.dumps


# ---- the probe's attack, every way a run directory is loaded ------------------------------------
@pytest.fixture
def crafted(tmp_path):
    """A checkpoint whose meta.json makes subprocess.run the env factory: loading it without a check
    would run `touch <marker>`."""
    ck = checkpoint(tmp_path)
    marker = tmp_path / "pwned"
    edit_meta(ck, config__env="subprocess:run", config__env_config={"args": ["touch", str(marker)]})
    return ck, marker


def test_python_loaders_refuse_the_crafted_checkpoint(crafted):
    ck, marker = crafted
    for load in (shoal.load_policy, shoal.load):
        with pytest.raises(UntrustedCodeError) as e:
            load(ck)
        assert "env 'subprocess:run'" in str(e.value) and "trust=True" in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("command", ["evaluate", "export", "resume"])
def test_cli_refuses_the_crafted_run_directory(crafted, command):
    ck, marker = crafted
    target = as_run_dir(ck) if command == "resume" else ck
    extra = ["--stop-iters", "3", "-q"] if command == "resume" else []
    r = invoke(command, target, *extra)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "env 'subprocess:run'" in text and "--trust" in text
    assert not marker.exists()


def test_callbacks_module_is_imported_only_with_trust(tmp_path, monkeypatch):
    """A module in the working directory named by the file: refused before import; --trust imports it."""
    (tmp_path / "shoal_test_probe_hooks.py").write_text(HOOKS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shoal_test_probe_hooks", raising=False)
    ck = checkpoint(tmp_path)
    edit_meta(ck, config__callbacks="shoal_test_probe_hooks:Hooks")
    r = invoke("evaluate", ck, "-n", "1")
    assert r.exit_code == 2 and "callbacks 'shoal_test_probe_hooks:Hooks'" in " ".join(r.output.split())
    assert not (tmp_path / "imported.txt").exists()
    r = invoke("evaluate", ck, "-n", "1", "--trust")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "imported.txt").exists()


def test_own_runs_load_and_a_tampered_one_does_not(tmp_path, monkeypatch):
    (tmp_path / "shoal_test_trust_envs.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ck = checkpoint(tmp_path, env="shoal_test_trust_envs:make_short_cartpole")
    with shoal.load_policy(ck) as policy:  # signed with this user's key: imports as before
        assert policy.predict(policy.observation_space.sample())[0] in (0, 1)
    edit_meta(ck, config__env_config={"max_steps": 7})
    with pytest.raises(UntrustedCodeError, match="shoal_test_trust_envs:make_short_cartpole"):
        shoal.load_policy(ck)
    with shoal.load_policy(ck, trust=True) as policy:
        assert policy.config.env_config == {"max_steps": 7}


def test_code_given_again_needs_no_trust(crafted):
    ck, marker = crafted
    import gymnasium as gym

    with shoal.load_policy(ck, env=lambda **kw: gym.make("CartPole-v1"), env_config={}) as policy:
        assert policy.action_space.n == 2
    with shoal.load_policy(ck, overrides={"env": "CartPole-v1", "env_config": {}}) as policy:
        assert policy.action_space.n == 2
    assert not marker.exists()


def test_registered_ids_need_no_signature(tmp_path):
    ck = checkpoint(tmp_path)
    meta = json.loads((ck / "meta.json").read_text())
    del meta["signature"]  # as a checkpoint of an older shoal, or one from another machine
    (ck / "meta.json").write_text(json.dumps(meta))
    with shoal.load_policy(ck) as policy:
        assert policy.action_space.n == 2


def test_an_unsigned_league_run_on_openspiel_needs_no_trust(tmp_path, monkeypatch):
    """The presets' form, league: {type: alpha_star} on openspiel:<game>, names only shoal's code."""
    pytest.importorskip("pyspiel")
    from shoal.algorithms.alpha_star import AlphaStarConfig

    cfg = AlphaStarConfig(
        env="openspiel:kuhn_poker",
        seed=0,
        rollout_fragment_length=4,
        train_batch_size=64,
        max_num_policies_to_train=1,
        league={"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0, "num_random_policies": 1},
        model={"hiddens": [16]},
        resources={"num_envs_per_worker": 8},
    )
    with cfg.build() as algo:
        ck = algo.save(tmp_path / "ck")
    monkeypatch.setenv("SHOAL_KEY_FILE", str(tmp_path / "other.key"))  # copied to another account
    assert not signed_by_me(ckpt.read_meta(ck))
    r = invoke("evaluate", ck, "-n", "2")
    assert r.exit_code == 0, r.output
    assert "main vs random over 2" in flat(r.output)


# ---- keys that send data or control elsewhere ---------------------------------------------------
def test_destination_references_name_the_cluster_and_the_trackers():
    assert destination_references({"env": "CartPole-v1"}) == []
    local = {"resources": {"address": "local"}, "logging": {"wandb": {"mode": "offline", "entity": "me"}}}
    assert destination_references(local) == []
    remote = {
        "resources": {"address": "auto"},
        "logging": {
            "mlflow": {"tracking_uri": "https://mlflow.example.com"},
            "wandb": {"mode": "online", "entity": "them"},
        },
    }
    assert destination_references(remote) == [
        ("resources.address", "auto"),
        ("logging.mlflow.tracking_uri", "https://mlflow.example.com"),
        ("logging.wandb.mode", "online"),
        ("logging.wandb.entity", "them"),
    ]


DESTINATIONS = {
    "cluster": ({"config__resources__address": "127.0.0.1:1"}, "resources.address '127.0.0.1:1'"),
    "mlflow": (
        {"config__logging__writers": ["mlflow"], "config__logging__mlflow__tracking_uri": "https://mlflow.example.com"},
        "logging.mlflow.tracking_uri 'https://mlflow.example.com'",
    ),
    "wandb": (
        {"config__logging__writers": ["wandb"], "config__logging__wandb__mode": "online"},
        "logging.wandb.mode 'online'",
    ),
}


@pytest.mark.parametrize("kind", list(DESTINATIONS))
def test_resume_refuses_an_unsigned_run_that_names_a_cluster_or_a_tracker(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # without the check: fail fast, not in minutes
    changes, named = DESTINATIONS[kind]
    ck = checkpoint(tmp_path)
    edit_meta(ck, **changes)
    run = as_run_dir(ck)
    r = invoke("resume", run, "--stop-iters", "2", "-q")
    assert r.exit_code == 2, r.output
    text = flat(r.output)
    assert named in text and "--trust" in text and "sends data or control elsewhere" in text, text
    assert r.exception is None or isinstance(r.exception, SystemExit)  # a message, no traceback
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000001"]


def test_a_tracker_store_is_made_only_for_a_signed_or_trusted_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    store = tmp_path / "elsewhere" / "mlruns"
    ck = checkpoint(tmp_path, logging={"writers": ["mlflow"], "mlflow": {"tracking_uri": store.as_uri()}})
    run = as_run_dir(ck)
    own_key = os.environ["SHOAL_KEY_FILE"]
    monkeypatch.setenv("SHOAL_KEY_FILE", str(tmp_path / "other.key"))  # the run copied to another account
    r = invoke("resume", run, "--stop-iters", "2", "-q")
    assert r.exit_code == 2 and f"logging.mlflow.tracking_uri '{store.as_uri()}'" in flat(r.output), r.output
    assert not store.exists()
    monkeypatch.setenv("SHOAL_KEY_FILE", own_key)  # back home: signed with this key, resumes as before
    r = invoke("resume", run, "--stop-iters", "2", "-q")
    assert r.exit_code == 0, r.output
    assert store.is_dir()
    monkeypatch.setenv("SHOAL_KEY_FILE", str(tmp_path / "other.key"))
    r = invoke("resume", run, "--stop-iters", "3", "-q", "--trust")
    assert r.exit_code == 0, r.output


def test_a_policy_connects_nowhere_but_a_rebuilt_algorithm_could(tmp_path):
    ck = checkpoint(tmp_path)
    edit_meta(ck, config__resources__address="10.0.0.1:6379")
    with shoal.load_policy(ck) as policy:  # no algorithm, no Ray: the address is never used
        assert policy.action_space.n == 2
    with pytest.raises(UntrustedCodeError, match=r"resources\.address '10\.0\.0\.1:6379'") as e:
        shoal.load(ck)
    assert "trust=True" in str(e.value) and "overrides={'resources': {'address': None}}" in str(e.value)
    r = invoke("evaluate", ck, "-n", "1")
    assert r.exit_code == 2 and "resources.address '10.0.0.1:6379'" in flat(r.output)
    shoal.load(ck, overrides={"resources": {"address": None}}).stop()  # the key given again
    shoal.load(ck, trust=True).stop()


# ---- the signing key ---------------------------------------------------------------------------
SMALL = ["--set", "train_batch_size=256", "--set", "minibatch_size=128", "--set", "num_sgd_iter=1", "--seed", "0"]


@pytest.mark.parametrize(
    "kind, said",
    [("garbage", "does not hold a key"), ("directory", "is a directory"), ("unreadable", "cannot be read")],
)
def test_an_unusable_key_file_is_said_once_and_left_alone(tmp_path, monkeypatch, caplog, kind, said):
    key = tmp_path / "checkpoint.key"
    if kind == "directory":
        key.mkdir()
    else:
        key.write_text("garbage\n")
    if kind == "unreadable":
        key.chmod(0)
        if os.geteuid() == 0:  # root reads any file: the key's open fails as it would for a user
            real_open = open

            def no_read(file, *args, **kwargs):
                if Path(file) == key:
                    raise PermissionError(13, "Permission denied", str(key))
                return real_open(file, *args, **kwargs)

            monkeypatch.setattr("shoal.trust.open", no_read, raising=False)
    monkeypatch.setenv("SHOAL_KEY_FILE", str(key))
    with caplog.at_level(logging.WARNING, logger="shoal.trust"):
        r = invoke(
            "train", "ppo", "--env", "CartPole-v1", "--stop-iters", "2", "--checkpoint-every", "1",
            "--out", tmp_path / "runs", "-q", *SMALL,
        )  # fmt: skip
    assert r.exit_code == 0, r.output
    warned = [m for m in caplog.messages if str(key) in m]
    assert len(warned) == 1, caplog.messages  # once, though the run wrote several checkpoints
    assert said in warned[0] and "unsigned" in warned[0] and "--trust" in warned[0]
    (run,) = (tmp_path / "runs").iterdir()
    assert all("signature" not in ckpt.read_meta(c) for c in ckpt.list_checkpoints(run / "checkpoints"))
    assert key.is_dir() if kind == "directory" else key.read_text() == "garbage\n"  # never replaced


def test_a_missing_key_is_made_quietly_and_one_others_can_read_is_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="shoal.trust"):
        checkpoint(tmp_path, "first")  # the first run: the key is created, mode 0600, nothing to say
        assert not caplog.messages
        key_file().chmod(0o644)
        ck = checkpoint(tmp_path, "second")
        checkpoint(tmp_path, "third")
    (warned,) = caplog.messages
    assert f"'{key_file()}' can be read by other users" in warned and f"chmod 600 '{key_file()}'" in warned
    assert signed_by_me(ckpt.read_meta(ck))  # still signs with it


# ---- the import path ------------------------------------------------------------------------
SHADOW = """
from pathlib import Path
Path(__file__).with_name("shadowed.txt").write_text("{name}.py in the working directory was imported")
raise ImportError("shadowed")
"""


def test_the_working_directory_shadows_no_installed_package(tmp_path):
    for name in ("gymnasium", "torch", "yaml", "typer"):
        (tmp_path / f"{name}.py").write_text(SHADOW.format(name=name))
    (tmp_path / "shoal_test_cwd_mod.py").write_text("VALUE = 42\n")
    shoal_exe = Path(sys.executable).with_name("shoal")
    p = subprocess.run(
        [str(shoal_exe), "config", "ppo", "--yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "shadowed.txt").exists()
    code = (
        "import os, sys\nfrom shoal.app import cli\nsys.argv = ['shoal', 'algos']\ntry:\n    cli.main()\n"
        "except SystemExit:\n    pass\nimport gymnasium, shoal_test_cwd_mod\n"
        "print(sys.path.index(os.getcwd()), len(sys.path), shoal_test_cwd_mod.VALUE)\n"
    )
    # -I: no working directory on the path to begin with, as for the `shoal` console script
    p = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "shadowed.txt").exists()
    index, length, value = map(int, p.stdout.splitlines()[-1].split())
    assert index == length - 1 and value == 42  # last on the path, and its modules still import


def test_ray_workers_append_the_working_directory(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    def path_of_worker() -> tuple[list[str], str]:
        return list(sys.path), os.getcwd()

    path, worker_cwd = ray.get(path_of_worker.remote())
    cwd = os.getcwd()
    assert worker_cwd == cwd  # relative paths resolve as in the driver
    assert path.count(cwd) == 1
    packages = [i for i, p in enumerate(path) if p.endswith("site-packages")]
    assert packages and path.index(cwd) > max(packages)


# ---- YAML ------------------------------------------------------------------------------------
def test_alias_bomb_is_refused_quickly_and_anchors_still_work(tmp_path):
    layers = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
    )
    assert len(layers) < 600  # ~387M strings once expanded
    (tmp_path / "bomb.yaml").write_text(layers)
    with pytest.raises(ConfigError, match="alias bomb"):
        load_yaml(tmp_path / "bomb.yaml")
    assert safe_yaml("base: &b {hiddens: [64, 64]}\nmodel: *b\nother: {<<: *b, activation: relu}\n") == {
        "base": {"hiddens": [64, 64]},
        "model": {"hiddens": [64, 64]},
        "other": {"hiddens": [64, 64], "activation": "relu"},
    }


# ---- secrets ---------------------------------------------------------------------------------
def test_url_passwords_never_reach_the_files(tmp_path):
    uri = "https://alice:s3cret-token@mlflow.example.com:5000/"
    cfg = PPOConfig(env="CartPole-v1", logging={"writers": ["mlflow"], "mlflow": {"tracking_uri": uri}})
    assert "s3cret" not in cfg.to_yaml() and "https://alice:***@mlflow.example.com:5000/" in cfg.to_yaml()
    assert cfg.logging.mlflow.tracking_uri == uri  # the running config keeps it
    algo = cfg.build()
    try:
        ck = algo.save(tmp_path / "ck")
    finally:
        algo.stop()
    assert b"s3cret" not in (ck / "meta.json").read_bytes()
    assert (
        strip_redacted_password(ckpt.read_meta(ck)["config"]["logging"]["mlflow"]["tracking_uri"])
        == "https://mlflow.example.com:5000/"
    )
    assert redact_secrets({"a": ["postgresql://u:p@db/x", "http://host/p:q@r"]}) == {
        "a": ["postgresql://u:***@db/x", "http://host/p:q@r"]
    }
