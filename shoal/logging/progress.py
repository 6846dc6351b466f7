"""Live progress display: the headline metric, env steps/s, the learner's main losses, and each
stop criterion that has a target with its progress and an ETA.

On a terminal it is a rich live panel with one bar per criterion that has a target (none
otherwise: nothing is drawn against a target that does not exist). Off a terminal (CI logs,
``| tee``, ``| cat``) it prints one plain line every few seconds, built here and printed
without wrapping, so no number is ever split across lines.

ETAs come from recent rates: env steps from the env steps/s of the last few iterations,
iterations from their mean duration, training time exactly. A reward target has no ETA; its
bar runs from the first mean return seen to the target.

An estimate reads "ETA" only where its criterion is the one expected to end the run: with a
reward target beside it (which may end the run at any moment), or another criterion expected
sooner (or not estimated yet), it reads "limit in": the latest the run goes on by that
criterion, not how long it will take.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

RECENT_ITERATIONS = 5  # the window the rates behind ETAs are measured over


def _fmt(v: Any, spec: str = ",.0f") -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return "-"
    return format(v, spec)


def format_eta(seconds: Optional[float]) -> str:
    """42 -> '42s', 185 -> '3m05s', 7384 -> '2h03m'; None or not finite -> '-'."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def metric_label(key: str) -> str:
    """How a result key reads on the display: 'episode_return_mean' -> 'return',
    'league/main_win_rate_vs_frozen' -> 'main win rate vs frozen', 'learner/vf_loss' -> 'vf_loss'."""
    if key == "episode_return_mean":
        return "return"
    if key.startswith("league/"):
        return key.removeprefix("league/").replace("_", " ")
    return key.split("/")[-1]


@dataclass
class CriterionProgress:
    """One stop criterion that has a target, as the display shows it."""

    name: str  # "reward", "env steps", "time", "iterations"
    value: Optional[float]
    target: float
    fraction: float  # of the way to the target, 0..1
    eta_s: Optional[float]  # None: no estimate (reward, or no rate measured yet)
    spec: str = ",.0f"
    eta_label: str = "ETA"  # "limit in" where another criterion may end the run sooner

    def text(self) -> str:
        unit = " s" if self.name == "time" else ""
        pct = f" {self.fraction:4.0%}"
        eta = f" {self.eta_label} {format_eta(self.eta_s)}" if self.name != "reward" else ""
        return f"{_fmt(self.value, self.spec)}/{_fmt(self.target, self.spec)}{unit}{pct}{eta}"


class RecentRates:
    """Env steps/s and seconds per iteration over the last few results (training time, so a
    resumed run's rates are not diluted by the time it was stopped)."""

    def __init__(self, window: int = RECENT_ITERATIONS) -> None:
        self.points: deque[tuple[float, float, float]] = deque(maxlen=window + 1)

    def add(self, r: dict[str, Any]) -> None:
        self.points.append(
            (float(r.get("time_total_s", 0.0)), float(r.get("env_steps_sampled", 0)), float(r.get("iteration", 0)))
        )

    def steps_per_s(self, r: dict[str, Any]) -> Optional[float]:
        if len(self.points) >= 2:
            (t0, s0, _), (t1, s1, _) = self.points[0], self.points[-1]
            return (s1 - s0) / (t1 - t0) if t1 > t0 else None
        return r.get("env_steps_per_s") or None

    def s_per_iteration(self, r: dict[str, Any]) -> Optional[float]:
        if len(self.points) >= 2:
            (t0, _, i0), (t1, _, i1) = self.points[0], self.points[-1]
            return (t1 - t0) / (i1 - i0) if i1 > i0 else None
        return r.get("time_this_iter_s")


def _eta(remaining: float, rate: Optional[float]) -> Optional[float]:
    if remaining <= 0:
        return 0.0
    return remaining / rate if rate and rate > 0 else None


def _label_limits(criteria: list[CriterionProgress]) -> list[CriterionProgress]:
    """An estimate stays "ETA" only where no other criterion may end the run sooner: none has a
    reward target (met whenever the return gets there) and every other estimate is known and no
    sooner. Else it is "limit in": the run goes on at most that long by this criterion."""
    for c in criteria:
        others = [o for o in criteria if o is not c]
        sooner = any(o.name == "reward" or o.eta_s is None or c.eta_s is None or o.eta_s < c.eta_s for o in others)
        c.eta_label = "limit in" if sooner else "ETA"
    return criteria


