"""A run directory's own files: where a new one is made, its config.yaml, and run.yaml (the
stop criteria and checkpoint settings ``resume`` reads back)."""

from __future__ import annotations

import textwrap
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from shoal import checkpoint as ckpt
from shoal.app.stop_criteria import Stop
from shoal.config import AlgorithmConfig
from shoal.errors import CheckpointError, ConfigError
from shoal.files import safe_yaml, unwritable_ancestor


def check_out_dir(out: str | Path) -> None:
    """A ConfigError unless run directories can be made under ``out``: an existing directory, or a
    path whose nearest existing ancestor is a writable directory."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(
            f"--out '{out}' is not a directory (run directories are made inside it); give a directory such as runs/."
        )
    ancestor = unwritable_ancestor(p)
    if ancestor is not None:
        raise ConfigError(
            f"--out '{out}': '{ancestor}' is not a writable directory, so no run directory can be made "
            "there; give a directory you can write."
        )


def new_run_dir(out: str | Path, config: AlgorithmConfig) -> Path:
    """A new run directory ``<algo>_<env>_<timestamp>`` under ``out``, or ``..._<timestamp>-1``,
    ``-2``, ... when that name is taken. Each name is claimed by its mkdir (which fails on an
    existing directory), not by a look first: two runs started in the same second, in separate
    processes, never get the same directory."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{config.algo}_{config.env_name()}_{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    d, i = base, 1
    while True:
        try:
            d.mkdir()
            return d
        except FileExistsError:
            d, i = base.with_name(f"{base.name}-{i}"), i + 1


def _write_config(run_dir: Path, config: AlgorithmConfig, config_note: str | None) -> None:
    """config.yaml, led by ``config_note`` as YAML comment lines."""
    if isinstance(config.callbacks, type) and config.to_dict()["callbacks"] is None:
        warnings.warn(
            f"callbacks class {config.callbacks.__qualname__} is defined in __main__ or inside a function, "
            "so config.yaml and checkpoints record no callbacks (resume and evaluate run without them); "
            "define it in a module to keep it.",
            stacklevel=3,
        )
    comment = "".join(f"# {line}\n" for line in textwrap.wrap(config_note or "", 100, break_on_hyphens=False))
    (run_dir / "config.yaml").write_text(comment + config.to_yaml())


def _write_run_settings(run_dir: Path, stop: Stop, checkpoint_every: int, keep_checkpoints: int) -> None:
    """run.yaml: what ``resume`` needs besides the checkpoint (stop criteria, checkpoint cadence)."""
    ckpt.write_text_atomic(
        run_dir / "run.yaml",
        yaml.safe_dump(
            {  # resume rewrites it: never leave it torn
                "stop": stop.model_dump(),
                "checkpoint_every": checkpoint_every,
                "keep_checkpoints": keep_checkpoints,
            }
        ),
    )


def _run_settings(run_dir: Path) -> dict[str, Any]:
    """A run directory's run.yaml (stop criteria, checkpoint settings); {} when it has none."""
    run_file = run_dir / "run.yaml"
    if not run_file.is_file():
        return {}
    try:
        settings = safe_yaml(run_file.read_text(encoding="utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        detail = "it is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else " ".join(str(e).split())
        raise CheckpointError(
            f"'{run_file}' cannot be read ({detail}); it holds the run's stop criteria and "
            "checkpoint settings as `shoal train` wrote them. Restore it, or delete it to resume "
            "with no stop criterion but the ones you give."
        ) from None
    if not isinstance(settings, dict):
        raise CheckpointError(
            f"'{run_file}' holds {type(settings).__name__}, not the mapping `shoal train` writes; "
            "restore it, or delete it to resume with the stop criteria you give."
        )
    for key in ("checkpoint_every", "keep_checkpoints"):
        value = settings.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(
                f"'{run_file}': {key} is {value!r}, but it must be a whole number of at least 1 "
                f"(`shoal train` wrote one). Fix that line, or delete run.yaml to resume with the "
                "defaults and the stop criteria you give."
            )
    return settings
