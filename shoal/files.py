"""What shoal reads from files and writes to them, made safe: YAML parsed with limits an
attacker's file cannot get past, secrets kept out of every file shoal writes, and output paths
checked before any work starts."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

YAML_MAX_NODES = 100_000
"""The most values a YAML document may hold once its aliases are expanded: a config holds a few
hundred; a 'billion laughs' alias bomb of a few hundred bytes would expand to billions."""


class YamlRefused(yaml.constructor.ConstructorError):
    """Valid YAML that :func:`safe_yaml` refuses (an alias bomb, a recursive alias, a repeated key)."""


def safe_yaml(text: str, max_nodes: int = YAML_MAX_NODES) -> Any:
    """``yaml.safe_load(text)``, refusing what a config never needs and an attacker would use: a
    document whose aliases expand past ``max_nodes`` values, a recursive alias, a mapping that
    gives one key twice (YAML would keep the last silently). Raises a ``yaml.YAMLError`` saying where."""
    from yaml.nodes import MappingNode, Node, SequenceNode

    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        sizes: dict[int, int] = {}
        open_nodes: set[int] = set()

        def size(node: Node) -> int:
            if id(node) in sizes:
                return sizes[id(node)]
            if id(node) in open_nodes:
                raise YamlRefused(
                    None, None, "an alias refers to a node that contains it (recursive alias)", node.start_mark
                )
            open_nodes.add(id(node))
            total = 1
            if isinstance(node, MappingNode):
                seen: set[Any] = set()
                for k, v in node.value:
                    key = k.value if isinstance(k.value, str) else None
                    if key is not None and key in seen and k.tag != "tag:yaml.org,2002:merge":
                        raise YamlRefused(
                            "while reading a mapping", node.start_mark, f"key '{key}' is given twice", k.start_mark
                        )
                    seen.add(key)
                    total += size(k) + size(v)
            elif isinstance(node, SequenceNode):
                total += sum(size(c) for c in node.value)
            open_nodes.discard(id(node))
            sizes[id(node)] = total
            if total > max_nodes:
                raise YamlRefused(
                    None,
                    None,
                    f"its aliases expand to over {max_nodes:,} values (a config holds a "
                    "few hundred): refused as an alias bomb",
                    node.start_mark,
                )
            return total

        size(root)
        return loader.construct_document(root)
    finally:
        loader.dispose()


_URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):([^/@\s]+)@")
REDACTED = "***"


def redact_secrets(data: Any) -> Any:
    """``data`` with the password of every URL that carries one replaced by ``***``
    (``https://me:s3cret@mlflow.example`` -> ``https://me:***@mlflow.example``)."""
    if isinstance(data, dict):
        return {k: redact_secrets(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(redact_secrets(v) for v in data)
    if isinstance(data, str):
        return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", data)
    return data


def strip_redacted_password(url: str) -> str:
    """A URL whose password was redacted (read back from a file shoal wrote) without its user
    info, so the client reads credentials from its own environment variables instead."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@:\s]*:" + re.escape(REDACTED) + "@", r"\1", url)


def unwritable_ancestor(path: Path) -> Path | None:
    """The nearest existing one of ``path`` and its parents when it is not a directory this process
    may create entries in (so ``path`` cannot be made); None when it is.

    The permission bits are not the whole answer (root passes every check, yet ``/proc`` or a
    read-only mount refuse a new entry), so a directory that passes them is asked for real: a
    probe directory is made in it and removed at once."""
    ancestor = next((a for a in (path, *path.parents) if a.exists()), Path("."))
    if not (ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK)):
        return ancestor
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".shoal-probe-", dir=ancestor))
    except OSError:
        return ancestor
    return None
