"""Keys of config classes: the keys a class declares unused (refused, and left out of what it
writes), every key that may be set, and one readable paragraph for a pydantic ValidationError."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


# ---- unused keys -----------------------------------------------------------------------
def _section_type(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    field = model.model_fields.get(key)
    ann = getattr(field, "annotation", None) if field else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def used_keys(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` less its ``unused_keys``."""
    unused = getattr(model, "unused_keys", {})
    return [k for k in model.model_fields if k not in unused]


def _unused_message(model: type[BaseModel], key: str, prefix: str = "", owner: str = "") -> str:
    owner = owner or getattr(model, "algo", "") or model.__name__
    why = getattr(model, "unused_keys", {})[key]
    return f"Config key '{prefix}{key}' is not used by {owner}, so it may not be set: {why}."


def unused_keys_given(model: type[BaseModel], data: dict[str, Any], prefix: str = "", owner: str = "") -> list[str]:
    """One message per unused key in ``data`` (nested section dicts included)."""
    owner = owner or getattr(model, "algo", "")
    out = []
    for key, value in data.items():
        if key in getattr(model, "unused_keys", {}):
            out.append(_unused_message(model, key, prefix, owner))
        elif isinstance(value, dict) and (sub := _section_type(model, key)) is not None:
            out.extend(unused_keys_given(sub, value, f"{prefix}{key}.", owner))
    return out


def _unused_tree(model: type[BaseModel]) -> dict[str, Any]:
    """``model_dump(exclude=...)`` form of the unused keys: ``{key: True, section: {...}}``."""
    out: dict[str, Any] = {k: True for k in getattr(model, "unused_keys", {}) if k in model.model_fields}
    for key in used_keys(model):
        sub = _section_type(model, key)
        if sub is not None and (inner := _unused_tree(sub)):
            out[key] = inner
    return out


def _drop_unused(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if key in getattr(model, "unused_keys", {}):
            continue
        sub = _section_type(model, key)
        out[key] = _drop_unused(sub, value) if sub is not None and isinstance(value, dict) else value
    return out


# ---- error formatting -------------------------------------------------------------------
def _fields_of(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, str]:
    """Walk ``loc`` (minus its last part) through nested sections; return the model and a dotted prefix."""
    prefix: list[str] = []
    for part in loc[:-1]:
        sub = _section_type(model, str(part))
        if sub is None:
            return None, ".".join(prefix)
        model = sub
        prefix.append(str(part))
    return model, ".".join(prefix)


def all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key that may be set, dotted into sections (unused keys left out)."""
    keys = []
    for name in used_keys(model):
        keys.append(prefix + name)
        sub = _section_type(model, name)
        if sub is not None:
            keys.extend(all_keys(sub, prefix + name + "."))
    return keys


def format_validation_error(model: type[BaseModel], err: ValidationError) -> str:
    """One paragraph: each unknown key once (with a close match when there is one), the valid
    keys of each section once, then the other errors."""
    name = model.__name__
    unknown: dict[str, tuple[Any, list[tuple[str, str]]]] = {}  # section prefix -> (its model, [(unknown key, hint)])
    lines = []
    for e in err.errors():
        loc = tuple(e.get("loc", ()))
        dotted = ".".join(str(p) for p in loc)
        if e["type"] in ("extra_forbidden", "no_such_attribute"):  # unknown key at construction / assignment
            sub, prefix = _fields_of(model, loc)
            key = str(loc[-1]) if loc else "?"
            close = difflib.get_close_matches(key, used_keys(sub) if sub else [], n=1, cutoff=0.6)
            anywhere = [k for k in all_keys(model) if k.split(".")[-1] == key]
            hint = ""
            if close:
                hint = f"Did you mean '{(prefix + '.' if prefix else '') + close[0]}'?"
            elif anywhere:
                hint = f"It exists as '{anywhere[0]}'."
            unknown.setdefault(prefix, (sub, []))[1].append((dotted, hint))
        elif e["type"] == "missing":
            lines.append(f"Missing required config key '{dotted}'.")
        else:
            got = e.get("input")
            # A model-level check (empty loc) gets the whole input: never echo that.
            got_s = f" (got {got!r})" if dotted and (not isinstance(got, (dict, list)) or len(repr(got)) < 80) else ""
            msg = e.get("msg", "invalid value").removeprefix("Value error, ")
            lines.append(f"Config key '{dotted}': {msg}{got_s}." if dotted else f"{msg}.")
    for prefix, (sub, keys) in unknown.items():
        where = f"section '{prefix}'" if prefix else name
        valid = ", ".join(used_keys(sub)) if sub else ""
        if len(keys) == 1:
            ((key, hint),) = keys
            text = f"Unknown config key '{key}' in {where}." + (f" {hint}" if hint else "")
        else:
            text = f"Unknown config keys {', '.join(repr(k) for k, _ in keys)} in {where}." + "".join(
                f" '{k}': {hint}" for k, hint in keys if hint
            )
        lines.insert(0, f"{text} Valid keys: {valid}.")
    return f"Invalid {name}: " + " ".join(lines)
