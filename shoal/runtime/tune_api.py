"""Ray Tune, reached through the runtime package (the one place shoal imports Ray).

``shoal.app.tune`` and ``shoal.app.tune_run`` sit above the algorithms and ask for Tune's modules here,
so a missing ``ray[tune]`` is one clear error naming the extra.
"""

from __future__ import annotations

from types import ModuleType

from shoal.errors import ConfigError


def tune_module() -> ModuleType:
    """``ray.tune``, or a ConfigError saying how to install it."""
    try:
        from ray import tune
    except ImportError:  # pragma: no cover - depends on the installation
        raise ConfigError("Ray Tune is not installed: pip install -e '.[tune]' in the shoal checkout.") from None
    return tune


def tune_schedulers() -> ModuleType:
    """``ray.tune.schedulers`` (ASHA, PBT)."""
    tune_module()
    from ray.tune import schedulers

    return schedulers
