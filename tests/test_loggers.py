"""The logging section: TensorBoard's config text and hparams, Weights & Biases (offline) and MLflow
(file store) runs read back from disk, resume continuing the same tracker run, and config errors."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

import shoal
from shoal.app.trainer import resume
from shoal.errors import ConfigError
from shoal.logging.trackers import mlflow_key, read_run_id
from shoal.logging.writers import flatten_config

SMALL = dict(
    env="CartPole-v1",
    seed=0,
    train_batch_size=256,
    minibatch_size=128,
    num_sgd_iter=1,
    resources={"num_envs_per_worker": 4},
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")  # belt and braces: nothing here may reach the network


def train(tmp_path, writers, iterations=2, **logging):
    config = shoal.PPOConfig(**SMALL, logging={"writers": writers, **logging})
    return shoal.train(config, {"iterations": iterations}, out=tmp_path, checkpoint_every=1, progress=False)


def results(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_flatten_config_and_mlflow_keys():
    assert flatten_config({"lr": 0.1, "model": {"hiddens": [64, 64], "custom": None}, "env_config": {}}) == {
        "lr": 0.1,
        "model.hiddens": "[64, 64]",
        "model.custom": "None",
        "env_config": "{}",
    }
    assert mlflow_key("timers/learn_ms") == "timers/learn_ms"
    assert mlflow_key("policy_return_mean/p<0>") == "policy_return_mean/p_0_"


def test_tensorboard_has_the_config_as_text_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util

    run_dir = train(tmp_path, ["tensorboard"]).run_dir
    (events,) = run_dir.glob("events.out.tfevents*")
    ea = EventAccumulator(str(events), size_guidance={"tensors": 0, "scalars": 0})
    ea.Reload()
    text = tensor_util.make_ndarray(ea.Tensors("config/text_summary")[0].tensor_proto).item().decode()
    assert "algo: ppo" in text and "train_batch_size: 256" in text
    data = {
        tag.rsplit("/", 1)[-1]: plugin_data_pb2.HParamsPluginData.FromString(c)
        for tag, c in ea.PluginTagToContent("hparams").items()
    }
    hparams = data["session_start_info"].session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(3e-4)
    assert hparams["resources.num_envs_per_worker"].number_value == 4
    assert hparams["env"].string_value == "CartPole-v1"
    assert [m.name.tag for m in data["experiment"].experiment.metric_infos] == ["episode_return_mean"]
    steps = [e.step for e in ea.Scalars("episode_return_mean")]
    assert steps == [r["env_steps_sampled"] for r in results(run_dir)]


def test_no_tensorboard_when_left_out(tmp_path):
    run_dir = train(tmp_path, [], iterations=1).run_dir
    assert not list(run_dir.glob("events.out.tfevents*"))
    assert (run_dir / "results.jsonl").is_file() and (run_dir / "progress.csv").is_file()


def test_mlflow_file_store_has_params_metrics_and_checkpoints_and_resume_continues_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    summary = train(tmp_path, ["mlflow"], mlflow={"experiment_name": "hooks-test"})
    run_dir = summary.run_dir
    run_id = read_run_id(run_dir, "mlflow_run_id")
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "hooks-test"
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.0003" and run.data.params["algo"] == "ppo"
    assert run.data.params["model.hiddens"] == "[64, 64]"
    assert run.data.tags["shoal.checkpoint.final"] == str((run_dir / "checkpoints" / "checkpoint_000002").resolve())
    history = client.get_metric_history(run_id, "episode_return_mean")
    rows = results(run_dir)
    assert [(m.step, m.value) for m in history] == [(r["env_steps_sampled"], r["episode_return_mean"]) for r in rows]
    assert "timers/learn_ms" in run.data.metrics

    resume(run_dir, stop={"iterations": 3}, progress=False)
    assert read_run_id(run_dir, "mlflow_run_id") == run_id
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the same run, not a second one
    history = client.get_metric_history(run_id, "iteration")
    assert sorted(m.value for m in history) == [1.0, 2.0, 3.0]
    assert client.get_run(run_id).data.tags["shoal.checkpoint.final"].endswith("checkpoint_000003")


def wandb_log(folder, run_id: str, keys: tuple[bytes, ...], timeout_s: float = 60.0) -> bytes:
    """The offline run's transaction log once it holds ``keys``: W&B's service process may still be
    writing it when finish() returns on a busy machine."""
    (log,) = folder.glob(f"run-{run_id}.wandb")
    deadline = time.monotonic() + timeout_s
    while not all(k in log.read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    return log.read_bytes()


def test_wandb_offline_run_holds_the_history_and_resume_reuses_the_id(tmp_path):
    run_dir = train(tmp_path, ["wandb"], wandb={"project": "hooks-test", "tags": ["a"]}).run_dir
    run_id = read_run_id(run_dir, "wandb_run_id")
    (first,) = run_dir.glob(f"wandb/offline-run-*-{run_id}")
    keys = (b"episode_return_mean", b"env_steps_sampled", b"hooks-test", b"train_batch_size", b"checkpoint/final")
    data = wandb_log(first, run_id, keys)
    for key in keys:
        assert key in data, key

    # a session's folder is named to the second it started: start the next one in a later second
    time.sleep(1.05 - time.time() % 1)
    resume(run_dir, stop={"iterations": 3}, progress=False)
    assert read_run_id(run_dir, "wandb_run_id") == run_id
    assert len(list(run_dir.glob(f"wandb/offline-run-*-{run_id}"))) == 2  # a second session of the same run
    assert len(list(run_dir.glob("wandb/offline-run-*"))) == 2


def test_logger_settings_without_the_logger_are_refused():
    with pytest.raises(ConfigError, match="logging.wandb settings are given but logging.writers does not list wandb"):
        shoal.PPOConfig(env="CartPole-v1", logging={"wandb": {"project": "x"}})
    with pytest.raises(ConfigError, match="logging.writers"):
        shoal.PPOConfig(env="CartPole-v1", logging={"writers": ["neptune"]})


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    config = shoal.PPOConfig(**SMALL, logging={"writers": ["tensorboard", "mlflow"]})
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[mlflow\]' in the shoal checkout"):
        shoal.train(config, {"iterations": 1}, out=tmp_path, progress=False)
    assert not list(tmp_path.iterdir())  # refused before the run directory was written
