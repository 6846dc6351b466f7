"""Means of loss statistics (the one place that averages them), and advantage standardization.

Every learner reports a dict of scalars per SGD step; a result row holds their mean over the
steps (or over the learner results, or over DD-PPO's replicas) that reported each key.
:class:`StatsMean` keeps tensors where they are until ``mean()`` (a copy to the host waits
for the device, so it happens once per device, not once per step and key).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch

STANDARDIZE_SUMS = 3  # the length of what standardize_over_group sums over the group: count, sum, sum of squares


def standardize(
    advantages: torch.Tensor,
    valid: torch.Tensor | None = None,
    sum_over_group: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``(A - mean) / (std + 1e-8)`` over the valid steps (all when ``valid`` is None); masked steps stay 0.

    ``sum_over_group``: a data-parallel learner's sum over its group (a learner group member's
    ``Learner.sum_over_group``); the mean and std are then those of the valid steps of every
    replica's batch, the union batch one learner would standardize over (:func:`standardize_over_group`).

    Standardizing removes each batch's mean and gives the surrogate unit scale, the scale PPO's
    clip_param is tuned for. It is a change of scale, not a rescue of a lost signal: measured on
    Pong, raw V-trace advantages have a standard deviation of 0.26-0.43 per batch (so this
    multiplies them by about 2-4), and near the uniform policy the entropy bonus's gradient is
    14-1300x smaller than the policy gradient's.
    """
    if sum_over_group is not None:
        return standardize_over_group(advantages, valid, sum_over_group)
    if valid is None:
        return (advantages - advantages.mean()) / (advantages.std() + 1e-8) if len(advantages) > 1 else advantages
    mask = valid.to(advantages.dtype)
    n = mask.sum()
    if n < 2:
        return advantages
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / (n - 1)
    return (advantages - mean) / (var.sqrt() + 1e-8) * mask


def standardize_over_group(
    advantages: torch.Tensor, valid: torch.Tensor | None, sum_over_group: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """:func:`standardize` over the union of the replicas' batches: one sum over the group of the
    valid steps' (count, sum, sum of squares), in float64 so that the one-pass variance (sum of
    squares less n mean^2) keeps float32's precision through the cancellation. Every replica makes
    the call, one whose batch is empty too (with zeros), so the sums pair up; the result is the
    single learner's on the union batch, to float32 rounding."""
    a = advantages.detach().double()
    mask = torch.ones_like(a) if valid is None else valid.to(a.dtype)
    moments = sum_over_group(torch.stack([mask.sum(), (a * mask).sum(), (a * a * mask).sum()]))  # STANDARDIZE_SUMS
    n, total, squares = moments.unbind()
    if n < 2:
        return advantages
    mean = total / n
    var = ((squares - n * mean * mean) / (n - 1)).clamp(min=0.0)
    out = (advantages - mean.to(advantages.dtype)) / (var.sqrt().to(advantages.dtype) + 1e-8)
    return out if valid is None else out * valid.to(advantages.dtype)


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
