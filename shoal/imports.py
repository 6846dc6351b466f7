"""Import paths: ``'package.module:attr'`` strings in configs resolved to objects.

A leaf of the package (it imports only :mod:`shoal.trust`), so configs, envs, models, callbacks
and the league resolve their paths here without importing each other.
"""

from __future__ import annotations

import importlib
from typing import Any

from shoal.trust import check_import


def import_path(path: str) -> Any:
    """Resolve 'package.module:attr' (or 'package.module.attr'). Inside :func:`shoal.trust.import_gate`
    (rebuilding a checkpoint) a path nobody vouched for is refused before anything is imported."""
    check_import(path)
    if ":" in path:
        mod, _, attr = path.partition(":")
    else:
        mod, _, attr = path.rpartition(".")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
