"""Learner: a module, its optimizer and a loss function, on one device.

The algorithm passes ``loss_fn(module, batch, learner) -> (loss, stats)`` where ``batch`` is
a dict of tensors already on the learner's device and ``stats`` a dict of scalar tensors.
``update()`` runs epochs of shuffled minibatch SGD; ``compute_gradients()`` and
``apply_gradients()`` are separate so data-parallel learners can reduce gradients between
them (``reduce_gradients`` hook).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import numpy as np
import torch

from shoal.batch import Batch
from shoal.errors import ConfigError, DivergenceError
from shoal.learn.stats import StatsMean
from shoal.models.weights import load_numpy_weights, weights_to_numpy
from shoal.schedule import PiecewiseSchedule


def minibatch_indices(
    n: int, minibatch_size: int, rng: np.random.Generator, num_minibatches: int | None = None, sequence_length: int = 1
) -> list[torch.Tensor | None]:
    """One epoch's minibatches over ``n`` rows: index tensors in a fresh random order.

    With ``sequence_length`` L > 1 the rows are sequences of L laid out one after another
    (``n`` a multiple of L) and each minibatch is whole sequences: ``minibatch_size // L`` of
    them, shuffled as units. A single minibatch of sequences is ``[None]``: the batch as it is.
    ``num_minibatches`` instead splits every epoch into that many near-equal minibatches.
    """
    if sequence_length > 1:
        if num_minibatches is None and minibatch_size >= n:
            return [None]
        order = torch.from_numpy(rng.permutation(n // sequence_length))
        per = max(1, minibatch_size // sequence_length)
        seqs = order.split(per) if num_minibatches is None else torch.tensor_split(order, num_minibatches)
        return [(s[:, None] * sequence_length + torch.arange(sequence_length)).reshape(-1) for s in seqs]
    order = torch.from_numpy(rng.permutation(n))
    if num_minibatches is None:
        return [order[start : start + minibatch_size] for start in range(0, n, minibatch_size)]
    # fewer rows than minibatches (a pathological batch) repeats rows rather than leave one empty
    return list(
        torch.tensor_split(order.repeat(-(-num_minibatches // n)) if n < num_minibatches else order, num_minibatches)
    )


def resolve_device(num_gpus: float) -> torch.device:
    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"resources.num_gpus={num_gpus} but torch sees no CUDA device on this machine; "
            "set resources.num_gpus=0 to learn on the CPU."
        )
    return torch.device("cuda")


def make_adam(params, lr: float, eps: float) -> torch.optim.Adam:
    """Adam with the fused kernel where torch has one (CPU since 2.4): faster small updates (benchmarks/README.md)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, eps=eps)


def describe_nonfinite(stats: dict, grad_norm: torch.Tensor) -> str:
    """Which loss terms of ``stats`` are NaN or inf, and the gradient norm: for a divergence message."""
    bad = []
    for k, v in stats.items():
        x = float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else v
        if isinstance(x, float) and not math.isfinite(x):
            bad.append(f"{k}={x}")
    terms = f"non-finite loss terms: {', '.join(bad)}" if bad else "every loss term finite"
    return f"{terms}; gradient norm {float(grad_norm)}"


LossFn = Callable[[torch.nn.Module, dict, "Learner"], tuple[torch.Tensor, dict]]
LossTerm = Callable[[], tuple[torch.Tensor, dict]]  # one term of a loss: (its value, its stats)


def _forward_backward(term: LossTerm) -> tuple[torch.Tensor, dict]:
    """One loss term's forward and backward pass (on the learner's side thread): its value and stats."""
    loss, stats = term()
    loss.backward()
    return loss.detach(), stats


