"""What every logger writes: a result's scalars and a config's flattened keys (no logger imports).

:mod:`shoal.logging.writers` (files, TensorBoard) and :mod:`shoal.logging.trackers` (MLflow,
W&B) both use these, so neither imports the other for them.
"""

from __future__ import annotations

import math
from typing import Any


def scalar_items(result: dict[str, Any]):
    for k, v in result.items():
        if isinstance(v, bool):
            yield k, float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            yield k, float(v)


def flatten_config(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> ``{"resources.num_workers": 0, ...}``: numbers, strings and bools kept,
    anything else (lists, None) as its text."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out
