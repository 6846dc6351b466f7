"""The key reference: every key of a config class with its type, default and description.

What `shoal config ALGO` prints (and, with ``--yaml``, a complete commented config file), and
what the documentation site's generated keys tables show.
"""

from __future__ import annotations

from typing import Any, Optional

import yaml
from pydantic import BaseModel

from shoal.config import _section_type, env_spec_to_str, used_keys


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def key_reference(
    model: type[BaseModel], prefix: str = "", box: dict[str, Any] | None = None
) -> list[tuple[str, str, str, str]]:
    """``(dotted key, type, default, description)`` as text for every key that may be set, sections
    included (a section's own row, default "(section)", comes before its keys; unused keys are left out).
    A default that differs for Box (continuous) actions shows both: ``0.99 (Box actions: 0.9)``."""
    box = getattr(model, "box_action_defaults", {}) if box is None else box
    rows = []
    for name in used_keys(model):
        field = model.model_fields[name]
        sub = _section_type(model, name)
        if field.is_required():
            default = "(required)"
        elif sub is not None:
            default = "(section)"
        else:
            default = repr(field.get_default(call_default_factory=True))
            if prefix + name in box:
                default += f" (Box actions: {box[prefix + name]!r})"
        rows.append((prefix + name, _type_name(field.annotation), default, field.description or ""))
        if sub is not None:
            rows.extend(key_reference(sub, prefix + name + ".", box))
    return rows


def commented_yaml(
    model: type[BaseModel],
    indent: str = "",
    required: Optional[dict[str, Any]] = None,
    prefix: str = "",
    box: dict[str, Any] | None = None,
) -> str:
    """A complete config file of ``model``'s defaults, each key under its description as a comment
    (and the default for Box actions, where it differs). ``required`` gives placeholder values for
    keys without a default."""
    box = getattr(model, "box_action_defaults", {}) if box is None else box
    lines = []
    for name in used_keys(model):
        field = model.model_fields[name]
        if field.description:
            lines.append(f"{indent}# {field.description}")
        if prefix + name in box:
            lines.append(f"{indent}# With Box (continuous) actions, left unset: {box[prefix + name]!r}.")
        sub = _section_type(model, name)
        if sub is not None:
            lines.append(f"{indent}{name}:")
            lines.append(commented_yaml(sub, indent + "  ", prefix=prefix + name + ".", box=box))
            continue
        if field.is_required():
            value = (required or {}).get(name)
        else:
            value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if callable(value) and not isinstance(value, type):
            value = env_spec_to_str(value)
        dumped = yaml.safe_dump({name: value}, default_flow_style=True, sort_keys=False, width=10_000).strip()
        lines.append(f"{indent}{dumped.removeprefix('{').removesuffix('}')}")
    return "\n".join(lines)