class Learner:
    # A data-parallel learner's sum of a statistic over its group, for a loss whose statistics
    # span the batch (advantage standardization): None for a learner on its own.
    sum_over_group: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(
        self,
        module: torch.nn.Module,
        loss_fn: LossFn,
        lr: float,
        grad_clip: float | None = None,
        lr_schedule: list[tuple[int, float]] | None = None,
        device: torch.device | str = "cpu",
        loss_schedules: Mapping[str, Sequence[tuple[int, float]] | None] | None = None,
        adam_eps: float = 1e-5,
        max_nonfinite_updates: int = 20,
        side_thread: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.module = module.to(self.device)
        self.loss_fn = loss_fn
        self.grad_clip = grad_clip
        self.schedule = PiecewiseSchedule(lr_schedule) if lr_schedule else None
        self.lr = self.schedule(0) if self.schedule else lr
        # loss fields on a schedule (entropy_coeff_schedule): the loss record is a dataclass whose
        # field is replaced, one attribute store, whenever the env steps move
        self.loss_schedules = {k: PiecewiseSchedule(v) for k, v in (loss_schedules or {}).items() if v}
        self.env_steps = 0.0
        self.optimizer = make_adam(self.module.parameters(), self.lr, adam_eps)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        if self.loss_schedules:
            self.set_env_steps(0)
        # Scalars a custom loss may keep with the learner (saved in checkpoints as "extra");
        # shoal's own post-update state is named (shoal.learn.target), not kept here.
        self.extra_state: dict[str, float] = {}
        self.post_update_hooks: list[Callable[[int], Any]] = []
        self.last_batch_rows = 0  # rows of the minibatch being learned (set by compute_gradients)
        self.num_updates = 0
        self.max_nonfinite_updates = max_nonfinite_updates
        self.num_nonfinite_skipped = 0  # updates skipped for a NaN/inf loss or gradient, over the run
        self._nonfinite_in_a_row = 0
        self._last_stats: dict = {}  # the loss terms of the minibatch being learned (named when one is NaN/inf)
        # a second thread for loss terms that run beside the rest of the loss (``beside``); made when first used
        self.side_thread = side_thread
        self._side: ThreadPoolExecutor | None = None
        self._beside: list[Future] = []

    # ---- optimisation ------------------------------------------------------------------
    def set_env_steps(self, env_steps: float) -> None:
        """Move the learning rate and the scheduled loss fields along their schedules."""
        self.env_steps = float(env_steps)
        if self.schedule is not None:
            self.lr = self.schedule(env_steps)
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr
        if self.loss_schedules:
            self.loss_fn = dataclasses.replace(  # type: ignore[type-var]
                self.loss_fn, **{k: s(env_steps) for k, s in self.loss_schedules.items()}
            )

    def set_lr(self, lr: float) -> None:
        """A new fixed learning rate, from the next update on (the optimizer's moments are kept)."""
        self.lr = float(lr)
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr

    def compute_gradients(self, batch: dict) -> dict:
        self.optimizer.zero_grad(set_to_none=True)
        self.last_batch_rows = len(next(iter(batch.values()))) if batch else 0
        try:
            loss, stats = self.loss_fn(self.module, batch, self)
            loss.backward()
        finally:  # no term may still be writing gradients when the optimizer steps, or when this raises
            beside, self._beside = self._beside, []
            if beside:  # only with a side thread: nothing more per update without one
                wait_futures(beside)
        total = loss.detach()
        for fut in beside:  # each term's forward and backward ran on the side thread
            term_loss, term_stats = fut.result()
            total = total + term_loss
            stats.update(term_stats)
        self._last_stats = {"loss": total, **stats}
        return stats

    def beside(self, term: LossTerm) -> bool:
        """Take ``term``, one term of the loss being computed, to run its forward and backward on the
        side thread while the loss function computes the rest; False (the loss adds the term itself)
        unless the learner was made with ``side_thread``.

        The term's gradient must reach only parameters that no other term of the loss reaches, and
        it must not draw from torch's global random generator (the order of draws between two
        threads is not fixed): then the optimizer takes the same step as for the summed loss.
        :meth:`compute_gradients` waits for the term after the rest's backward pass, adds its value
        to the reported ``loss`` and its stats to the update's."""
        if not self.side_thread:
            return False
        if self._side is None:
            self._side = ThreadPoolExecutor(1, thread_name_prefix="shoal-learner-side")
        self._beside.append(self._side.submit(_forward_backward, term))
        return True

    def reduce_gradients(self) -> None:
        """Hook for data-parallel learners (all-reduce); a single learner has nothing to do."""

    def apply_gradients(self) -> torch.Tensor | None:
        """Clip, step the optimizer, then run the post-update hooks with ``last_batch_rows``.

        An update whose gradient norm is NaN or inf (a non-finite loss, or weights an earlier
        update overflowed, give one) is skipped before it reaches the weights and counted in
        ``num_nonfinite_skipped``; ``max_nonfinite_updates`` of them in a row, or non-finite
        weights, raise :class:`~shoal.errors.DivergenceError`. The check costs one host sync
        per update.
        """
        if self.grad_clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if not bool(torch.isfinite(norm)):
            self._skip_nonfinite(norm)
            return norm if self.grad_clip is not None else None
        self._nonfinite_in_a_row = 0
        self.optimizer.step()
        self.num_updates += 1
        for hook in self.post_update_hooks:
            hook(self.last_batch_rows)
        return norm if self.grad_clip is not None else None

    def _skip_nonfinite(self, norm: torch.Tensor) -> None:
        """Drop this update's gradients and count it; raise once the run of them reaches the limit, or at
        once when the weights themselves are NaN/inf (an earlier update overflowed them: nothing to wait for)."""
        self.optimizer.zero_grad(set_to_none=True)
        max_weight = torch.nn.utils.get_total_norm([p.detach() for p in self.params], norm_type=math.inf)
        if not math.isfinite(float(max_weight)):
            raise DivergenceError(
                f"the weights hold NaN or inf after learner update {self.num_updates}: an update overflowed "
                f"(learning rate {self.lr:g}). Likely causes: a learning rate far too high, or rewards or "
                "observations of a huge scale; lower lr (or set grad_clip) and check the env's values."
            )
        self.num_nonfinite_skipped += 1
        self._nonfinite_in_a_row += 1
        if self._nonfinite_in_a_row >= self.max_nonfinite_updates:
            raise DivergenceError(
                f"{self._nonfinite_in_a_row} learner updates in a row had a non-finite loss or gradient "
                f"({describe_nonfinite(self._last_stats, norm)}) and were skipped, so the weights are those of "
                f"learner update {self.num_updates}, the last finite one. Likely causes: a learning rate too high "
                f"(lr {self.lr:g}), NaN or inf in observations or rewards, or a loss that divides by zero. "
                f"max_nonfinite_updates={self.max_nonfinite_updates} sets how many in a row stop the run."
            )

    @property
    def last_stats(self) -> dict:
        """The loss terms of the latest minibatch (tensors), e.g. for a post-update hook."""
        return self._last_stats

    def add_post_update_hook(self, hook: Callable[[int], Any]) -> None:
        """Call ``hook(rows)`` after every optimizer step, in the thread that learns (e.g.
        :meth:`TargetNetwork.post_update <shoal.learn.target.TargetNetwork.post_update>`)."""
        self.post_update_hooks.append(hook)

    def update_minibatch(self, batch: dict) -> dict:
        stats = self.compute_gradients(batch)
        self.reduce_gradients()
        norm = self.apply_gradients()
        if norm is not None:
            stats["grad_norm"] = norm
        return stats

    def update(
        self,
        batch: Batch,
        num_epochs: int,
        minibatch_size: int,
        rng: np.random.Generator,
        num_minibatches: int | None = None,
        sequence_length: int = 1,
        on_epoch: Callable[[dict[str, float]], Any] | None = None,
    ) -> dict[str, float]:
        """``num_epochs`` passes of shuffled minibatch SGD over ``batch``; mean stats.

        ``num_minibatches`` fixes how many (near-equal) minibatches each epoch has, whatever
        ``len(batch)``: data-parallel replicas must take the same number of steps.
        ``sequence_length``: see :func:`minibatch_indices`. ``on_epoch(stats)`` is called after
        each epoch with that epoch's mean stats (e.g. to adapt the learning rate to its KL).
        """
        tensors = batch.to_torch(self.device)
        acc = StatsMean()
        self.module.train()
        for _ in range(num_epochs):
            epoch = StatsMean() if on_epoch is not None else None
            for idx in minibatch_indices(len(batch), minibatch_size, rng, num_minibatches, sequence_length):
                mb = tensors if idx is None else {k: v[idx.to(self.device)] for k, v in tensors.items()}
                stats = self.update_minibatch(mb)
                acc.add(stats)
                if epoch is not None:
                    epoch.add(stats)
            if on_epoch is not None and epoch is not None:
                on_epoch(epoch.mean())
        self.module.eval()
        out = acc.mean()
        out["lr"] = self.lr
        out.update(self.schedule_stats())
        return out

    def schedule_stats(self) -> dict[str, float]:
        """The current value of each scheduled loss field (``entropy_coeff``), for the results."""
        return {k: float(getattr(self.loss_fn, k)) for k in self.loss_schedules}

    # ---- weights and state -------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.module)

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.module, weights)

    def get_state(self) -> dict[str, Any]:
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "extra": dict(self.extra_state),
            "num_updates": self.num_updates,
            "num_nonfinite_skipped": self.num_nonfinite_skipped,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.extra_state = dict(state.get("extra", {}))
        self.num_updates = int(state.get("num_updates", 0))
        self.num_nonfinite_skipped = int(state.get("num_nonfinite_skipped", 0))
