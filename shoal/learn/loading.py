"""Batches onto a learner's device, off the learning thread's critical path.

:func:`copy_to_device` is the one way a loader thread moves a :class:`~shoal.batch.Batch` to
its device: on the CPU it is :meth:`Batch.to_torch` (a copy where the arrays are read-only, e.g.
zero-copy views of Ray's object store); on CUDA each column goes through pinned host memory
(torch's caching host allocator, so blocks are reused) and a non-blocking copy on the loader's
own stream, which is synchronized before the tensors are handed over. Columns keep their dtype:
uint8 frames cross as uint8 (a quarter of float32's bytes) and the model scales them on the device.
Tensors used on other streams than the current one are recorded on them (``consumers``), so
their memory is not reused while those streams still read it.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from shoal.batch import Batch

_streams: dict[tuple[int, torch.device], Any] = {}


def copy_stream(device: torch.device):
    """This thread's copy stream on ``device`` (one per thread and device, made once)."""
    key = (threading.get_ident(), device)
    if key not in _streams:
        _streams[key] = torch.cuda.Stream(device=device)
    return _streams[key]


def copy_to_device(
    batch: Batch, device: torch.device, exclude: Sequence[str] = (), consumers: Sequence[Any] = ()
) -> dict[str, torch.Tensor]:
    """``batch``'s columns (less ``exclude``) as tensors on ``device``, ready to use when this returns."""
    if device.type != "cuda":
        return batch.to_torch(device, exclude=exclude)
    stream = copy_stream(device)
    with torch.cuda.stream(stream):
        tensors = {
            k: t.pin_memory().to(device, non_blocking=True) for k, t in batch.to_torch("cpu", exclude=exclude).items()
        }
    stream.synchronize()
    for c in (torch.cuda.current_stream(device), *consumers):
        for t in tensors.values():
            t.record_stream(c)
    return tensors
