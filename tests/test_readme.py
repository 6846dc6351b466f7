"""Every ```python block of README.md and docs/*.md runs as written, in a fresh process in a temporary directory.

A fresh process so that a block starts its own Ray (as a reader's script would) and sees no
state from other tests; a temporary working directory so that the files a block writes
(``runs/``, ``ckpt/``) land there.

Every relative link in those pages must point to a file of the repository: a reader who
clones it follows them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
FENCE = re.compile(r"^```.*?^```$", flags=re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.S | re.M)


def run_block(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


BLOCKS = python_blocks(README)
DOC_BLOCKS = [(f"{page.stem}-block{i}", code) for page in DOCS for i, code in enumerate(python_blocks(page))]


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2  # the Python API and replay examples; a broken fence would hide them


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_as_written(code, tmp_path):
    p = run_block(code, tmp_path)
    assert p.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{p.stderr[-4000:]}"


def test_architecture_page_exists_and_readme_links_to_it():
    assert ARCHITECTURE.is_file()
    assert "(docs/architecture.md)" in README.read_text()
    for page in PAGES:  # an internal note users who clone the repository do not have
        assert "DESIGN.md" not in page.read_text(), f"{page.relative_to(ROOT)} refers to DESIGN.md"


@pytest.mark.parametrize("code", [code for _, code in DOC_BLOCKS], ids=[name for name, _ in DOC_BLOCKS])
def test_docs_python_block_runs_as_written(code, tmp_path):
    p = run_block(code, tmp_path)
    assert p.returncode == 0, f"docs block failed:\n{code}\n--- stderr ---\n{p.stderr[-4000:]}"


def relative_links(page: Path) -> list[str]:
    """Link targets outside code blocks and inline code that name a path (no scheme, not a bare #anchor)."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]
    return [t.split("#", 1)[0] for t in targets if not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_point_to_existing_files(page):
    broken = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"
