"""A ``shoal tune`` run's trials: how each ended (:func:`trial_ending`), the progress lines while
they run (:class:`TuneProgress`), the :class:`TuneSummary` of what they found (with
best_config.yaml), and the best trial of a finished run's directory (:func:`best_trial_dir`)."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from shoal.app.tune_spec import AshaSpec, TuneSpec


@dataclasses.dataclass
class TuneSummary:
    """What a tune run found: one row per trial, the best trial's config, where it all is."""

    run_dir: Path
    metric: str
    mode: str
    trials: list[dict[str, Any]]  # {"trial", "params", "iterations", "metric", "status"}
    best_config: dict[str, Any] | None  # the algorithm config (with "algo"), as `shoal train -c` reads it
    best_metric: float | None
    best_config_path: Path | None
    best_trial: str | None = None  # the best trial's id
    best_checkpoint: Path | None = None  # its last shoal checkpoint (what `shoal evaluate RUN_DIR` plays)

    @property
    def stopped_early(self) -> list[dict[str, Any]]:
        """The trials the scheduler (ASHA) stopped before their stop criterion."""
        return [r for r in self.trials if r["ended"].startswith(STOPPED_EARLY)]


STOPPED_EARLY = "stopped early"


def trial_ending(spec: TuneSpec, metrics: dict[str, Any], error: bool = False) -> str:
    """How a trial ended, from its last result: ``"ERROR"``; ``"finished (iterations 25)"`` (the stop
    criterion it met, or ASHA's ``max_t``); ``"stopped early by asha at iteration 4"``; or
    ``"stopped before its stop"`` (e.g. interrupted). Tune calls each of these TERMINATED."""
    if error:
        return "ERROR"
    tune_keys = {"reward": "episode_return_mean", "env_steps": "env_steps_sampled", "time_s": "time_total_s"}
    for name, target in spec.stop.model_dump().items():
        value = metrics.get(tune_keys.get(name, "training_iteration"))
        if target is not None and _finite(value) and value >= target:
            return f"finished ({name} {target:g})"
    s = spec.scheduler
    if isinstance(s, AshaSpec):
        value = metrics.get(s.time_attr)
        if _finite(value) and value >= s.max_t:
            return f"finished (asha max_t {s.max_t})"
        unit = "iteration" if s.time_attr == "training_iteration" else s.time_attr
        return f"{STOPPED_EARLY} by asha at {unit} {_short(value)}"
    return "stopped before its stop"


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)


