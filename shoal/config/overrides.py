"""Overrides: YAML config files, ``key=value`` strings (``--set``) and merging them into
nested config data."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

from shoal.errors import ConfigError
from shoal.files import YamlRefused, safe_yaml


# ---- overrides -------------------------------------------------------------------------
def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("env_config",):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_set_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["lr=1e-3", "resources.num_workers=2"]`` -> nested dict. Values parse as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects key=value (e.g. lr=0.001 or resources.num_workers=2), got '{item}'.")
        try:
            value = safe_yaml(raw) if raw.strip() else None
        except YamlRefused as e:
            raise ConfigError(f"--set {key}: the value is refused: {yaml_problem(e)}.") from None
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{p}' was already given a value, so it cannot also be a section.")
        node[parts[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; any other content is a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(
            f"Config file '{path}' {what}; give a YAML file of config keys (`shoal config ALGO --yaml` prints one)."
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"Config file '{path}' is not a text file: byte {e.start} is not UTF-8. A config file is "
            "UTF-8 YAML text of keys and values (`shoal config ALGO --yaml` prints one)."
        ) from None
    try:
        data = safe_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file '{path}' is not valid YAML: {yaml_problem(e)}.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys to values, got {type(data).__name__}.")
    return data


def yaml_problem(e: yaml.YAMLError) -> str:
    """One line for a YAML parse error: what is wrong and where (line and column, 1-based)."""
    problem = getattr(e, "problem", None) or " ".join(str(e).split())
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    hint = " (YAML indents with spaces, never tabs)" if "\\t" in problem else ""
    return f"{problem}{where}{hint}"
