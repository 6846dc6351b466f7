"""Ray Tune: every shoal algorithm as a Tune Trainable, and ``shoal tune -c FILE.yaml``.

:class:`ShoalTrainable` takes the algorithm's name under ``"algo"`` and its config keys
beside it (nested sections as dicts, as in a YAML file). It asks Tune for the run's bundles
(the driver's first, then one per actor, from ``Algorithm.resource_plan``), so trials sit side
by side without oversubscribing the cluster; saves shoal's atomic checkpoints; and, for
Population Based Training, changes the keys a run can change mid-run without restarting.

Needs ``pip install -e '.[tune]'`` in the shoal checkout.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from shoal.checkpoint import TUNE_CHECKPOINT_NAME
from shoal.errors import ConfigError


def _tune():
    from shoal.runtime.tune_api import tune_module

    return tune_module()


def algo_config(config: dict[str, Any]):
    """The validated algorithm config a trial's ``{"algo": name, **keys}`` describes."""
    from shoal.algorithms import get_config_class

    data = dict(config)
    if "algo" not in data:
        raise ConfigError("A shoal Tune trial's config needs 'algo' (e.g. 'ppo') beside the algorithm's keys.")
    return get_config_class(data["algo"]).from_dict(data)


def trial_bundles(config: dict[str, Any]) -> list[dict[str, float]]:
    """What one trial asks Tune for: the driver's bundle (Tune's head), then one per actor."""
    from shoal.runtime.placement import tune_bundles

    return tune_bundles(_plan(config))


def _plan(config: dict[str, Any]):
    cfg = algo_config(config)
    return type(cfg).algorithm_cls.resource_plan(cfg)


def changed_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys whose values differ between two nested config dicts, with the new values."""
    out: dict[str, Any] = {}
    for key in set(old) | set(new):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key != "env_config":
            out.update(changed_keys(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = b
    return out


def _make_trainable():
    tune = _tune()

    class ShoalTrainable(tune.Trainable):
        """One shoal run as a Tune trial: ``config = {"algo": "ppo", "lr": 1e-3, "resources": {...}, ...}``."""

        @classmethod
        def default_resource_request(cls, config: dict[str, Any]):
            from shoal.runtime.placement import plan_strategy

            return tune.PlacementGroupFactory(trial_bundles(config), strategy=plan_strategy(_plan(config)))

        def setup(self, config: dict[str, Any]) -> None:
            import logging

            for name in ("ray.tune", "ray.train"):  # no line per checkpoint saved or restored
                logging.getLogger(name).setLevel(logging.WARNING)
            _quiet_sigterm()
            self.algo = algo_config(config).build()
            self._fresh_state = copy.deepcopy(self.algo.get_state())  # what reset_config returns to

        def step(self) -> dict[str, Any]:
            return self.algo.train()

        def save_checkpoint(self, checkpoint_dir: str) -> str:
            self.algo.save(Path(checkpoint_dir) / TUNE_CHECKPOINT_NAME)  # atomic: state.pt + meta.json, renamed in
            return checkpoint_dir

        def load_checkpoint(self, checkpoint_dir: str) -> None:
            self.algo.restore(Path(checkpoint_dir) / TUNE_CHECKPOINT_NAME)
            # PBT restores another trial's checkpoint (its optimizer holds that trial's lr), then this
            # trial's (perturbed) values apply.
            self.algo.update_config(self._mutable_values(self.algo.config.to_dict()))

        def reset_config(self, new_config: dict[str, Any]) -> bool:
            """Make this trainable a fresh trial of ``new_config`` without rebuilding the algorithm (its
            actors, envs and network stay) when only keys that can change mid-run differ; else False,
            and Tune starts a new trainable. Tune restores a checkpoint next where PBT copies one."""
            new = algo_config(new_config)
            old = {"algo": self.algo.config.algo, **self.algo.config.to_dict()}
            if set(changed_keys(old, {"algo": new.algo, **new.to_dict()})) - type(self.algo.config).mutable_keys:
                return False
            self.algo.set_state(copy.deepcopy(self._fresh_state))  # a reused trainable starts from scratch
            self.algo.update_config(self._mutable_values(new.to_dict()))
            self.config = new_config
            return True

        def _mutable_values(self, data: dict[str, Any]) -> dict[str, Any]:
            keys = type(self.algo.config).mutable_keys
            if self.algo.config.lr_schedule:
                keys = keys - {"lr"}
            return {k: data[k] for k in keys if k in data}

        def cleanup(self) -> None:
            self.algo.stop()

    return ShoalTrainable


_TRAINABLE = None


def trainable():
    """The :class:`ShoalTrainable` class (made on first use, so importing shoal.app.tune needs no Ray)."""
    global _TRAINABLE
    if _TRAINABLE is None:
        _TRAINABLE = _make_trainable()
    return _TRAINABLE


def __getattr__(name: str):
    if name == "ShoalTrainable":
        return trainable()
    raise AttributeError(name)


def _quiet_sigterm() -> None:
    """End this trainable's process quietly on SIGTERM. Ray sends it to the trainables Tune kept for
    reuse when `shoal tune` shuts Ray down; Ray's own handler raises SystemExit, which, landing in
    a weakref callback, printed an "Exception ignored ... Traceback" after the results. Checkpoints
    are complete on disk by then (written atomically), so nothing is lost."""
    import os
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
