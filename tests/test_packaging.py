"""A release: `python -m build` makes a wheel and an sdist from the repository's files, and the
wheel, installed on its own (not the checkout), runs `shoal train`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import shoal

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "shoal", src / "shoal", ignore=shutil.ignore_patterns("__pycache__"))
    out = src / "dist"
    p = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def test_build_makes_a_wheel_and_an_sdist_named_by_the_one_version(dist):
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    assert wheel.name.startswith(f"shoal-{shoal.__version__}-") and sdist.name == f"shoal-{shoal.__version__}.tar.gz"
    names = zipfile.ZipFile(wheel).namelist()
    assert "shoal/py.typed" in names and "shoal/app/cli.py" in names and not any(n.startswith("tests/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "shoal = shoal.app.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
    members = tarfile.open(sdist).getnames()
    assert f"shoal-{shoal.__version__}/pyproject.toml" in members and f"shoal-{shoal.__version__}/LICENSE" in members


def test_the_installed_wheel_trains_without_the_checkout(dist, tmp_path):
    (wheel,) = dist.glob("*.whl")
    target = tmp_path / "site"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    run = [
        sys.executable,
        "-m",
        "shoal",
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "1",
        "--no-stop-reward",
        "-q",
        "--set",
        "train_batch_size=256",
        "--set",
        "minibatch_size=128",
        "--out",
        str(tmp_path / "runs"),
    ]
    where = subprocess.run(
        [sys.executable, "-c", "import shoal; print(shoal.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.stdout.strip().startswith(str(target)), where  # the wheel's copy, not the repository's
    p = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(list((tmp_path / "runs").glob("ppo_CartPole-v1_*/checkpoints/checkpoint_000001"))) == 1


def test_install_hints_give_the_form_that_works_from_a_clone():
    """shoal is not on the package index: `pip install 'shoal[video]'` fails, `pip install -e
    '.[video]'` in the checkout works. Every message and --help in shoal/ says the latter."""
    import re

    from helpers import flat, invoke

    index_form = re.compile(r"pip install[^\n]*?\bshoal\\*\[")
    wrong = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "shoal").rglob("*.py"))
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if index_form.search(line)
    ]
    assert not wrong, wrong
    r = invoke("evaluate", "--help")
    help_text = flat(r.output.translate({ord(c): " " for c in "│╭╮╰╯"}))  # the text inside rich's boxes
    assert r.exit_code == 0 and "pip install -e '.[video]' in the shoal checkout" in help_text, r.output
    r = invoke("config", "ppo")
    assert "pip install -e '.[wandb]'" in flat(r.output) and "shoal[" not in r.output
