"""Which code a saved config may make shoal import, and when shoal imports it.

A config names code by import path: ``env: "my_pkg.envs:make_maze"``, ``model.custom``,
``callbacks``, ``multi_agent.policy_mapping``, a league builder. Training from a config you
wrote imports that code, as you asked. A checkpoint records the same config in its
``meta.json``; rebuilding the run from it (``shoal evaluate``, ``export``, ``resume``,
:func:`shoal.load_policy`) would import whatever that file names and call it with the
arguments it names, so a run directory from somewhere else could run any command. shoal
therefore imports a path recorded in a checkpoint only when one of these holds:

- it names something shoal trusts without asking: a registered Gymnasium id (Atari ids
  included), a PettingZoo env module (``pettingzoo.classic:tictactoe_v3``), an OpenSpiel game
  (``openspiel:leduc_poker``), one of shoal's own envs, a league builder shoal names
  (``alpha_star``, as ``league`` or ``league.type``), or a model, callbacks class, mapping
  function or league builder inside shoal;
- the checkpoint carries a valid signature of this machine's user: shoal signs every
  ``meta.json`` it writes with a key kept in ``~/.config/shoal/checkpoint.key`` (HMAC-SHA256),
  so your own runs load as before;
- you give the same key again (``env=...``, ``overrides={...}``), or pass ``trust=True``
  (``--trust`` on the command line) for a run directory you know.

Otherwise loading stops with :class:`UntrustedCodeError`, naming every path it would import.
While a checkpoint is rebuilt, :func:`import_gate` also refuses any import path that was not
approved this way, so a key this module does not know about cannot slip through.

Keys that send data or control off the machine count as code too (:func:`destination_references`):
the Ray cluster a run joins (``resources.address``: a Ray driver exchanges pickled objects with its
cluster, so the cluster can run code in the driver) and the trackers its results go to
(``logging.mlflow.tracking_uri``, ``logging.wandb.mode: online``). A rebuilt algorithm would connect
where the file says, so an unsigned checkpoint naming one is refused the same way.

A key file that exists but cannot be used (a directory, unreadable, not a key) turns signing off;
shoal says so once per process with a warning, and warns of a key file other users can read.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from shoal.errors import UntrustedCodeError

SIGNATURE_KEY = "signature"
"""meta.json key of the HMAC-SHA256 (hex) of the rest of meta.json, canonical JSON."""

SHOAL_ENVS = frozenset(
    {
        "shoal.envs.memory:RememberCue",
        "shoal.envs.multi_cartpole:parallel_env",
        "shoal.envs.pixel_catch:PixelCatch",
        "shoal.envs.signal_match:parallel_env",
        "shoal.envs.stateless_cartpole:StatelessCartPole",
    }
)
"""shoal's own envs by import path: constructors with no side effects beyond building the env."""

SHOAL_LEAGUE_BUILDERS = frozenset({"alpha_star", "no_league"})

OPENSPIEL_PREFIX = "openspiel:"
"""``openspiel:<game>``: an OpenSpiel game built by shoal's own adapter (:mod:`shoal.envs.openspiel`);
nothing is imported by that name."""

LOCAL_RAY_ADDRESSES = (None, "local")
"""``resources.address`` values that start a Ray instance on this machine instead of joining one."""

log = logging.getLogger(__name__)

__all__ = [
    "UntrustedCodeError",
    "check_checkpoint_code",
    "check_import",
    "code_references",
    "destination_references",
    "import_gate",
    "key_file",
    "sign_meta",
    "signed_by_me",
    "trusted_without_asking",
]


