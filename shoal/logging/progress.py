"""Live progress display: env steps, mean return, steps/s and elapsed time against the stop criteria.

On a terminal it is a rich live panel; otherwise (CI, pipes) a plain line every few seconds.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn
from rich.text import Text


def _fmt(v: float | None, spec: str = ",.0f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, spec)


class ProgressDisplay:
    def __init__(self, title: str, stop, console: Console | None = None, enabled: bool = True, plain_every_s: float = 5.0,
                 best_metric: str = "episode_return_mean") -> None:
        self.console = console or Console(stderr=True)
        self.stop = stop
        self.best_metric = best_metric  # the result key that picks checkpoints/best; its best value is shown
        self.title = title
        self.enabled = enabled
        self.live_mode = enabled and self.console.is_terminal
        self.plain_every_s = plain_every_s
        self._last_plain = 0.0
        self._live: Live | None = None
        self.bars = Progress(TextColumn("{task.description:>12}"), BarColumn(bar_width=36),
                             TextColumn("{task.fields[text]}"), console=self.console, expand=False)
        self.tasks = {
            "steps": self.bars.add_task("env steps", total=stop.env_steps, text=""),
            "return": self.bars.add_task("mean return", total=stop.reward, text=""),
            "time": self.bars.add_task("elapsed", total=stop.time_s, text=""),
        }
        self.status = Text("starting...")

    def __enter__(self):
        if self.live_mode:
            self._live = Live(Group(Text(self.title, style="bold"), self.bars, self.status), console=self.console,
                              refresh_per_second=4, transient=False)
            self._live.__enter__()
        elif self.enabled:
            self.console.print(self.title)
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def update(self, r: dict[str, Any], wall_s: float, best: float | None = None) -> None:
        """Show result ``r``; ``best`` is the best value of ``best_metric`` so far (None or NaN: none yet)."""
        if not self.enabled:
            return
        steps, ret, t = r.get("env_steps_sampled", 0), r.get("episode_return_mean"), r.get("time_total_s", 0.0)
        sps = r.get("env_steps_per_s", 0.0)
        stop = self.stop
        self.bars.update(self.tasks["steps"], completed=steps,
                         text=f"{_fmt(steps)}" + (f" / {_fmt(stop.env_steps)}" if stop.env_steps else ""))
        ret_ok = ret is not None and math.isfinite(ret)
        self.bars.update(self.tasks["return"], completed=max(ret, 0) if ret_ok else 0,
                         text=f"{_fmt(ret, '.1f')}" + (f" / {stop.reward:g}" if stop.reward is not None else ""))
        self.bars.update(self.tasks["time"], completed=t,
                         text=f"{t:.1f} s" + (f" / {stop.time_s:g} s" if stop.time_s else ""))
        best_text = f"best {self.best_metric} {_fmt(best, '.4g')}"
        self.status = Text(f"iter {r.get('iteration', 0)}  |  {_fmt(sps)} steps/s  |  "
                           f"{r.get('episodes_total', 0):,} episodes  |  {best_text}  |  restarts {r.get('num_worker_restarts', 0)}")
        if self._live is not None:
            self._live.update(Group(Text(self.title, style="bold"), self.bars, self.status))
        else:
            now = time.monotonic()
            if now - self._last_plain >= self.plain_every_s:
                self._last_plain = now
                self.console.print(
                    f"iter {r.get('iteration', 0):>5}  steps {_fmt(steps):>11}  return {_fmt(ret, '.1f'):>7}  "
                    f"{_fmt(sps):>9} steps/s  {t:7.1f} s  {best_text}", highlight=False)
