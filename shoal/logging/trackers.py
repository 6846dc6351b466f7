"""Experiment trackers as result writers: Weights & Biases and MLflow (optional extras).

Each writer files a run directory's results under one tracker run, whose id it keeps in the
run directory's ``trackers.yaml``, so ``shoal resume`` goes on logging to the same run.
The packages are imported here only, when a config chooses the tracker
(``logging.writers``); ``LoggingConfig.check_installed`` names the extra to install first.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from shoal.files import safe_yaml, strip_redacted_password
from shoal.logging.values import flatten_config, scalar_items

IDS_FILE = "trackers.yaml"


def read_run_id(run_dir: Path, key: str) -> str | None:
    p = run_dir / IDS_FILE
    data = safe_yaml(p.read_text()) if p.is_file() else None
    return (data or {}).get(key)


def store_run_id(run_dir: Path, key: str, value: str) -> None:
    p = run_dir / IDS_FILE
    data = (safe_yaml(p.read_text()) if p.is_file() else None) or {}
    data[key] = value
    p.write_text(yaml.safe_dump(data))


class WandbWriter:
    """A W&B run (``mode`` offline by default: files under ``<run_dir>/wandb``, upload later with
    ``wandb sync``). Scalars are logged once per iteration against ``env_steps_sampled``, the
    step metric of every other key, so a resumed run may log steps again without W&B dropping them."""

    def __init__(self, run_dir: Path, config: dict[str, Any], settings) -> None:
        import wandb

        run_id = read_run_id(run_dir, "wandb_run_id") or uuid.uuid4().hex[:12]
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            group=settings.group,
            tags=list(settings.tags) or None,
            mode=settings.mode,
            dir=str(run_dir),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            config=config,
            reinit="create_new",
        )
        store_run_id(run_dir, "wandb_run_id", run_id)
        self.run.define_metric("env_steps_sampled")
        self.run.define_metric("*", step_metric="env_steps_sampled")

    def write(self, result: dict[str, Any]) -> None:
        self.run.log(dict(scalar_items(result)))

    def checkpoint(self, path: Path, kind: str) -> None:
        self.run.summary[f"checkpoint/{kind}"] = str(path)

    def close(self) -> None:
        self.run.finish()


_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in metric and param names replaced by '_'."""
    return _METRIC_CHARS.sub("_", key)[:250]


class MlflowWriter:
    """An MLflow run: the flattened config as params (once, when the run is created), every scalar
    per iteration at step ``env_steps_sampled``, checkpoint paths as ``shoal.checkpoint.<kind>`` tags.

    Without ``tracking_uri`` the store is ``<run_dir>/mlruns``, a file store; MLflow 3 keeps that
    back end only on request, so the writer sets ``MLFLOW_ALLOW_FILE_STORE`` (unless already set)
    when the URI is a file store.
    """

    def __init__(self, run_dir: Path, config: dict[str, Any], settings) -> None:
        # a URI read back from a checkpoint has its password redacted: MLflow then takes the credentials
        # from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD
        uri = strip_redacted_password(settings.tracking_uri) if settings.tracking_uri else None
        uri = uri or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = read_run_id(run_dir, "mlflow_run_id")
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
            return
        exp = self.client.get_experiment_by_name(settings.experiment_name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(settings.experiment_name)
        run = self.client.create_run(exp_id, run_name=run_dir.name, tags={"shoal.run_dir": str(run_dir.resolve())})
        self.run_id = run.info.run_id
        store_run_id(run_dir, "mlflow_run_id", self.run_id)
        self._log_params(config)

    def _log_params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = [Param(mlflow_key(k), str(v)[:MAX_PARAM_VAL_LENGTH]) for k, v in flatten_config(config).items()]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH])

    def write(self, result: dict[str, Any]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        step, now = int(result.get("env_steps_sampled", result.get("iteration", 0))), int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, now, step) for k, v in scalar_items(result)]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])

    def checkpoint(self, path: Path, kind: str) -> None:
        self.client.set_tag(self.run_id, f"shoal.checkpoint.{kind}", str(Path(path).resolve()))

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


__all__ = ["MlflowWriter", "WandbWriter", "mlflow_key", "read_run_id"]
