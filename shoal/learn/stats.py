"""Means of loss statistics (the one place that averages them), and advantage standardization.

Every learner reports a dict of scalars per SGD step; a result row holds their mean over the
steps (or over the learner results, or over DD-PPO's replicas) that reported each key.
:class:`StatsMean` keeps tensors where they are until ``mean()`` (a copy to the host waits
for the device, so it happens once per device, not once per step and key).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch


def standardize(advantages: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``(A - mean) / (std + 1e-8)`` over the valid steps (all when ``valid`` is None); masked steps stay 0.

    Standardizing removes each batch's mean and gives the surrogate unit scale, the scale PPO's
    clip_param is tuned for. It is a change of scale, not a rescue of a lost signal: measured on
    Pong, raw V-trace advantages have a standard deviation of 0.26-0.43 per batch (so this
    multiplies them by about 2-4), and near the uniform policy the entropy bonus's gradient is
    14-1300x smaller than the policy gradient's.
    """
    if valid is None:
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8) if len(advantages) > 1 else advantages
    mask = valid.to(advantages.dtype)
    n = mask.sum()
    if n < 2:
        return advantages
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / (n - 1)
    return (advantages - mean) / (var.sqrt() + 1e-8) * mask


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean of ``x`` over the steps where ``mask`` is True (all of them when it is None)."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


class StatsMean:
    """Accumulates statistics (tensors or floats) and averages each key over the adds that had it."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {}

    def add(self, stats: Mapping[str, Any], prefix: str = "") -> None:
        for k, v in stats.items():
            # tensors stay on their device (float32); plain numbers stay float64 (an lr averages to itself)
            v = v.detach().float() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)
            self.values.setdefault(prefix + k, []).append(v)

    def mean(self) -> dict[str, float]:
        by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for k, v in self.values.items():
            m = torch.stack([x.to(v[0].device, v[0].dtype, non_blocking=True) for x in v]).mean()
            by_device.setdefault(m.device, []).append((k, m))
        out: dict[str, float] = {}
        for items in by_device.values():
            host = torch.stack([m.double() for _, m in items]).cpu().tolist()
            out.update({k: x for (k, _), x in zip(items, host)})
        return {k: out[k] for k in self.values}


def mean_stats(stats: Iterable[Mapping[str, Any]], prefix: str = "") -> dict[str, float]:
    """Each key's mean over the dicts that hold it (``prefix`` prepended to the keys)."""
    acc = StatsMean()
    for s in stats:
        acc.add(s, prefix)
    return acc.mean()
