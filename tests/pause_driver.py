"""``shoal`` in this process, stopped at one moment of a checkpoint write so a test can kill it there.

    python tests/pause_driver.py STAGE N FILE [shoal arguments...]

The N-th time the process reaches STAGE it creates FILE and waits until it is killed. The
stages are found by wrapping what :mod:`shoal.checkpoint` calls, so the product code carries
no test hook:

- ``state``: ``state.pt`` written and synced, ``meta.json`` not yet (the meta's ``json.dump``)
- ``complete``: the new checkpoint's temporary directory whole and synced (its directory fsync)
- ``aside``: the old checkpoint of that name moved aside (``os.replace`` to ``.NAME.old-*``)
- ``replaced``: the new one in place, the old one not yet deleted (``rmtree`` of ``.NAME.old-*``)
- ``deleting``: a checkpoint renamed for deletion, not yet deleted (``rmtree`` of ``.NAME.del-*``)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

STAGES = ("state", "complete", "aside", "replaced", "deleting")


def install(stage: str, n: int, flag: Path) -> None:
    """Wrap shoal.checkpoint's file operations so that the ``n``-th ``stage`` creates ``flag`` and waits."""
    from shoal import checkpoint

    if stage not in STAGES:
        raise SystemExit(f"unknown stage {stage!r}; one of {', '.join(STAGES)}")
    reached = {"count": 0}

    def reach(name: str) -> None:
        if name != stage:
            return
        reached["count"] += 1
        if reached["count"] == n:
            flag.write_text(name)
            while True:
                time.sleep(1)

    real_dump, real_fsync_dir, real_replace, real_rmtree = json.dump, checkpoint._fsync_dir, os.replace, shutil.rmtree

    def dump(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("format") == checkpoint.FORMAT:  # the meta, right after state.pt
            reach("state")
        return real_dump(obj, f, *args, **kwargs)

    def fsync_dir(path) -> None:
        real_fsync_dir(path)
        if ".tmp-" in Path(path).name:
            reach("complete")

    def replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if ".old-" in Path(dst).name:
            reach("aside")

    def rmtree(path, *args, **kwargs):
        name = Path(path).name
        if ".old-" in name:
            reach("replaced")
        elif ".del-" in name:
            reach("deleting")
        return real_rmtree(path, *args, **kwargs)

    # this process runs nothing else: the wrappers go where shoal.checkpoint looks them up
    json.dump, os.replace, shutil.rmtree = dump, replace, rmtree
    checkpoint._fsync_dir = fsync_dir


if __name__ == "__main__":
    stage, n, flag, *args = sys.argv[1:]
    install(stage, int(n), Path(flag))
    from shoal.app.cli import main

    sys.argv = ["shoal", *args]
    main()
