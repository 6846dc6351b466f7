"""``shoal tune -c FILE.yaml``: a search over an algorithm's config with Ray Tune.

The file holds ``algo``, ``config`` (the algorithm's keys, as for ``shoal train -c``), a
``search`` section (dotted config key -> one of grid / choice / uniform / loguniform / randint),
``num_samples``, an optional ``scheduler`` (ASHA or PBT), ``metric``, ``mode``, ``stop`` and
``max_concurrent_trials``. :class:`TuneSpec` validates it; :func:`run_tune` runs it and
returns a :class:`TuneSummary` with every trial and the best config.

The file's models are in :mod:`shoal.app.tune_spec`, the trials' progress and summary in
:mod:`shoal.app.tune_trials`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from shoal.app.tune_spec import AshaSpec, PbtSpec, TuneSpec, _nest
from shoal.app.tune_trials import TuneProgress, TuneSummary, _summarize
from shoal.config import deep_merge
from shoal.errors import ResourceError


# ---- running --------------------------------------------------------------------------------
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
