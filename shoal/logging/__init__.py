"""Metrics windows and timers, the live progress display, and result writers."""

from shoal.logging.metrics import EpisodeWindow, Timers

__all__ = ["EpisodeWindow", "Timers"]