class TuneProgress:
    """shoal's own progress lines while the trials run, instead of Tune's ``== Status ==`` blocks:
    one line per trial result (at most one every ``every_s`` seconds per trial) and one as each
    trial ends, saying how (:func:`trial_ending`)."""

    def __init__(self, spec: TuneSpec, metric: str, write: Any = None, every_s: float = 5.0) -> None:
        import sys

        self.spec, self.metric, self.every_s = spec, metric, every_s
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._last: dict[str, float] = {}
        self.ended = 0
        self.total = spec.num_samples * math.prod(len(v.grid) for v in spec.search.values() if v.grid is not None)

    def _head(self, trial_id: str, config: dict[str, Any]) -> str:
        params = ", ".join(f"{k}={_short(_get(config, k))}" for k in self.spec.search)
        return f"trial {trial_id}" + (f" ({params})" if params else "")

    def _figures(self, r: dict[str, Any]) -> str:
        steps = r.get("env_steps_sampled")
        return f"{self.metric} {_short(r.get(self.metric))}" + (
            f"  env steps {steps:,}" if isinstance(steps, int) else ""
        )

    def result(self, trial_id: str, config: dict[str, Any], r: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last.get(trial_id, -math.inf) < self.every_s:
            return
        self._last[trial_id] = now
        self.write(f"{self._head(trial_id, config)}  iter {r.get('training_iteration', '-')}  {self._figures(r)}")

    def complete(self, trial_id: str, config: dict[str, Any], r: dict[str, Any] | None, error: bool = False) -> None:
        self.ended += 1
        how = trial_ending(self.spec, r or {}, error)
        figures = f": {self._figures(r)}" if r else ""
        self.write(f"{self._head(trial_id, config)} {how}{figures}  [{self.ended} of {self.total} trials ended]")


def _summarize(results, spec: TuneSpec, run_dir: Path, metric: str, mode: str) -> TuneSummary:
    rows = []
    for r in results:
        m = r.metrics or {}
        params = {k: _get(r.config or {}, k) for k in spec.search}
        status = "ERROR" if r.error else "TERMINATED"
        rows.append(
            {
                "trial": m.get("trial_id", "?"),
                "params": params,
                "iterations": m.get("training_iteration", 0),
                "metric": m.get(metric),
                "status": status,  # Tune's word: TERMINATED whether the trial finished or ASHA stopped it
                "ended": trial_ending(spec, m, error=bool(r.error)),
            }
        )
    best_cfg = best_value = path = best_trial = best_ckpt = None
    finite = [r for r in results if r.metrics and _finite(r.metrics.get(metric))]
    if finite:
        best = max(finite, key=lambda r: r.metrics[metric] * (1 if mode == "max" else -1))
        best_value = float(best.metrics[metric])
        best_trial = best.metrics.get("trial_id")
        best_ckpt = _last_checkpoint(Path(best.path)) if getattr(best, "path", None) else None
        cfg = spec.config_cls().from_dict({k: v for k, v in best.config.items() if k != "algo"})
        best_cfg = {"algo": spec.algo, **cfg.to_dict()}
        path = run_dir / "best_config.yaml"
        trial_dir = f", {BEST_TRIAL_NOTE} {Path(best.path).name}" if getattr(best, "path", None) else ""
        path.write_text(
            f"# best trial of {run_dir.name}: {metric} = {best_value:g}{trial_dir}\n"
            + yaml.safe_dump(best_cfg, sort_keys=False)
        )
    return TuneSummary(run_dir, metric, mode, rows, best_cfg, best_value, path, best_trial, best_ckpt)


BEST_TRIAL_NOTE = "trial directory"  # best_config.yaml's first line names the best trial's directory after it


def _last_checkpoint(trial_dir: Path) -> Path | None:
    from shoal.checkpoint import resolve_checkpoint
    from shoal.errors import CheckpointError

    try:
        return resolve_checkpoint(trial_dir)
    except CheckpointError:
        return None


def is_tune_dir(path: Path) -> bool:
    """Whether ``path`` is a ``shoal tune`` run directory (Tune's experiment state, or best_config.yaml
    beside trial directories), not one trial's."""
    p = Path(path)
    return p.is_dir() and (
        any(p.glob("experiment_state-*.json")) or ((p / "best_config.yaml").is_file() and any(_trial_dirs(p)))
    )


def _trial_dirs(tune_dir: Path) -> list[Path]:
    return sorted(d for d in tune_dir.iterdir() if d.is_dir() and (d / "result.json").is_file())


def best_trial_dir(tune_dir: Path) -> tuple[Path, str]:
    """The best trial's directory of a ``shoal tune`` run and the words saying which it is and why:
    the trial best_config.yaml names (its header line), or, in a run written before it named one, the
    trial whose last result holds the value recorded there. A CheckpointError when there is none."""
    from shoal.errors import CheckpointError

    trials = _trial_dirs(tune_dir)
    best_file = tune_dir / "best_config.yaml"
    header = best_file.read_text(encoding="utf-8").splitlines()[0] if best_file.is_file() else ""
    found = re.match(r"# best trial of .*?: (\S+) = (\S+?)(?:, " + BEST_TRIAL_NOTE + r" (.+))?$", header)
    if found is None:
        names = ", ".join(d.name for d in trials) or "none"
        raise CheckpointError(
            f"'{tune_dir}' is a `shoal tune` run directory without a best trial (no best_config.yaml: no trial "
            f"reported a finite metric, or the search did not finish). Give one trial's directory; its trials: {names}."
        )
    metric, value, name = found.group(1), found.group(2), found.group(3)
    trial: Path | None
    if name is not None and (tune_dir / name).is_dir():
        trial = tune_dir / name
    else:
        trial = next((d for d in trials if _short(_last_result(d).get(metric)) == _short(float(value))), None)
        if trial is None:
            raise CheckpointError(
                f"'{tune_dir}': no trial's last result has the best {metric} {value} that best_config.yaml records; "
                "give one trial's directory."
            )
    return trial, f"the best trial by {metric} ({value}): {trial.name}"


def _last_result(trial_dir: Path) -> dict[str, Any]:
    """The last whole row of a trial's result.json (Tune writes one JSON object a line, as results.jsonl)."""
    from shoal.logging.results import parse_row

    for line in reversed((trial_dir / "result.json").read_text(encoding="utf-8").splitlines()):
        row = parse_row(line)
        if row is not None:
            return row
    return {}


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and math.isfinite(v)
