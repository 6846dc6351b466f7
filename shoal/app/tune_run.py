"""``shoal tune -c FILE.yaml``: a search over an algorithm's config with Ray Tune.

The file holds ``algo``, ``config`` (the algorithm's keys, as for ``shoal train -c``), a
``search`` section (dotted config key -> one of grid / choice / uniform / loguniform / randint),
``num_samples``, an optional ``scheduler`` (ASHA or PBT), ``metric``, ``mode``, ``stop`` and
``max_concurrent_trials``. :class:`TuneSpec` validates it; :func:`run_tune` runs it and
returns a :class:`TuneSummary` with every trial and the best config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import time
from pathlib import Path
from typing import Any, Literal, Optional, TypeGuard, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.config import all_keys, deep_merge, format_validation_error, load_yaml, parse_set_overrides
from shoal.errors import ConfigError, ResourceError

SEARCH_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
# what Tune's Trainable adds to every result (numbers only; time_total_s and time_this_iter_s are shoal's too)
TUNE_RESULT_KEYS = ("training_iteration", "time_since_restore", "iterations_since_restore", "timestamp")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchSpec(_Strict):
    """One key's search space: exactly one of the fields."""

    grid: Optional[list[Any]] = Field(
        None, min_length=1, description="Every value, each in its own trials (x num_samples)."
    )
    choice: Optional[list[Any]] = Field(
        None, min_length=1, description="A value drawn uniformly from the list per trial."
    )
    uniform: Optional[tuple[float, float]] = Field(None, description="[lo, hi]: a float drawn uniformly.")
    loguniform: Optional[tuple[float, float]] = Field(
        None, description="[lo, hi] (> 0): a float drawn uniformly in log space."
    )
    randint: Optional[tuple[int, int]] = Field(None, description="[lo, hi): an integer drawn uniformly.")

    @model_validator(mode="after")
    def _one_kind(self) -> "SearchSpec":
        given = [k for k in SEARCH_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a search space is exactly one of {', '.join(SEARCH_KINDS)}, e.g. {{loguniform: [1e-4, 1e-2]}}; "
                f"got {given or 'none'}"
            )
        kind = given[0]
        lo_hi = getattr(self, kind) if kind in ("uniform", "loguniform", "randint") else None
        if lo_hi is not None and not lo_hi[0] < lo_hi[1]:
            raise ValueError(f"{kind} needs [lo, hi] with lo < hi, got {list(lo_hi)}")
        if kind == "loguniform" and lo_hi is not None and lo_hi[0] <= 0:
            raise ValueError(f"loguniform needs lo > 0, got {lo_hi[0]}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SEARCH_KINDS if getattr(self, k) is not None)

    def domain(self):
        from shoal.runtime.tune_api import tune_module

        tune = tune_module()

        kind, value = self.kind, getattr(self, self.kind)
        if kind == "grid":
            return tune.grid_search(list(value))
        return {"choice": tune.choice, "uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}[
            kind
        ](*((list(value),) if kind == "choice" else value))


class AshaSpec(_Strict):
    type: Literal["asha"] = Field(description="Asynchronous successive halving: stops poor trials early.")
    max_t: int = Field(100, ge=1, description="The most time_attr units a trial may run.")
    grace_period: int = Field(1, ge=1, description="time_attr units every trial runs before it may be stopped.")
    reduction_factor: float = Field(2.0, gt=1, description="1/reduction_factor of the trials go on at each rung.")
    time_attr: str = Field("training_iteration", description="The result key that measures a trial's progress.")


class PbtSpec(_Strict):
    type: Literal["pbt"] = Field(description="Population Based Training: copy better trials' checkpoints, perturb.")
    perturbation_interval: int = Field(4, ge=1, description="time_attr units between exploit/explore steps.")
    quantile_fraction: float = Field(0.25, ge=0, le=0.5, description="The bottom fraction copies the top fraction.")
    resample_probability: float = Field(
        0.25, ge=0, le=1, description="Chance that explore redraws a value from its space instead of scaling it."
    )
    hyperparam_mutations: Optional[dict[str, SearchSpec]] = Field(
        None, description="Dotted key -> space that explore draws from; None: the search section's spaces."
    )
    time_attr: str = Field("training_iteration", description="The result key that measures a trial's progress.")
    synch: bool = Field(
        False,
        description="Perturb once every trial has reached the interval, all at once (steady "
        "with few trials or uneven speeds); false: each trial on its own clock.",
    )


class TuneStop(_Strict):
    reward: Optional[float] = Field(None, description="Stop a trial when episode_return_mean reaches this.")
    env_steps: Optional[int] = Field(None, ge=1, description="Stop a trial at this many env steps sampled.")
    time_s: Optional[float] = Field(None, gt=0, description="Stop a trial after this many seconds of training.")
    iterations: Optional[int] = Field(None, ge=1, description="Stop a trial after this many iterations.")

    def to_tune(self) -> dict[str, float]:
        keys = {
            "reward": "episode_return_mean",
            "env_steps": "env_steps_sampled",
            "time_s": "time_total_s",
            "iterations": "training_iteration",
        }
        return {keys[k]: v for k, v in self.model_dump().items() if v is not None}


class TuneSpec(_Strict):
    """A ``shoal tune`` file."""

    algo: str = Field(description="The algorithm, e.g. ppo (see `shoal algos`).")
    config: dict[str, Any] = Field(
        default_factory=dict, description="The algorithm's config keys, as for `shoal train -c`."
    )
    search: dict[str, SearchSpec] = Field(default_factory=dict, description="Dotted config key -> its search space.")
    num_samples: int = Field(1, ge=1, description="Trials per grid point (random spaces are drawn anew for each).")
    scheduler: Optional[Union[AshaSpec, PbtSpec]] = Field(
        None, discriminator="type", description="asha, pbt, or none (run every trial to its stop)."
    )
    metric: Optional[str] = Field(
        None, description="The result key to optimize; default the algorithm's headline (episode_return_mean)."
    )
    mode: Optional[Literal["max", "min"]] = Field(None, description="max or min; default the algorithm's.")
    stop: TuneStop = Field(
        default_factory=TuneStop, description="When each trial stops: reward, env_steps, time_s, iterations."
    )
    max_concurrent_trials: Optional[int] = Field(
        None, ge=1, description="Trials running at once; None: as many as fit."
    )
    name: Optional[str] = Field(None, description="The run's directory name under --out; default tune_<algo>_<time>.")

    @classmethod
    def parse(cls, data: dict[str, Any]) -> "TuneSpec":
        _check_scheduler(data.get("scheduler"))
        spec = _validated(cls, data)
        spec.check()
        return spec

    def check(self) -> None:
        """Search keys name config keys; PBT perturbs only keys that can change mid-run; a stop exists."""
        from shoal.algorithms import get_config_class

        cfg_cls = get_config_class(self.algo)
        keys = all_keys(cfg_cls)
        for key in self.search:
            if key not in keys:
                close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
                raise ConfigError(
                    f"search key '{key}' is not a {self.algo} config key."
                    + (f" Did you mean '{close[0]}'?" if close else " See `shoal config " + self.algo + "`.")
                )
        if not any(self.stop.model_dump().values()) and not isinstance(self.scheduler, AshaSpec):
            raise ConfigError(
                "tune needs a stop criterion for its trials: set stop.iterations, stop.env_steps, "
                "stop.time_s or stop.reward (or an asha scheduler's max_t)."
            )
        if isinstance(self.scheduler, PbtSpec):
            self._check_pbt(cfg_cls)
        self._check_result_key("metric", self.metric)
        if self.scheduler is not None:
            self._check_result_key("scheduler.time_attr", self.scheduler.time_attr)
        self._check_every_value()

    def _check_result_key(self, what: str, key: Optional[str]) -> None:
        """A ConfigError, before Ray starts, for a result key no trial's result holds (Tune's own error
        comes from inside a running trial): the keys every result of the algorithm can have, Tune's,
        and any ``family/name`` key (``learner/...``, ``evaluation/...``, ``custom/...``). With
        callbacks in the config any key passes: ``on_train_result`` may add it."""
        algorithm_cls = self.config_cls().algorithm_cls
        if key is None or "/" in key or self.config.get("callbacks") or algorithm_cls is None:
            return
        known = sorted({*algorithm_cls.result_keys, *TUNE_RESULT_KEYS})
        if key in known:
            return
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        raise ConfigError(
            f"{what} '{key}' is not a key of {self.algo}'s results"
            + (f"; did you mean '{close[0]}'?" if close else ".")
            + f" A result has {', '.join(known)}, and keys with a '/' (learner/..., evaluation/..., custom/...; "
            f"results.jsonl of a `shoal train {self.algo}` run shows them all)."
        )

    def _check_every_value(self) -> None:
        """Every value a trial may get is a valid config, before Ray starts: each grid and choice value
        and both ends of each range, one key at a time, the other keys at their first value."""
        base = deep_merge(self.config, _sample_point(self.search))
        cfg_cls = self.config_cls()
        cfg_cls.from_dict(base)  # the first point
        for key, space in self.search.items():
            values = list(getattr(space, space.kind))
            if space.kind == "randint":
                values = [values[0], values[1] - 1]  # hi is exclusive
            for n, value in enumerate(values[1:], start=2):
                try:
                    cfg_cls.from_dict(deep_merge(base, _nest({key: value})))
                except ConfigError as e:
                    raise ConfigError(
                        f"search key '{key}': its {space.kind} value {value!r} (number {n}) is not valid: {e}"
                    ) from None

    def _check_pbt(self, cfg_cls) -> None:
        mutations = self.pbt_mutations()
        if not mutations:
            raise ConfigError("pbt needs keys to perturb: a search section or scheduler.hyperparam_mutations.")
        allowed = cfg_cls.mutable_keys
        for key, space in mutations.items():
            if key not in allowed:
                raise ConfigError(
                    f"pbt cannot perturb '{key}': {self.algo} cannot change it mid-run. Keys that can "
                    f"change mid-run: {', '.join(sorted(allowed)) or 'none'}."
                )
            if space.kind == "grid":
                raise ConfigError(
                    f"pbt explores by perturbing and redrawing values, which a grid cannot do ('{key}': "
                    "grid); use choice, uniform, loguniform or randint."
                )

    def pbt_mutations(self) -> dict[str, SearchSpec]:
        if not isinstance(self.scheduler, PbtSpec):
            return {}
        return self.scheduler.hyperparam_mutations or dict(self.search)

    def config_cls(self):
        from shoal.algorithms import get_config_class

        return get_config_class(self.algo)


def _validated(model: type[BaseModel], data: dict[str, Any], name: str = "") -> Any:
    try:
        return model(**data)
    except ValidationError as e:
        msg = format_validation_error(model, e).replace("Config key", "Key").replace("config key", "key")
        raise ConfigError(msg.replace(f"Invalid {model.__name__}", f"Invalid {name or 'tune file'}")) from None


def _check_scheduler(data: Any) -> None:
    """The scheduler section on its own, so a wrong key is named within it."""
    if data is None or not isinstance(data, dict):
        return
    kinds: dict[str, type[BaseModel]] = {"asha": AshaSpec, "pbt": PbtSpec}
    if data.get("type") not in kinds:
        raise ConfigError(
            f"scheduler.type must be 'asha' or 'pbt' (got {data.get('type')!r}); leave out the "
            "scheduler section to run every trial to its stop criterion."
        )
    _validated(kinds[data["type"]], data, f"scheduler ({data['type']})")


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def _sample_point(search: dict[str, SearchSpec]) -> dict[str, Any]:
    """One value from each space (its first or lower value): validates the search against the config."""

    def first(s: SearchSpec):
        v = getattr(s, s.kind)
        return v[0]

    return _nest({k: first(s) for k, s in search.items()})


def load_spec(path: Path, sets: list[str] | None = None) -> TuneSpec:
    """A tune file with ``--set`` overrides (``config.lr=...``, ``num_samples=4``, ``stop.iterations=5``)."""
    data = load_yaml(path)
    return TuneSpec.parse(deep_merge(data, parse_set_overrides(sets or [])))


# ---- running --------------------------------------------------------------------------------
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


def _progress_callback(progress: TuneProgress):
    """A Tune Callback that feeds ``progress`` (made here, as Tune is imported only when a search runs)."""
    from shoal.runtime.tune_api import tune_module

    callback_base: Any = tune_module().Callback  # a class known when Tune is imported

    class _Callback(callback_base):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            progress.result(trial.trial_id, trial.config, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            progress.complete(trial.trial_id, trial.config, trial.last_result)

        def on_trial_error(self, iteration, trials, trial, **info):
            progress.complete(trial.trial_id, trial.config, trial.last_result, error=True)

    return _Callback()


def _param_space(spec: TuneSpec) -> dict[str, Any]:
    space = {k: s.domain() for k, s in spec.search.items()}
    return {"algo": spec.algo, **deep_merge(spec.config, _nest(space))}


def _scheduler(spec: TuneSpec):
    from shoal.runtime.tune_api import tune_schedulers

    schedulers = tune_schedulers()
    ASHAScheduler, PopulationBasedTraining = schedulers.ASHAScheduler, schedulers.PopulationBasedTraining
    s = spec.scheduler
    if isinstance(s, AshaSpec):
        return ASHAScheduler(
            time_attr=s.time_attr, max_t=s.max_t, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if isinstance(s, PbtSpec):
        mutations = _nest(
            {k: (list(v.choice) if v.choice is not None else v.domain()) for k, v in spec.pbt_mutations().items()}
        )
        return PopulationBasedTraining(
            time_attr=s.time_attr,
            perturbation_interval=s.perturbation_interval,
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            hyperparam_mutations=mutations,
            synch=s.synch,
        )
    return None


def _metric(spec: TuneSpec) -> tuple[str, str]:
    algorithm_cls = spec.config_cls().algorithm_cls
    return spec.metric or algorithm_cls.best_metric, spec.mode or algorithm_cls.best_metric_mode


def run_tune(spec: TuneSpec, out: Path = Path("runs"), address: str | None = None, verbose: int = 1) -> TuneSummary:
    """Run the search with ``tune.Tuner``; Tune's results go under ``out/<name>/``. ``verbose`` 1:
    shoal's progress lines on stderr (:class:`TuneProgress`); 0: nothing. Tune's own reporter is off."""
    import os
    import sys

    # Tune's own output (its "== Status ==" blocks, a driver-artifacts path in each) stays off: the old
    # output engine at verbosity 0 prints nothing; shoal's TuneProgress prints a line per result instead
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    from shoal import runtime
    from shoal.app.tune import trainable
    from shoal.runtime.tune_api import tune_module

    tune = tune_module()

    reused = runtime.is_started() and address is None  # a local instance an earlier run in this process started
    runtime.start(address)
    if reused:
        _check_placement_works()
    metric, mode = _metric(spec)
    name = spec.name or f"tune_{spec.algo}_{time.strftime('%Y%m%d_%H%M%S')}"
    storage = Path(out).resolve()
    pbt = isinstance(spec.scheduler, PbtSpec)
    checkpoints = tune.CheckpointConfig(
        num_to_keep=4 if pbt else 2,
        checkpoint_at_end=True,
        checkpoint_frequency=spec.scheduler.perturbation_interval if isinstance(spec.scheduler, PbtSpec) else 0,
    )
    callbacks = [_progress_callback(TuneProgress(spec, metric))] if verbose else []
    if verbose:
        trials = f"{spec.num_samples} sample{'s' * (spec.num_samples > 1)}" + (
            " per grid point" if any(s.kind == "grid" for s in spec.search.values()) else ""
        )
        scheduler = f", {spec.scheduler.type}" if spec.scheduler is not None else ""
        print(f"Tune: {spec.algo}, {trials}{scheduler}; results in {storage / name}", file=sys.stderr, flush=True)
    tuner = tune.Tuner(
        trainable(),
        param_space=_param_space(spec),
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=spec.num_samples,
            scheduler=_scheduler(spec),
            max_concurrent_trials=spec.max_concurrent_trials,
            reuse_actors=pbt,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            stop=spec.stop.to_tune() or None,
            checkpoint_config=checkpoints,
            verbose=0,
            callbacks=callbacks,
        ),
    )
    results = tuner.fit()
    return _summarize(results, spec, storage / name, metric, mode)


def _check_placement_works(timeout_s: float = 30.0) -> None:
    """A second experiment in one process reuses its local Ray instance, which a known Ray bug can
    leave unable to place any placement group (ray-project/ray#64693): say so, instead of Tune
    waiting forever for its first trial."""
    from shoal.runtime.cluster import placement_groups_schedule

    if not placement_groups_schedule(timeout_s):
        raise ResourceError(
            f"Ray placed no placement group within {timeout_s:g} s. This process's Ray instance ran an earlier "
            "experiment, and Ray can be left unable to place any group after one (ray-project/ray#64693); or its "
            "CPUs are all taken. Restart it between experiments (shoal.runtime.shutdown()), or run each "
            "experiment in its own process (shoal tune does)."
        )


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
