"""MkDocs hook: pages ask for generated content with markers, filled in at build time.

``<!-- shoal:keys ALGO -->`` becomes the table of ALGO's config keys (the rows ``shoal config
ALGO`` prints, from :func:`shoal.config_reference.key_reference`), and ``<!-- shoal:presets ALGO -->``
lists the ``examples/*.yaml`` presets of ALGO with their leading comments (what each is for
and what it measured). The pages never hold a copy that could fall behind the code.
"""

from __future__ import annotations

import re
from pathlib import Path

from shoal.algorithms import REGISTRY, get_config_class
from shoal.config_reference import key_reference

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MARKER = re.compile(r"<!--\s*shoal:(keys|presets)\s+(\w+)\s*-->")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def keys_table(algo: str) -> str:
    """A Markdown table of every key of ``algo``'s config: key, type, default, description."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, type_name, default, description in key_reference(get_config_class(algo)):
        rows.append(f"| `{key}` | `{_cell(type_name)}` | `{_cell(default)}` | {_cell(description)} |")
    return "\n".join(rows)


def preset_files(algo: str) -> list[Path]:
    """The ``examples/*.yaml`` files of ``algo``: those named ``<algo>_*.yaml``."""
    return sorted(p for p in EXAMPLES.glob(f"{algo}_*.yaml"))


def _leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


def presets_section(algo: str) -> str:
    """Each preset of ``algo`` as a small heading and its leading comment (which names its command)."""
    files = preset_files(algo)
    if not files:
        return f"No preset in `examples/` uses `{algo}` yet."
    parts = []
    for path in files:
        parts.append(f"### `examples/{path.name}`\n\n```text\n{_leading_comment(path)}\n```")
    return "\n\n".join(parts)


def render(markdown: str) -> str:
    """``markdown`` with every shoal marker replaced by its generated content."""
    def fill(match: re.Match) -> str:
        kind, algo = match.groups()
        if algo not in REGISTRY:
            raise ValueError(f"shoal:{kind} marker names unknown algorithm '{algo}'; known: {', '.join(REGISTRY)}")
        return keys_table(algo) if kind == "keys" else presets_section(algo)

    return MARKER.sub(fill, markdown)


def on_page_markdown(markdown: str, **kwargs) -> str:
    return render(markdown)
