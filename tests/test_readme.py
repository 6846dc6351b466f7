"""The README and the documentation site: their code runs, their links resolve, the site is whole.

Every ```python block of README.md and of every page under docs/ runs as written, in a fresh
process in a temporary directory: a fresh process so that a block starts its own Ray (as a
reader's script would) and sees no state from other tests; a temporary working directory so
that the files a block writes (``runs/``, ``ckpt/``) land there.

Every relative link in those pages must point to a file of the repository: a reader who
clones it follows them, on GitHub or in the built site. Every page is in the site's nav, and
the build hook that generates each algorithm's keys table and presets covers every algorithm.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shoal.algorithms import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS_DIR = ROOT / "docs"
ARCHITECTURE = DOCS_DIR / "architecture.md"
DOCS = sorted(DOCS_DIR.rglob("*.md"))
PAGES = [README, *DOCS]
MKDOCS = ROOT / "mkdocs.yml"
FENCE = re.compile(r"^```.*?^```$", flags=re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::[^"]*)?"$', flags=re.M)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", page.read_text(), flags=re.S | re.M)


def run_block(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def page_id(page: Path) -> str:
    return page.relative_to(DOCS_DIR).with_suffix("").as_posix()


def distinct_blocks(pages: list[Path], seen: list[str]) -> list[tuple[str, str]]:
    """``(id, code)`` of each page's python blocks, less those whose code is in ``seen`` or came
    earlier (the docs' home page repeats the README's quickstart: one run tests both)."""
    out = []
    for page in pages:
        for i, code in enumerate(python_blocks(page)):
            if code not in seen:
                seen.append(code)
                out.append((f"{page_id(page)}-block{i}", code))
    return out


BLOCKS = python_blocks(README)
DOC_BLOCKS = distinct_blocks(DOCS, list(BLOCKS))


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2  # the quickstart and the Python API examples; a broken fence would hide them


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_as_written(code, tmp_path):
    p = run_block(code, tmp_path)
    assert p.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{p.stderr[-4000:]}"


def test_architecture_page_exists_and_readme_links_to_it():
    assert ARCHITECTURE.is_file()
    assert "(docs/architecture.md)" in README.read_text()
    for page in PAGES:  # an internal note users who clone the repository do not have
        assert "DESIGN.md" not in page.read_text(), f"{page.relative_to(ROOT)} refers to DESIGN.md"


def test_docs_pages_in_subfolders_are_found():
    assert DOCS_DIR / "algorithms" / "ppo.md" in DOCS  # rglob, not glob: the pages live in sections
    assert len(DOC_BLOCKS) >= 10


@pytest.mark.parametrize("code", [code for _, code in DOC_BLOCKS], ids=[name for name, _ in DOC_BLOCKS])
def test_docs_python_block_runs_as_written(code, tmp_path):
    p = run_block(code, tmp_path)
    assert p.returncode == 0, f"docs block failed:\n{code}\n--- stderr ---\n{p.stderr[-4000:]}"


def relative_links(page: Path) -> list[str]:
    """Link targets outside code blocks and inline code that name a path (no scheme, not a bare #anchor)."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t, flags=re.I)]
    return [t.split("#", 1)[0] for t in targets if not t.startswith("#")]


def test_relative_links_ignore_code_urls_and_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](a.md#x) [b](https://b.org) [c](#top) `[d](d.md)`\n```\n[e](e.md)\n```\n[f](../f.md)\n")
    assert relative_links(page) == ["a.md", "../f.md"]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_point_to_existing_files(page):
    broken = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_docs_links_stay_inside_the_site():
    """A link out of docs/ works on GitHub but not in the built site (MkDocs --strict refuses it)."""
    outside = [
        (page.relative_to(ROOT), t)
        for page in DOCS
        for t in relative_links(page)
        if DOCS_DIR not in (page.parent / t).resolve().parents
    ]
    assert not outside, f"links leaving docs/ (name such files in `code`, or link a page of the site): {outside}"


@pytest.mark.parametrize("page", [p for p in DOCS if SNIPPET.search(p.read_text())], ids=page_id)
def test_snippet_includes_name_existing_files(page):
    missing = [path for path in SNIPPET.findall(page.read_text()) if not (ROOT / path).is_file()]
    assert not missing, f"{page_id(page)} includes missing files: {missing}"


# ---- the site: nav and the build hook ------------------------------------------------------------
def nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [f for value in node.values() for f in nav_files(value)]
    return [f for item in node for f in nav_files(item)]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_files(yaml.safe_load(MKDOCS.read_text())["nav"])
    pages = {page.relative_to(DOCS_DIR).as_posix() for page in DOCS}
    assert sorted(set(nav) - pages) == [], "nav entries without a page"
    assert sorted(pages - set(nav)) == [], "pages missing from the nav (orphans)"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert {
        "guide/callbacks.md",
        "guide/logging.md",
        "guide/evaluation.md",
        "guide/export.md",
        "guide/environments.md",
    } <= set(nav)


def load_hook():
    spec = importlib.util.spec_from_file_location("shoal_docs_hook", ROOT / "docs_hooks" / "shoal_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mkdocs_config_uses_the_hook():
    assert yaml.safe_load(MKDOCS.read_text())["hooks"] == ["docs_hooks/shoal_docs.py"]


def test_keys_hook_renders_a_table_of_every_key_for_every_algorithm():
    from shoal.algorithms import get_config_class
    from shoal.config_reference import key_reference

    hook = load_hook()
    for algo in REGISTRY:
        out = hook.render(f"before\n\n<!-- shoal:keys {algo} -->\n\nafter")
        lines = out.splitlines()
        assert lines[0] == "before" and lines[-1] == "after" and "shoal:keys" not in out
        rows = [line for line in lines if line.startswith("| `")]
        keys = [row[0] for row in key_reference(get_config_class(algo))]
        assert [row.split("`")[1] for row in rows] == keys, algo
        assert all(row.count(" | ") == 3 for row in rows), f"{algo}: a cell broke the table"


def test_keys_table_escapes_pipes_and_newlines():
    assert load_hook()._cell("a|b\nc") == "a\\|b c"


def test_keys_hook_refuses_an_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown algorithm 'ppoo'"):
        load_hook().render("<!-- shoal:keys ppoo -->")


def test_every_preset_is_shown_on_its_algorithm_page():
    hook = load_hook()
    shown = {path for algo in REGISTRY for path in hook.preset_files(algo)}
    tune_files = {p for p in (ROOT / "examples").glob("*.yaml") if "search" in (yaml.safe_load(p.read_text()) or {})}
    assert tune_files and all(f"examples/{p.name}" in (DOCS_DIR / "guide" / "tune.md").read_text() for p in tune_files)
    assert shown == set((ROOT / "examples").glob("*.yaml")) - tune_files, "a preset belongs to no algorithm"
    ppo = hook.render("<!-- shoal:presets ppo -->")
    assert "### `examples/ppo_cartpole.yaml`" in ppo and "appo_cartpole" not in ppo
    assert "PPO on CartPole-v1" in ppo  # the file's leading comment, not its keys


@pytest.mark.parametrize("algo", list(REGISTRY))
def test_every_algorithm_page_has_its_generated_keys_and_presets(algo):
    text = (DOCS_DIR / "algorithms" / f"{algo}.md").read_text()
    assert f"<!-- shoal:keys {algo} -->" in text and f"<!-- shoal:presets {algo} -->" in text
    assert "## Measured" in text
