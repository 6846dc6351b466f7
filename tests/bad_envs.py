"""Env factories that fail in the ways a user's own factory can (for tests/test_bad_inputs.py)."""

from __future__ import annotations


def raising_env(**kwargs):
    raise RuntimeError("the maze file maze.txt is missing")


def not_an_env(**kwargs):
    return 42
