"""A ``shoal tune`` file: its pydantic models (:class:`TuneSpec`, the search spaces, the
schedulers, the stop criteria), their checks before Ray starts, and :func:`load_spec`, which reads
one with its ``--set`` overrides."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.config import all_keys, deep_merge, format_validation_error, load_yaml, parse_set_overrides
from shoal.errors import ConfigError

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
