"""Starting or connecting to Ray, resource checks and placement groups."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from shoal.errors import NodeResourceError, ResourceError
from shoal.runtime import signals

WORKING_DIR_VAR = "SHOAL_DRIVER_CWD"


def append_working_dir() -> None:
    """Ray worker setup hook: the driver's working directory goes last on ``sys.path``, so a module
    there (``my_envs.py``) imports, but a ``gymnasium.py`` or ``torch.py`` there shadows nothing.
    Ray itself puts it first (its job config's driver paths); this moves it to the end."""
    import sys

    cwd = os.environ.get(WORKING_DIR_VAR)
    if cwd:
        sys.path[:] = [p for p in sys.path if p != cwd] + [cwd]
        try:
            os.chdir(cwd)  # relative paths in envs resolve as in the driver
        except OSError:
            pass  # another node without that directory: stay where Ray started the worker


_empty_dirs: list[str] = []


@contextlib.contextmanager
def _neutral_working_dir():
    """ray.init in a new empty private directory: Ray puts the driver's working directory FIRST on
    every worker's sys.path (its job config's driver paths), where a torch.py or gymnasium.py there
    would shadow the installed package. It puts this empty one there instead, and
    :func:`append_working_dir` adds the real one last. The directory stays while Ray runs (its
    processes start in it) and goes at :func:`shutdown`."""
    import tempfile

    cwd = os.getcwd()
    _empty_dirs.append(tempfile.mkdtemp(prefix="shoal-ray-"))
    try:
        os.chdir(_empty_dirs[-1])
        yield
    finally:
        os.chdir(cwd)


@contextlib.contextmanager
def _quiet_local_auth_note(local: bool):
    """A new local instance: Ray's warning that it turned token authentication on by default is
    about its own default, not something the user asked for or can act on here; it is held back."""
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    if local:
        auth_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        auth_log.setLevel(level)


def start(address: str | None = None, num_cpus: int | None = None, **kwargs) -> None:
    """Start a quiet local Ray instance (no dashboard), or connect to ``address``. Idempotent."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Workers inherit this: one torch/BLAS thread each unless the config says otherwise.
    env_vars = {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "RAY_USAGE_STATS_ENABLED": "0",
        WORKING_DIR_VAR: os.getcwd(),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        init_kwargs = dict(
            # "local" always starts a fresh instance: with None, Ray would join whatever cluster was
            # started last on this machine (another user's, or a test's simulated one).
            address=address or "local",
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=True,
            # 'module:Class' envs and models from the driver's working directory import in every actor:
            # appended to sys.path (not PYTHONPATH, which would put it before the installed packages)
            runtime_env={"env_vars": env_vars, "worker_process_setup_hook": "shoal.runtime.cluster.append_working_dir"},
            ignore_reinit_error=True,
        )
        if address is None and num_cpus is not None:
            init_kwargs["num_cpus"] = num_cpus
        init_kwargs.update(kwargs)
        check_reachable(address)
        global _watchdog
        watchdog = None
        if address is None:  # our own Ray: it must not outlive this process, even one killed inside ray.init
            from shoal.runtime.watchdog import start_watchdog

            watchdog = _watchdog = start_watchdog()
        try:
            with _neutral_working_dir(), _quiet_local_auth_note(address is None), signals.sigint_held():
                ray.init(**init_kwargs)
        except ConnectionError as e:
            raise ResourceError(f"Cannot connect to the Ray cluster at '{address}': {e}") from None
        finally:
            if watchdog is not None:
                from shoal.runtime.watchdog import adoption_done

                adoption_done(watchdog)
    if address is None:
        _watch_raylet()


_shutting_down = threading.Event()
_raylet = None  # psutil.Process of the local raylet this process started, while it runs
_raylet_gcs = None  # the GCS address of that Ray instance
WATCH_PERIOD_S = 0.02  # how often the raylet watch looks (reading /proc/PID/stat: ~20 us)
PF_EXITING = 0x4  # Linux task flag, set as soon as a process starts to exit (before its sockets close)


def _alive(process) -> bool:
    """Whether a psutil.Process still runs: not exited, not a zombie and, on Linux, not already
    exiting. A SIGKILLed raylet tears down its object-store mapping before its sockets close; a
    call into Ray in that window ends this process, so "exiting" must count as gone."""
    import psutil

    try:
        with open(f"/proc/{process.pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # after the command name, which may hold spaces
        return fields[0] not in (b"Z", b"X", b"x") and not int(fields[6]) & PF_EXITING
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): the status alone
        pass
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def check_raylet() -> None:
    """Raise :class:`~shoal.runtime.signals.RayletDied` if the local raylet this process started is
    gone. Called before each object-store write and request: with the raylet gone, Ray ends the
    whole process (exit 1, no message) inside such a call, before anything could be saved."""
    raylet = _raylet
    if raylet is None or _shutting_down.is_set():
        return
    if not ray.is_initialized() or ray.get_runtime_context().gcs_address != _raylet_gcs:
        return  # that Ray instance was shut down some other way; this is another one
    if not _alive(raylet) and signals.note_raylet_lost():
        raise signals.RayletDied()


def _watch_raylet() -> None:
    """A daemon thread that interrupts the main thread (KeyboardInterrupt, as Ctrl-C does) when the
    local raylet dies: the training loop then saves and stops with a message saying so, instead of
    the process ending with Ray's bare exit code 1 a few seconds later."""
    import _thread

    import psutil

    raylets = [p for p in psutil.Process().children() if p.name() == "raylet"]
    if not raylets:
        return
    raylet = raylets[0]
    signals.RAYLET_LOST.clear()
    global _raylet, _raylet_gcs
    _raylet, _raylet_gcs = raylet, ray.get_runtime_context().gcs_address
    _condense_raylet_death_dump()

    def watch() -> None:
        while ray.is_initialized() and not _shutting_down.is_set():
            if not _alive(raylet):
                if ray.is_initialized() and not _shutting_down.is_set() and signals.note_raylet_lost():
                    _thread.interrupt_main()  # not a shutdown in progress, and not already seen
                return
            time.sleep(WATCH_PERIOD_S)

    threading.Thread(target=watch, name="shoal-raylet-watch", daemon=True).start()


RAYLET_DEATH_DUMP = "Raylet is terminated."  # how Ray's report of a raylet that died begins
_raylet_death: dict = {"log": None, "shown": False}  # the local raylet's log; whether its death was shown


def _condense_raylet_death_dump() -> None:
    """Ray's report of a local raylet that died unexpectedly (published by its two agents, each
    with the last 20 lines of the raylet's log: 42 lines of state dump before shoal's paragraph)
    prints as one line that says where that log is. Anything else Ray prints (the actors' output,
    other errors) passes as it was; a remote cluster's reports too (their log is on another node)."""
    import ray._private.worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    try:
        logs = node.get_logs_dir_path() if node is not None else None
    except Exception:  # noqa: BLE001 - a Ray without it: the line says less
        logs = None
    _raylet_death.update(log=os.path.join(logs, "raylet.out") if logs else "Ray's session logs", shown=False)
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_shoal_condensed", False):
        return

    def print_to_stdstream(data, ignore_prefix):
        lines = data.get("lines") if isinstance(data, dict) else None
        if (
            lines
            and _raylet is not None
            and data.get("pid") == "raylet"
            and str(lines[0]).startswith(RAYLET_DEATH_DUMP)
        ):
            if _raylet_death["shown"]:  # the second agent's copy
                return None
            _raylet_death["shown"] = True
            data = {**data, "lines": [f"Raylet is terminated; its last log lines are in {_raylet_death['log']}"]}
        return original(data, ignore_prefix)

    print_to_stdstream._shoal_condensed = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream


_watchdog = None  # the watchdog process of the local Ray instance this process started


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """ResourceError within ``timeout_s`` when a 'host:port' or 'ray://host:port' address takes no TCP
    connection: Ray itself retries an unreachable GCS address for minutes before giving up."""
    if not address or address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ResourceError(
            f"Ray address '{address}' is not 'auto', 'host:port' or 'ray://host:port' (resources.address, --address)."
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ResourceError(
            f"Cannot connect to the Ray cluster at '{address}': nothing accepts connections at "
            f"{host}:{port} ({e.strerror or e}). Start the cluster (`ray start --head` prints its "
            "address), check the host and port, or leave resources.address out to start a local "
            "Ray instance."
        ) from None


def shutdown() -> None:
    global _raylet
    if ray.is_initialized():
        _shutting_down.set()
        try:
            ray.shutdown()
        finally:
            _raylet = None
            _shutting_down.clear()
    while _empty_dirs:
        try:
            os.rmdir(_empty_dirs.pop())
        except OSError:
            pass


def reserve(
    bundles: list[dict[str, float]],
    *,
    what: str,
    wait_s: float,
    strategy: str = "PACK",
    node_id: str | None = None,
    parts: str = "",
    selectors: list[dict[str, str]] | None = None,
    cpu_hint: str = "",
):
    """One placement group for ``bundles``; fails at once, with a clear message, if it cannot fit.

    Raises ResourceError when the cluster's total resources are too small (no waiting) or
    when the group is not granted within ``wait_s`` seconds (resources held by others).
    ``node_id`` pins every bundle to one node; ``selectors`` (one per bundle, ``{}`` for any node)
    pin single bundles (e.g. to the driver's node). ``parts`` names what the bundles are for;
    ``cpu_hint`` replaces the advice given when CPUs are short.
    """
    keep = [i for i, b in enumerate(bundles) if any(v > 0 for v in b.values())]
    bundles = [{k: v for k, v in bundles[i].items() if v > 0} for i in keep]
    if node_id is not None:
        selectors = [{"ray.io/node-id": node_id} for _ in bundles]
    elif selectors is not None:
        selectors = [selectors[i] for i in keep]
    if not bundles:
        return None
    _check_total_fits(bundles, what, parts, cpu_hint)
    for node in {s.get("ray.io/node-id") for s in selectors or []} - {None}:
        _check_node_fits([b for b, s in zip(bundles, selectors) if s.get("ray.io/node-id") == node], what, node)
    selector = {"bundle_label_selector": selectors} if selectors and any(selectors) else {}
    pg = placement_group(bundles, strategy=strategy, **selector)
    if not pg.wait(timeout_seconds=wait_s):
        remove_placement_group(pg)
        raise ResourceError(
            f"{what}: the Ray cluster did not grant {bundles} within {wait_s:g} s; other jobs may hold the resources "
            f"(available now: {ray.available_resources()}). Raise resources.resource_wait_s or free resources."
        )
    return pg


def _check_total_fits(bundles: list[dict[str, float]], what: str, parts: str, cpu_hint: str = "") -> None:
    total = ray.cluster_resources()
    for res in ("CPU", "GPU"):
        need = sum(b.get(res, 0.0) for b in bundles)
        have = total.get(res, 0.0)
        if need > have + 1e-9:
            hint = (
                " "
                + (
                    cpu_hint
                    or "Lower resources.num_workers, or share cores with e.g. --set resources.num_cpus_per_worker=0.5."
                )
                if res == "CPU"
                else " Lower resources.num_gpus."
            )
            listed = (
                f"{parts}" if parts else f"{len(bundles)} bundles: {bundles[:4]}{' ...' if len(bundles) > 4 else ''}"
            )
            raise ResourceError(
                f"{what} needs {need:g} {res}s but the Ray cluster has {have:g} in total ({listed}).{hint}"
            )


def _check_node_fits(bundles: list[dict[str, float]], what: str, node_id: str) -> None:
    """A group pinned to one node must fit that node's total resources: fail at once, not after a wait."""
    node = next((n for n in ray.nodes() if n.get("NodeID") == node_id and n.get("Alive")), None)
    if node is None:
        raise ResourceError(f"{what} are pinned to node {node_id}, which is not an alive node of this Ray cluster.")
    total = node.get("Resources", {})
    for res in ("CPU", "GPU"):
        need = sum(b.get(res, 0.0) for b in bundles)
        if need > total.get(res, 0.0) + 1e-9:
            raise NodeResourceError(
                f"{what} need {need:g} {res}s on node {node_id}, where they are pinned, but that node "
                f"has {total.get(res, 0.0):g} in total."
            )


def placement_groups_schedule(timeout_s: float = 20.0) -> bool:
    """Whether this Ray instance still places a new placement group: a tiny one, waited for up to
    ``timeout_s`` and removed.

    Removing a placement group while Ray is preparing it can leave Ray's placement-group scheduler
    stuck on it, so that no later group is placed (ray-project/ray#64693, open in the Ray this
    project pins): a Tune experiment's end removes the groups it staged, and a second experiment
    (or run) in the same Ray instance then waits forever.
    """
    pg = placement_group([{"CPU": 0.01}])
    ready = pg.wait(timeout_seconds=timeout_s)
    remove_placement_group(pg)
    return bool(ready)


def release(pg) -> None:
    if pg is not None:
        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - cluster may already be gone
            pass
