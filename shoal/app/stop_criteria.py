"""Stop criteria of a training run (:class:`Stop`), and the reading of a dict or None as them."""

from __future__ import annotations

import math
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from shoal.errors import ConfigError


class Stop(BaseModel):
    """Stop when any criterion is met. Steps, time and iterations count over a resumed run too."""

    model_config = ConfigDict(extra="forbid")
    reward: Optional[float] = Field(
        None,
        allow_inf_nan=False,
        description="episode_return_mean (over the last episode_window episodes, 100 by default) reaches this "
        "(a finite number).",
    )
    env_steps: Optional[int] = Field(None, ge=1, description="env_steps_sampled reaches this.")
    time_s: Optional[float] = Field(None, gt=0, description="time_total_s (training time) reaches this.")
    iterations: Optional[int] = Field(None, ge=1)

    def reached(self, r: dict[str, Any]) -> str | None:
        """The first criterion result ``r`` meets (reward, env_steps, time, iterations), or None."""
        met = self._first_met(r)
        return met[0] if met else None

    def explain(self, r: dict[str, Any]) -> str | None:
        """The first criterion ``r`` meets, with its figures, e.g. ``"iterations 4 >= 4"``; or None."""
        met = self._first_met(r)
        return met[1] if met else None

    def _first_met(self, r: dict[str, Any]) -> tuple[str, str] | None:
        checks = (  # reason, words, result value, target, format of the value
            ("reward", "mean return", r.get("episode_return_mean"), self.reward, ".1f"),
            ("env_steps", "env steps", r.get("env_steps_sampled"), self.env_steps, ","),
            ("time", "training time", r.get("time_total_s"), self.time_s, ".1f"),
            ("iterations", "iterations", r.get("iteration"), self.iterations, ""),
        )
        for reason, words, value, target, spec in checks:
            if target is not None and value is not None and math.isfinite(value) and value >= target:
                unit = " s" if reason == "time" else ""
                return reason, f"{words} {value:{spec}}{unit} >= {_number(target)}{unit}"
        return None

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


def _number(x: float) -> str:
    """475.0 -> '475', 1000000 -> '1,000,000', 0.5 -> '0.5'."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _as_stop(stop: Stop | dict | None) -> Stop:
    if stop is None:
        return Stop()
    if isinstance(stop, Stop):
        return stop
    try:
        return Stop(**stop)
    except Exception as e:  # noqa: BLE001 - pydantic error -> one paragraph
        from pydantic import ValidationError

        from shoal.config import format_validation_error

        detail = format_validation_error(Stop, e) if isinstance(e, ValidationError) else f"{e}."
        raise ConfigError(
            f"Invalid stop criteria {stop!r}: {detail} Allowed keys: reward, env_steps, time_s, iterations."
        ) from None
