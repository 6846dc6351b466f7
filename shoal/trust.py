"""Which code a saved config may make shoal import, and when shoal imports it.

A config names code by import path: ``env: "my_pkg.envs:make_maze"``, ``model.custom``,
``callbacks``, ``multi_agent.policy_mapping``, a league builder. Training from a config you
wrote imports that code, as you asked. A checkpoint records the same config in its
``meta.json``; rebuilding the run from it (``shoal evaluate``, ``export``, ``resume``,
:func:`shoal.load_policy`) would import whatever that file names and call it with the
arguments it names, so a run directory from somewhere else could run any command. shoal
therefore imports a path recorded in a checkpoint only when one of these holds:

- it names something shoal trusts without asking: a registered Gymnasium id (Atari ids
  included), a PettingZoo env module (``pettingzoo.classic:tictactoe_v3``), one of shoal's
  own envs, or a model, callbacks class, mapping function or league builder inside shoal;
- the checkpoint carries a valid signature of this machine's user: shoal signs every
  ``meta.json`` it writes with a key kept in ``~/.config/shoal/checkpoint.key`` (HMAC-SHA256),
  so your own runs load as before;
- you give the same key again (``env=...``, ``overrides={...}``), or pass ``trust=True``
  (``--trust`` on the command line) for a run directory you know.

Otherwise loading stops with :class:`UntrustedCodeError`, naming every path it would import.
While a checkpoint is rebuilt, :func:`import_gate` also refuses any import path that was not
approved this way, so a key this module does not know about cannot slip through.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import os
import secrets
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

__all__ = [
    "UntrustedCodeError",
    "check_checkpoint_code",
    "check_import",
    "code_references",
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
    None when there is no usable key (and, with ``create``, none can be written: an unwritable home)."""
    path = key_file()
    for _ in range(2):
        try:
            data = path.read_bytes().strip()
            return bytes.fromhex(data.decode("ascii")) if len(data) == 64 else None
        except FileNotFoundError:
            if not create:
                return None
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        try:  # O_EXCL: of two processes creating it at once, one writes and both then read the same key
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return None


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
        if path in SHOAL_ENVS or _is_pettingzoo_env_module(path):
            return True
        if ":" in path:
            return False
        import gymnasium as gym

        from shoal.gym_ids import is_ale_id

        return path in gym.envs.registry or is_ale_id(path)
    if key == "league" and path in SHOAL_LEAGUE_BUILDERS:
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
    source: str, meta: dict[str, Any], config: dict[str, Any], given: dict[str, Any], trust: bool
) -> Optional[frozenset[str]]:
    """The import paths that rebuilding ``config`` (a checkpoint's config with the caller's
    ``given`` keys merged in) may import, for :func:`import_gate`; raises UntrustedCodeError naming
    the others. None (no gate) when the checkpoint's ``meta`` is signed by this user, or with ``trust``.

    A path is approved when shoal trusts it without asking, or when ``given`` sets its key (the
    caller named that code again)."""
    if trust or signed_by_me(meta):
        return None
    refs = code_references(config)
    refused = [(k, p) for k, p in refs if not trusted_without_asking(k, p) and not _given(given, k)]
    if refused:
        names = ", ".join(f"{k} '{p}'" for k, p in refused)
        raise UntrustedCodeError(
            f"{source} names code to import: {names}. shoal does not import code a run directory names unless you "
            "vouch for it: this checkpoint was not signed with your key (it was written by someone else, on another "
            "machine, or by an older shoal), and a crafted one could run any command this way. If you know where "
            "this run directory comes from, pass --trust (Python: trust=True); or give the code yourself (Python: "
            "e.g. env=make_env or overrides={'callbacks': ...})."
        )
    return frozenset(p for _, p in refs)


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
