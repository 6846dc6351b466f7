"""Every ```python block of README.md runs as written, in a fresh process in a temporary directory.

A fresh process so that a block starts its own Ray (as a reader's script would) and sees no
state from other tests; a temporary working directory so that the files a block writes
(``runs/``, ``ckpt/``) land there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2  # the Python API and replay examples; a broken fence would hide them


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_as_written(code, tmp_path):
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{p.stderr[-4000:]}"