# ---- the signing key ---------------------------------------------------------------------
def key_file() -> Path:
    """Where this user's checkpoint signing key lives: ``$SHOAL_KEY_FILE``, else
    ``$XDG_CONFIG_HOME/shoal/checkpoint.key`` (``~/.config/shoal/checkpoint.key``)."""
    explicit = os.environ.get("SHOAL_KEY_FILE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "shoal" / "checkpoint.key"


def _signing_key(create: bool) -> Optional[bytes]:
    """The key's bytes; with ``create``, a new random key is written (mode 0600) when there is none.
    None when there is no usable key (and, with ``create``, none can be written: an unwritable home);
    a key file that is there but unusable is said once per process (:func:`_warn_once`)."""
    path = key_file()
    for attempt in range(3):
        try:
            with open(path, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                data = f.read(4096).strip()
        except FileNotFoundError:  # the first run: create it below
            if not create:
                return None
        except OSError as e:
            if isinstance(e, IsADirectoryError) or path.is_dir():
                return _unusable(path, "is a directory", "remove it, or set SHOAL_KEY_FILE to a file path")
            return _unusable(
                path, f"cannot be read ({e.strerror or e})", f"make it readable (chmod 600 '{path}'), or delete it"
            )
        else:
            if not data and attempt < 2:  # another process between creating the file and writing its key
                time.sleep(0.05)
                continue
            return _parse_key(path, data, mode)
        try:  # O_EXCL: of two processes creating it at once, one writes and both then read the same key
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError as e:
            return _unusable(
                path,
                f"cannot be created ({e.strerror or e})",
                "make its folder writable, or set SHOAL_KEY_FILE to a file path you can write",
            )
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return None


def _parse_key(path: Path, data: bytes, mode: int) -> Optional[bytes]:
    """The key a key file holds (64 hex digits), or None with a warning; a warning too when
    other users may read or write the file (``mode``)."""
    try:
        key = bytes.fromhex(data.decode("ascii")) if len(data) == 64 else b""
    except (ValueError, UnicodeDecodeError):
        key = b""
    if len(key) != 32:
        return _unusable(
            path,
            f"does not hold a key ({len(data)} bytes; shoal writes 64 hexadecimal digits)",
            "restore the key from a backup, or delete the file and shoal writes a new key (checkpoints "
            "signed with the lost key then need --trust once)",
        )
    others = [what for what, bits in (("read", 0o044), ("changed", 0o022)) if mode & bits]
    if others and os.name != "nt":
        _warn_once(
            path,
            "mode",
            f"The checkpoint signing key '{path}' can be {' and '.join(others)} by other users (mode "
            f"{mode & 0o777:o}): whoever reads it can sign a crafted run directory that shoal then loads "
            f"without --trust. Make it yours alone: chmod 600 '{path}'.",
        )
    return key


def _unusable(path: Path, problem: str, remedy: str) -> Optional[bytes]:
    """None (no key), said once: signing is off, and how to turn it on again."""
    _warn_once(
        path,
        problem,
        f"Checkpoint signing is off: the key file '{path}' {problem}. The checkpoints shoal writes are "
        "unsigned, and loading or resuming a run that names your own code (an env factory, a model, "
        "callbacks) or a Ray cluster or tracker then needs --trust, your own runs included. To sign again, "
        f"{remedy}.",
    )
    return None


_warned: set[tuple[str, str]] = set()


def _warn_once(path: Path, problem: str, message: str) -> None:
    """``message`` as a warning, once per process for each key file and problem (a run signs every
    checkpoint it writes)."""
    if (str(path), problem) not in _warned:
        _warned.add((str(path), problem))
        log.warning("%s", message)


def _digest(key: bytes, meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != SIGNATURE_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def sign_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with this user's signature added (unchanged when no key can be had)."""
    key = _signing_key(create=True)
    if key is None:
        return meta
    return {**{k: v for k, v in meta.items() if k != SIGNATURE_KEY}, SIGNATURE_KEY: _digest(key, meta)}


def signed_by_me(meta: dict[str, Any]) -> bool:
    """Whether ``meta`` carries a valid signature made with this user's key."""
    sig = meta.get(SIGNATURE_KEY)
    key = _signing_key(create=False)
    return isinstance(sig, str) and key is not None and hmac.compare_digest(sig, _digest(key, meta))


# ---- the import paths a config names ------------------------------------------------------
def code_references(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(dotted key, import path)`` for every value of ``config`` (a config dict) that shoal
    would import: the env, every ``model.custom`` at any depth, ``callbacks``,
    ``multi_agent.policy_mapping`` and the league builder. Values that are not strings (a callable
    given in Python, a dict mapping) import nothing and are left out."""
    refs: list[tuple[str, str]] = []
    if isinstance(config.get("env"), str):
        refs.append(("env", config["env"]))
    if isinstance(config.get("callbacks"), str):
        refs.append(("callbacks", config["callbacks"]))
    league = config.get("league")
    if isinstance(league, dict):
        league = league.get("type")
        if isinstance(league, str):
            refs.append(("league.type", league))
    elif isinstance(league, str):
        refs.append(("league", league))
    ma = config.get("multi_agent")
    if isinstance(ma, dict) and isinstance(ma.get("policy_mapping"), str):
        refs.append(("multi_agent.policy_mapping", ma["policy_mapping"]))

    def models(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if k == "model" and isinstance(v, dict) and isinstance(v.get("custom"), str):
                refs.append((f"{key}.custom", v["custom"]))
            models(v, key)

    models(config, "")
    return refs


def destination_references(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(dotted key, value)`` for every value of ``config`` (a config dict) that sends data or
    control off this machine or out of the run directory:

    - ``resources.address`` other than None or ``local``: a Ray cluster to join (``auto`` included:
      whatever cluster this machine finds). A Ray driver exchanges pickled objects with its cluster,
      so the cluster can run code in the driver, and it receives the run's weights and samples;
    - ``logging.mlflow.tracking_uri``: where MLflow writes the run's config and metrics (a server,
      given your ``MLFLOW_TRACKING_*`` credentials, or any path);
    - ``logging.wandb.mode`` online (and then ``logging.wandb.entity``): the run's config and metrics
      streamed to W&B, under the named entity.

    Rebuilding a checkpoint treats them as code (:func:`check_checkpoint_code`)."""
    refs: list[tuple[str, str]] = []
    res = config.get("resources")
    if isinstance(res, dict) and res.get("address") not in LOCAL_RAY_ADDRESSES:
        refs.append(("resources.address", str(res["address"])))
    logs = config.get("logging")
    if isinstance(logs, dict):
        mlflow = logs.get("mlflow")
        if isinstance(mlflow, dict) and mlflow.get("tracking_uri") is not None:
            refs.append(("logging.mlflow.tracking_uri", str(mlflow["tracking_uri"])))
        wandb = logs.get("wandb")
        if isinstance(wandb, dict) and wandb.get("mode", "offline") not in ("offline", "disabled"):
            refs.append(("logging.wandb.mode", str(wandb["mode"])))
            if wandb.get("entity") is not None:
                refs.append(("logging.wandb.entity", str(wandb["entity"])))
    return refs


DESTINATION_OVERRIDES = {
    "resources.address": "{'resources': {'address': None}}",
    "logging.mlflow.tracking_uri": "{'logging': {'mlflow': {'tracking_uri': None}}}",
    "logging.wandb.mode": "{'logging': {'wandb': {'mode': 'offline'}}}",
    "logging.wandb.entity": "{'logging': {'wandb': {'mode': 'offline'}}}",
}
"""The override that keeps each destination key on this machine, for the refusal's hint."""


def _is_openspiel(key: str, path: str) -> bool:
    return key == "env" and path.startswith(OPENSPIEL_PREFIX) and len(path) > len(OPENSPIEL_PREFIX)


def _module_of(path: str) -> str:
    return path.partition(":")[0] if ":" in path else path.rpartition(".")[0]


def _is_pettingzoo_env_module(path: str) -> bool:
    """``pettingzoo.<family>:<env>`` (or ``pettingzoo.<family>.<env>``) naming a PettingZoo env module."""
    import importlib
    import types

    if not path.startswith("pettingzoo."):
        return False
    mod, _, attr = path.partition(":") if ":" in path else (path, "", "")
    try:
        obj = importlib.import_module(mod)  # pettingzoo's own package: importing it runs only its code
        if attr:
            obj = getattr(obj, attr)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(obj, types.ModuleType) and any(callable(getattr(obj, f, None)) for f in ("env", "parallel_env"))


def trusted_without_asking(key: str, path: str) -> bool:
    """Whether import path ``path`` at config key ``key`` names something shoal trusts as it is."""
    if key == "env":
        if path in SHOAL_ENVS or _is_openspiel(key, path) or _is_pettingzoo_env_module(path):
            return True
        if ":" in path:
            return False
        import gymnasium as gym

        from shoal.gym_ids import is_ale_id

        return path in gym.envs.registry or is_ale_id(path)
    if key in ("league", "league.type") and path in SHOAL_LEAGUE_BUILDERS:
        return True
    # a class or function inside shoal: checked for its type before it is called, and called with
    # arguments that are shoal's own (spaces, agent ids), not ones read from the file
    mod = _module_of(path)
    return mod == "shoal" or mod.startswith("shoal.")


def _given(given: dict[str, Any], dotted: str) -> bool:
    node: Any = given
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_checkpoint_code(
    source: str,
    meta: dict[str, Any],
    config: dict[str, Any],
    given: dict[str, Any],
    trust: bool,
    destinations: bool = True,
) -> Optional[frozenset[str]]:
    """The import paths that rebuilding ``config`` (a checkpoint's config with the caller's
    ``given`` keys merged in) may import, for :func:`import_gate`; raises UntrustedCodeError naming
    the others, and, with ``destinations`` (the caller builds something that may connect: an
    algorithm), every key of :func:`destination_references`. None (no gate) when the checkpoint's
    ``meta`` is signed by this user, or with ``trust``.

    A path or destination is approved when ``given`` sets its key (the caller named it again), and a
    path also when shoal trusts it without asking."""
    if trust or signed_by_me(meta):
        return None
    refs = code_references(config)
    refused = [(k, p) for k, p in refs if not trusted_without_asking(k, p) and not _given(given, k)]
    elsewhere = [(k, v) for k, v in destination_references(config) if not _given(given, k)] if destinations else []
    if refused or elsewhere:
        raise UntrustedCodeError(_refusal(source, refused, elsewhere))
    # openspiel:<game> is built by shoal's adapter, never imported: a gate that saw it imported refuses it
    return frozenset(p for k, p in refs if not _is_openspiel(k, p))


def _refusal(source: str, code: list[tuple[str, str]], elsewhere: list[tuple[str, str]]) -> str:
    """One paragraph: what the checkpoint names, why shoal will not follow it, and how to go on."""
    parts = []
    if code:
        parts.append("names code to import: " + ", ".join(f"{k} '{p}'" for k, p in code))
    if elsewhere:
        parts.append("sends data or control elsewhere: " + ", ".join(f"{k} '{v}'" for k, v in elsewhere))
    does = {
        (True, False): "import code",
        (False, True): "connect to a cluster or tracker",
        (True, True): "import code, or connect to a cluster or tracker,",
    }[(bool(code), bool(elsewhere))]
    harm = (["run any command"] if code else []) + (
        ["join a Ray cluster that runs code in this process (a Ray driver exchanges pickled objects with its cluster)"]
        if any(k == "resources.address" for k, _ in elsewhere)
        else []
    )
    if any(k.startswith("logging.") for k, _ in elsewhere):
        harm.append("send the run's config and metrics (and your tracker credentials) to a server of its choosing")
    hints = (["env=make_env or overrides={'callbacks': ...}"] if code else []) + list(
        dict.fromkeys(f"overrides={DESTINATION_OVERRIDES[k]}" for k, _ in elsewhere)
    )
    return (
        f"{source} {'; and '.join(parts)}. shoal does not {does} a run directory names unless you vouch "
        "for it: this checkpoint was not signed with your key (it was written by someone else, on another "
        f"machine, or by an older shoal), and a crafted one could {', or '.join(harm)} this way. If you know "
        "where this run directory comes from, pass --trust (Python: trust=True); or give "
        f"{'the code' if not elsewhere else 'those keys'} yourself (Python: e.g. {' or '.join(hints)})."
    )


# ---- the gate around a rebuild -----------------------------------------------------------
_approved: contextvars.ContextVar[Optional[frozenset[str]]] = contextvars.ContextVar("shoal_import_gate", default=None)


@contextmanager
def import_gate(approved: Optional[frozenset[str]]) -> Iterator[None]:
    """While active (``approved`` not None), :func:`check_import` refuses import paths outside
    ``approved`` and outside what shoal trusts without asking."""
    token = _approved.set(approved)
    try:
        yield
    finally:
        _approved.reset(token)


def check_import(path: str) -> None:
    """Called before shoal imports a path a config names; raises inside an :func:`import_gate`
    that did not approve ``path``."""
    approved = _approved.get()
    if approved is None or path in approved:
        return
    mod = _module_of(path) if (":" in path or "." in path) else path
    if mod == "shoal" or mod.startswith("shoal.") or _is_pettingzoo_env_module(path):
        return
    raise UntrustedCodeError(
        f"Refused to import '{path}' while rebuilding a checkpoint: nothing vouched for it "
        "(pass --trust, or trust=True, for a run directory you know)."
    )
