"""The ``logging`` section: which loggers a run writes to, with the Weights & Biases and MLflow
settings."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from shoal.config.sections import Section
from shoal.errors import ConfigError


class WandbConfig(Section):
    """Weights & Biases settings (used when ``logging.writers`` lists wandb)."""

    project: str = Field("shoal", description="W&B project the run goes to.")
    entity: Optional[str] = Field(None, description="W&B entity (user or team); None: your default entity.")
    group: Optional[str] = Field(None, description="W&B group that gathers related runs.")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="offline writes under the run directory (upload later with `wandb sync`); online "
        "streams to the W&B server; disabled logs nothing.",
    )
    tags: list[str] = Field(default_factory=list, description="W&B tags of the run.")


class MlflowConfig(Section):
    """MLflow settings (used when ``logging.writers`` lists mlflow)."""

    tracking_uri: Optional[str] = Field(
        None, description="MLflow tracking URI; None: a file store in the run directory's mlruns/ folder."
    )
    experiment_name: str = Field("shoal", description="MLflow experiment the run is filed under (created if missing).")


LOGGER_EXTRAS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # writer -> (module, pip extra)


WriterName = Literal["tensorboard", "wandb", "mlflow"]


def _default_writers() -> list[WriterName]:
    return ["tensorboard"]


class LoggingConfig(Section):
    """Where each iteration's result goes besides results.jsonl and progress.csv (always written)."""

    writers: list[WriterName] = Field(
        default_factory=_default_writers,
        description="Loggers of the run directory: any of tensorboard, "
        "wandb (pip install -e '.[wandb]' in the shoal checkout), mlflow (pip install -e '.[mlflow]').",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases settings.")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="MLflow settings.")

    @model_validator(mode="after")
    def _settings_need_writer(self) -> "LoggingConfig":
        for name in ("wandb", "mlflow"):
            if name not in self.writers and getattr(self, name) != type(getattr(self, name))():
                raise ValueError(
                    f"logging.{name} settings are given but logging.writers does not list {name}: "
                    f"add {name} to logging.writers, or leave logging.{name} out"
                )
        return self

    def check_installed(self) -> None:
        """A ConfigError naming the extra to install for each chosen logger whose package is missing."""
        import importlib.util

        for name in self.writers:
            module, extra = LOGGER_EXTRAS.get(name, (None, None))
            if module and importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"logging.writers lists {name}, but the {module} package is not installed: "
                    f"pip install -e '.[{extra}]' in the shoal checkout, or remove {name} from logging.writers."
                )
