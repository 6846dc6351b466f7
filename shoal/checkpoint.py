"""Atomic checkpoints that load with ``torch.load(weights_only=True)``.

A checkpoint is a directory holding ``state.pt`` (tensors, numbers, strings, lists and
dicts only: no pickled code) and ``meta.json`` (format tag, algorithm, iteration, the
resolved config). It is written into a temporary sibling directory and renamed into place,
so a crash never leaves a half-written checkpoint under the final name; an old checkpoint is
renamed aside before it is deleted, so a half-deleted one never looks complete either.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

import torch

from shoal.errors import CheckpointError, DivergenceError
from shoal.trust import sign_meta

FORMAT = "shoal-checkpoint"
FORMAT_VERSION = 1
STATE_FILE = "state.pt"
META_FILE = "meta.json"
TUNE_CHECKPOINT_NAME = "shoal"  # the shoal checkpoint inside a Tune checkpoint directory (checkpoint_000003/shoal)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace file ``path`` with ``text`` in one rename: a process killed meanwhile leaves the old
    file or the new one, never a torn or empty one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def nonfinite_tensor(state: Any, where: str = "") -> str | None:
    """The key path of the first floating-point tensor in ``state`` holding NaN or inf, or None.

    Replay contents (a ``replay`` key) are data, not weights, and are not looked at.
    """
    if isinstance(state, torch.Tensor):
        return where if state.is_floating_point() and not bool(torch.isfinite(state).all()) else None
    items: Iterable[tuple[Any, Any]]
    if isinstance(state, dict):
        items = ((k, v) for k, v in state.items() if k != "replay")
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return None
    for k, v in items:
        bad = nonfinite_tensor(v, f"{where}.{k}" if where else str(k))
        if bad is not None:
            return bad
    return None


FULL_DISK_BYTES = 1 << 20
"""Free space under which a write torch reports as failed counts as a full disk."""


def write_failure(e: RuntimeError, file: Path) -> OSError | None:
    """The OSError behind torch's RuntimeError from a failed write of ``file`` (named in it), or None.

    A write that fails inside ``torch.save`` (the disk is full, the quota used up) comes out as
    ``RuntimeError: [enforce fail at inline_container.cc:...]``: torch's zip writer, closing the
    archive after the write's OSError, replaces it. That OSError is taken back from the chain; with
    none there (torch writing by path), a failed write with under :data:`FULL_DISK_BYTES` free is ENOSPC.
    """
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            return OSError(seen.errno, seen.strerror or os.strerror(seen.errno), str(file))
        seen = seen.__cause__ or seen.__context__
    if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
        return None
    try:
        free = shutil.disk_usage(file.parent if file.parent.exists() else file.parent.parent).free
    except OSError:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file)) if free < FULL_DISK_BYTES else None


def save_checkpoint(path: str | Path, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` and ``meta`` to directory ``path`` atomically; replaces an existing one.

    A state whose weights (or optimizer moments) hold NaN or inf is refused with
    :class:`~shoal.errors.DivergenceError`, so no checkpoint ever holds diverged weights.
    """
    path = Path(path)
    remove_leftovers(path.parent)
    bad = nonfinite_tensor(state)
    if bad is not None:
        raise DivergenceError(
            f"refusing to write checkpoint '{path}': '{bad}' holds NaN or inf. The checkpoints "
            "already written are kept; lower lr or check the env's observations and rewards."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        # JSON's own form (what read_meta returns), signed with this user's key (shoal.trust)
        meta = json.loads(
            json.dumps(
                {"format": FORMAT, "format_version": FORMAT_VERSION, "created": time.time(), **meta}, default=str
            )
        )
        meta = sign_meta(meta)
        with open(tmp / STATE_FILE, "wb") as f:
            try:
                torch.save(state, f)
            except RuntimeError as e:
                failure = write_failure(e, path / STATE_FILE)
                if failure is None:
                    raise
                raise failure from e
            f.flush()
            os.fsync(f.fileno())
        with open(tmp / META_FILE, "w") as f:
            json.dump(meta, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        old = None
        if path.exists():  # a directory cannot be renamed over a full one: move it aside first
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def delete_checkpoint(path: str | Path) -> None:
    """Remove a checkpoint directory: renamed to ``.NAME.del-*`` first (one atomic step), then
    deleted, so a process killed halfway never leaves a partial checkpoint under its name."""
    path = Path(path)
    if not path.exists():
        return
    gone = path.parent / f".{path.name}.del-{uuid.uuid4().hex[:8]}"
    os.replace(path, gone)
    _fsync_dir(path.parent)
    shutil.rmtree(gone, ignore_errors=True)


def read_meta(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"Checkpoint path '{path}' does not exist.")
    meta_file = path / META_FILE
    if not path.is_dir() or not meta_file.is_file() or not (path / STATE_FILE).is_file():
        raise CheckpointError(
            f"'{path}' is not a shoal checkpoint: a checkpoint is a directory with {META_FILE} and {STATE_FILE} "
            "(or pass a run directory, whose best or latest checkpoint is used)."
        )
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(
            f"'{meta_file}' is unreadable or not JSON ({e}); this is not a shoal checkpoint."
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"'{path}' is not a shoal checkpoint ({META_FILE} lacks format '{FORMAT}').")
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"'{path}' was written by a newer shoal (format {meta['format_version']}); upgrade shoal."
        )
    return meta


class DamagedCheckpoint(CheckpointError):
    """A checkpoint that cannot be used: ``problem`` says what is wrong; the message adds the advice
    to use another checkpoint of the run (which a caller that has tried them all leaves out)."""

    def __init__(self, problem: str, advice: str = "Use an earlier checkpoint of the run.") -> None:
        super().__init__(f"{problem} {advice}")
        self.problem = problem


def read_run_meta(path: str | Path) -> dict[str, Any]:
    """:func:`read_meta` of an algorithm's checkpoint, checked by :func:`check_run_meta`."""
    return check_run_meta(path, read_meta(path))


def check_run_meta(path: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (checkpoint ``path``'s meta.json, as :func:`read_meta` read it), checked to hold what
    rebuilds the run: the algorithm's name, its config and the iteration, and what stop criteria read
    there (env steps, training seconds; a checkpoint written before meta.json held those may lack
    them); a CheckpointError naming what is wrong."""
    for key, kind, what, required in (
        ("algo", str, "a string naming the algorithm", True),
        ("config", dict, "a mapping of the run's config", True),
        ("iteration", int, "a whole number of at least 0", True),
        ("env_steps_sampled", int, "a whole number of at least 0", False),
        ("time_total_s", (int, float), "a number of at least 0", False),
    ):
        if key not in meta and not required:
            continue
        value = meta.get(key)
        negative = isinstance(value, (int, float)) and not value >= 0  # NaN too
        if not isinstance(value, kind) or isinstance(value, bool) or negative:
            found = "is missing" if key not in meta else f"is {type(value).__name__} {value!r}"[:120]
            raise DamagedCheckpoint(
                f"'{Path(path) / META_FILE}' is damaged: its '{key}' {found}; shoal writes {what} there.",
                "Use another checkpoint of the run.",
            )
    return meta


@dataclass(frozen=True, eq=False)
class OpenedCheckpoint:
    """A checkpoint opened once, by :func:`open_checkpoint`: its directory (``path``, resolved from a
    run directory if that was given), its meta.json (``meta``, read and checked), and its state.pt
    (``state``), loaded the first time it is asked for and kept while this value lives.

    ``Algorithm.from_checkpoint``, ``shoal.load_policy``, evaluation and export take it in place of a
    path, and read nothing of the checkpoint again. ``str()`` and ``os.fspath()`` give its directory."""

    path: Path
    meta: dict[str, Any]

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @cached_property
    def state(self) -> dict[str, Any]:
        """state.pt (:func:`load_state`, on the CPU): loaded once, when first asked for."""
        return load_state(self.state_file)

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)


def open_checkpoint(
    path: str | Path | OpenedCheckpoint, prefer: str = "latest", *, run: bool = True, resolve: bool = True
) -> OpenedCheckpoint:
    """Checkpoint ``path`` opened: the directory :func:`resolve_checkpoint` finds (``prefer``: "latest"
    or "best"; ``resolve`` False: ``path`` is the checkpoint directory itself) and its meta.json read
    by :func:`read_meta`, and with ``run`` checked by :func:`check_run_meta` (an algorithm's checkpoint).
    Its state is not loaded yet. An :class:`OpenedCheckpoint` is returned as it is (with ``run``, its
    meta checked again: a look at a dict, not a read)."""
    if isinstance(path, OpenedCheckpoint):
        if run:
            check_run_meta(path.path, path.meta)
        return path
    directory = resolve_checkpoint(path, prefer) if resolve else Path(path)
    meta = read_meta(directory)
    return OpenedCheckpoint(directory, check_run_meta(directory, meta) if run else meta)


def load_checkpoint(
    path: str | Path | OpenedCheckpoint, map_location: str = "cpu"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a checkpoint (or a run directory's latest one), the state loaded anew."""
    opened = open_checkpoint(path, run=False)
    return load_state(opened.state_file, map_location), opened.meta


def load_state(file: Path, map_location: str = "cpu", mmap: bool = False) -> dict[str, Any]:
    """``torch.load(file, weights_only=True)``; an empty, truncated or foreign file is a CheckpointError
    saying which (shoal never unpickles code, so it never loads with weights_only=False)."""
    if not file.is_file():
        raise CheckpointError(f"Cannot load '{file}': the file does not exist.")
    size = file.stat().st_size
    if size == 0:
        raise DamagedCheckpoint(
            f"Cannot load '{file}': it is empty (0 bytes), probably because the process writing it was killed."
        )
    try:
        state = torch.load(file, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"Cannot load '{file}': it holds objects other than tensors, numbers, strings, lists "
            "and dicts, so shoal did not write it; shoal loads no pickled code from a checkpoint."
        ) from None
    except Exception as e:  # noqa: BLE001 - a torn zip archive fails in many ways
        detail = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else ""
        detail = f"{type(e).__name__}: {detail}" if detail and "weights_only" not in detail else type(e).__name__
        raise DamagedCheckpoint(
            f"Cannot load '{file}' ({size:,} bytes): it is truncated or corrupt, not a complete "
            f"torch archive ({detail})."
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"Cannot load '{file}': it holds a {type(state).__name__}, not a shoal state dict.")
    return state


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check that ``path`` is a whole, loadable checkpoint of an algorithm (its meta.json as
    :func:`read_run_meta` checks it; its tensors mapped, not read); its meta."""
    path = Path(path)
    meta = read_run_meta(path)
    load_state(path / STATE_FILE, mmap=True)
    return meta


def remove_leftovers(ckpt_dir: str | Path) -> list[str]:
    """Clean up after a save that was killed: a checkpoint moved aside (``.NAME.old-*``) whose
    replacement never landed is put back; other ``.NAME.old-*``, ``.NAME.tmp-*`` and ``.NAME.del-*``
    (a checkpoint being deleted) directories are removed. Returns what was done, one line each."""
    d = Path(ckpt_dir)
    done: list[str] = []
    if not d.is_dir():
        return done
    for p in sorted(d.iterdir()):
        m = re.fullmatch(r"\.(.+)\.(old|tmp|del)-[0-9a-f]{8}", p.name)
        if m is None or not p.is_dir():
            continue
        target = d / m.group(1)
        if m.group(2) == "old" and not target.exists() and (p / META_FILE).is_file():
            os.replace(p, target)
            done.append(f"restored {target.name} from {p.name}")
        else:
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"removed {p.name}")
    return done


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Numbered checkpoints (``checkpoint_000010``) in iteration order."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted(
        p for p in d.iterdir() if p.is_dir() and p.name.startswith("checkpoint_") and (p / META_FILE).is_file()
    )


def resolve_checkpoint(path: str | Path, prefer: str = "latest") -> Path:
    """A checkpoint directory from a checkpoint, a ``checkpoints/`` directory, a run directory,
    or a Tune trial directory or one of its checkpoint directories (``shoal tune``'s).

    ``prefer`` is "latest" (the last numbered checkpoint) or "best" (a Tune trial has no best:
    its latest).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"Checkpoint path '{p}' does not exist.")
    if (p / META_FILE).is_file():
        return p
    if (p / TUNE_CHECKPOINT_NAME / META_FILE).is_file():
        return p / TUNE_CHECKPOINT_NAME
    trial = sorted(
        c / TUNE_CHECKPOINT_NAME for c in p.glob("checkpoint_*") if (c / TUNE_CHECKPOINT_NAME / META_FILE).is_file()
    )
    if trial:
        return trial[-1]
    for d in (p / "checkpoints", p):
        numbered = list_checkpoints(d)
        best = d / "best"
        if prefer == "best" and (best / META_FILE).is_file():
            return best
        if numbered:
            return numbered[-1]
        if (best / META_FILE).is_file():
            return best
    raise CheckpointError(
        f"No shoal checkpoint found in '{p}': expected a checkpoint directory (with {META_FILE}), "
        "a run directory with checkpoints/, a checkpoints/ directory, or a Tune trial directory."
    )