def _fraction(value: float, start: float, target: float) -> float:
    if target <= start:
        return 1.0 if value >= target else 0.0
    return min(1.0, max(0.0, (value - start) / (target - start)))


class ProgressDisplay:
    """Shows each result of a training loop (``update``), live on a terminal, as lines elsewhere.

    ``best_metric`` is the headline (the algorithm's ``best_metric``: the mean return, or a
    league's main win rate); ``metrics`` are ``(result key, label)`` pairs of the learner's main
    figures (``Algorithm.display_metrics()``). ``headline_every``: the headline comes only every
    that many iterations (an evaluation's figure, e.g. a league's exploitability); until the first
    it reads ``pending (iter 10, ~42s)``, and between two the last value shows with its iteration.
    """

    def __init__(
        self,
        title: str,
        stop,
        console: Console | None = None,
        enabled: bool = True,
        plain_every_s: float = 5.0,
        best_metric: str = "episode_return_mean",
        metrics: Sequence[tuple[str, str]] = (),
        headline_every: Optional[int] = None,
        steps_label: str = "env steps",
        resumed_from: Optional[dict[str, Any]] = None,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.steps_label = steps_label  # "agent steps" for Atari, whose preset comments count frames
        # a resumed run's figures where it resumes (its checkpoint's counters, "best" so far, and
        # "first_return": the run's first mean return, where the reward bar starts): shown until
        # the first result
        self.resumed_from = resumed_from
        self.headline_every = headline_every
        self.last_headline: Optional[tuple[float, int]] = None  # the headline's latest value and its iteration
        self.stop = stop
        self.best_metric = best_metric
        self.metrics = list(metrics)
        self.title = title
        self.enabled = enabled
        self.live_mode = enabled and self.console.is_terminal
        self.plain_every_s = plain_every_s
        self.rates = RecentRates()
        self.first_return: Optional[float] = (resumed_from or {}).get("first_return")
        self._last_plain = -math.inf
        self._unprinted: Optional[str] = None  # off a terminal: the latest line the interval held back
        self._live: Live | None = None

    def __enter__(self):
        if self.live_mode:
            start = self.resumed_from
            first = self.renderable(start, start.get("best")) if start else Text(self.title, style="bold")
            self._live = Live(first, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        elif self.enabled:
            self.console.print(self.title, soft_wrap=True, highlight=False, markup=False)
        return self

    def __exit__(self, *exc) -> None:
        if self._unprinted is not None:  # the last result is always shown
            self.console.print(self._unprinted, soft_wrap=True, highlight=False, markup=False)
            self._unprinted = None
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    # ---- what is shown ------------------------------------------------------------------
    def observe(self, r: dict[str, Any]) -> None:
        """Take result ``r`` into the recent rates and the reward bar's start."""
        self.rates.add(r)
        ret = r.get("episode_return_mean")
        if self.first_return is None and isinstance(ret, (int, float)) and math.isfinite(ret):
            self.first_return = float(ret)
        value = r.get(self.best_metric)
        if _fmt(value) != "-":
            self.last_headline = (float(value), int(r.get("iteration", 0)))

    def headline(self, r: dict[str, Any]) -> str:
        """The headline's value in ``r``; else its last value with the iteration it came from; else,
        for a figure reported every ``headline_every`` iterations, when the next one comes."""
        value = r.get(self.best_metric)
        if _fmt(value) != "-" or (self.last_headline is None and not self.headline_every):
            return _fmt(value, ".4g")
        if self.last_headline is not None:
            v, it = self.last_headline
            return f"{_fmt(v, '.4g')} (iter {it})"
        it, every = int(r.get("iteration", 0)), int(self.headline_every or 1)
        due = (it // every + 1) * every
        per_it = self.rates.s_per_iteration(r)
        eta = f", ~{format_eta((due - it) * per_it)}" if per_it else ""
        return f"pending (iter {due}{eta})"

    def criteria(self, r: dict[str, Any]) -> list[CriterionProgress]:
        """Progress and ETA of every stop criterion that has a target, in the Stop's order; an
        estimate another criterion may beat reads "limit in" (see :func:`_label_limits`)."""
        stop, out = self.stop, []
        if stop.reward is not None:
            ret = r.get("episode_return_mean")
            ok = isinstance(ret, (int, float)) and math.isfinite(ret)
            start = self.first_return if self.first_return is not None else 0.0
            out.append(
                CriterionProgress(
                    "reward",
                    ret if ok else None,
                    stop.reward,
                    _fraction(ret, start, stop.reward) if ok else 0.0,
                    None,
                    ",.1f",
                )
            )
        if stop.env_steps is not None:
            steps = r.get("env_steps_sampled", 0)
            out.append(
                CriterionProgress(
                    self.steps_label,
                    steps,
                    stop.env_steps,
                    _fraction(steps, 0, stop.env_steps),
                    _eta(stop.env_steps - steps, self.rates.steps_per_s(r)),
                )
            )
        if stop.time_s is not None:
            t = r.get("time_total_s", 0.0)
            out.append(
                CriterionProgress(
                    "time", t, stop.time_s, _fraction(t, 0, stop.time_s), max(0.0, stop.time_s - t), ",.1f"
                )
            )
        if stop.iterations is not None:
            it = r.get("iteration", 0)
            per_it = self.rates.s_per_iteration(r)
            out.append(
                CriterionProgress(
                    "iterations",
                    it,
                    stop.iterations,
                    _fraction(it, 0, stop.iterations),
                    _eta(stop.iterations - it, 1 / per_it if per_it else None),
                )
            )
        return _label_limits(out)

    def figures(self, r: dict[str, Any], best: Optional[float]) -> list[tuple[str, str]]:
        """``(label, value)`` pairs of the status: iteration, headline, its best, steps/s, episodes."""
        headline = metric_label(self.best_metric)
        out = [
            ("iter", _fmt(r.get("iteration", 0))),
            (headline, self.headline(r)),
            (f"best {headline}", _fmt(best, ".4g")),
            (
                "steps/s" if self.steps_label == "env steps" else f"{self.steps_label}/s",
                _fmt(self.rates.steps_per_s(r) or r.get("env_steps_per_s")),
            ),
            ("episodes", _fmt(r.get("episodes_total", 0))),
        ]
        if r.get("num_worker_restarts"):
            out.append(("restarts", _fmt(r["num_worker_restarts"])))
        if r.get("num_worker_timeouts"):  # of those restarts, the actors that hung
            out.append(("timeouts", _fmt(r["num_worker_timeouts"])))
        return out

    def learner_figures(self, r: dict[str, Any]) -> list[tuple[str, str]]:
        return [(label, _fmt(r.get(key), ".4g")) for key, label in self.metrics]

    def plain_line(self, r: dict[str, Any], best: Optional[float] = None) -> str:
        """The whole status as one line: figures, then each criterion's progress and ETA."""
        parts = [f"{label} {value}" for label, value in self.figures(r, best) + self.learner_figures(r)]
        parts += [f"{c.name} {c.text()}" for c in self.criteria(r)]
        return "  ".join(parts)

    def renderable(self, r: dict[str, Any], best: Optional[float] = None) -> Group:
        """The live panel: title, one bar per criterion with a target, the figures."""
        rows = []
        crit = self.criteria(r)
        if crit:
            table = Table.grid(padding=(0, 1))
            for c in crit:
                table.add_row(
                    Text(f"{c.name:>10}"), ProgressBar(total=1.0, completed=c.fraction, width=36), Text(c.text())
                )
            rows.append(table)
        for figures in (self.figures(r, best), self.learner_figures(r)):
            if figures:
                rows.append(Text("  |  ".join(f"{label} {value}" for label, value in figures)))
        return Group(Text(self.title, style="bold"), *rows)

    def update(self, r: dict[str, Any], wall_s: float = 0.0, best: float | None = None) -> None:
        """Show result ``r``; ``best`` is the best value of ``best_metric`` so far (None or NaN: none yet)."""
        if not self.enabled:
            return
        self.observe(r)
        if self._live is not None:
            self._live.update(self.renderable(r, best))
            return
        line, now = self.plain_line(r, best), time.monotonic()
        if now - self._last_plain >= self.plain_every_s:
            self._last_plain, self._unprinted = now, None
            self.console.print(line, soft_wrap=True, highlight=False, markup=False)
        else:
            self._unprinted = line
