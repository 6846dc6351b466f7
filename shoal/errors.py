"""User-facing errors. Each carries one paragraph that says what was wrong and what is allowed.

The CLI prints these without a traceback and exits with code 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations


class ShoalError(Exception):
    """Base class of errors caused by the user's input, not by a bug in shoal."""


class ConfigError(ShoalError, ValueError):
    """An unknown key, a wrong type or an impossible combination in a config."""


class EnvError(ShoalError):
    """An environment id that does not exist, or an env that cannot be built."""


class CheckpointError(ShoalError):
    """A checkpoint path that does not exist or does not hold a shoal checkpoint."""


class UntrustedCodeError(CheckpointError):
    """A checkpoint's config names code to import (an env factory, a model, callbacks) that nobody
    vouched for: the checkpoint is not signed with your key, and neither ``--trust`` (``trust=True``)
    nor the same key given again says to import it. See :mod:`shoal.trust`."""


class RunDirectoryError(ShoalError):
    """The run directory cannot be written: the disk is full or read-only, or the permissions refuse it."""


class RayLostError(ShoalError):
    """The local Ray instance a run started died under it (its raylet was killed)."""


class ResourceError(ShoalError):
    """The cluster cannot supply the CPUs/GPUs the config asks for."""


class NodeResourceError(ResourceError):
    """Actors pinned to one node need more than that node has, however large the cluster."""


class WorkerError(ShoalError):
    """A rollout actor kept failing past the allowed number of restarts."""


class ActorLostError(RuntimeError):
    """A call to another actor failed because that actor died (raised by the runtime's waiting
    proxies). Not a user error: the caller reports it so its owner can recreate the actor."""


class DivergenceError(ShoalError):
    """Training diverged: updates kept having a non-finite (NaN or inf) loss or gradient, or an
    update left the weights non-finite. The skipped updates never reached the weights."""

    def __init__(self, message: str, iteration: int | None = None) -> None:
        super().__init__(message)
        self.message, self.iteration = message, iteration

    def at_iteration(self, iteration: int) -> "DivergenceError":
        """This error, told the training iteration it happened in (once)."""
        if self.iteration is None:
            self.iteration = iteration
            self.args = (f"Training diverged in iteration {iteration}: {self.message}",)
        return self


class EnvFailureError(EnvError):
    """An env kept raising in ``step`` or ``reset`` after being recreated (``max_env_failures``)."""


class NonFiniteEnvError(EnvError):
    """An env returned a NaN or inf observation or reward."""
