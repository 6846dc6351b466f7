"""Per-process settings every worker, learner and driver applies when it starts.

- ``torch.set_num_threads(resources.torch_threads)``: with one thread per process on a
  small machine, processes do not fight over cores; more threads than the cores can give
  make a small update step many times slower.
- ``resources.retain_freed_memory``: glibc's malloc hands large blocks (>= 128 KB at first)
  back to the kernel when they are freed, so every minibatch's activations and gradients
  are fresh pages, each touched page a page fault. Fixed thresholds keep freed memory for
  reuse: a training process then takes few page faults and little kernel time, and trains
  faster.

The measurements behind both are in benchmarks/README.md ("Figures behind choices in the code").

It also reads the host's available memory (:func:`available_memory_bytes`), which env, model
and replay checks compare their needs against.

Not under ``runtime/``: rollout workers apply these too, and ``rollout/`` does not import
``runtime/`` (the package that may import Ray).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Optional

log = logging.getLogger("shoal.process")

M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own upper bound for the dynamic threshold
TRIM_THRESHOLD_BYTES = 128 << 20

_retained = False


def retain_freed_memory() -> bool:
    """Make glibc keep freed blocks below 32 MB for reuse. True if applied (now or before); False without glibc."""
    global _retained
    if _retained:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not ok:
        log.debug("mallopt refused the thresholds; malloc keeps its defaults")
    _retained = ok
    return ok


def configure_process(resources) -> None:
    """Apply a ResourcesConfig's per-process settings (threads, memory) to this process."""
    import torch  # here: replay shards import this module for retain_freed_memory and start without torch

    torch.set_num_threads(resources.torch_threads)
    if resources.retain_freed_memory:
        retain_freed_memory()


# ---- host memory ----------------------------------------------------------------------------
GB = 1e9


def available_memory_bytes() -> Optional[int]:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
