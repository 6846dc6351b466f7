"""Who plays which seat in a multi-agent game: the episode a mapping sees (:class:`EpisodeInfo`),
matchmaking data (:class:`MatchSampler`) or a mapping function, and a finished game's record
(:func:`match_outcome`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shoal.errors import ConfigError
from shoal.league.builder import MatchResult


# ---- episodes and matchmaking -----------------------------------------------------------------
@dataclass
class EpisodeInfo:
    """What a mapping function sees (``episode``), and what the runner tracks per game."""

    id: int
    env_index: int
    worker_index: int
    agents: list[str]
    policies: dict[str, str] = field(default_factory=dict)  # agent -> policy id, fixed for the episode
    match_type: str | None = None
    user_data: dict[str, Any] = field(default_factory=dict)  # free for mapping functions
    returns: dict[str, float] = field(default_factory=dict)
    length: int = 0  # env steps


class MatchSampler:
    """Draws each new episode's seat -> policy mapping from matchmaking data (which policies
    play, with which probabilities: plain data, picklable, sent with the weights).

    Accepted forms (``data``):

    * ``{"matches": [{"policies": ["main", "main_v1"], "prob": 0.5, "match_type": "vs_snapshot"}, ...],
      "shuffle_seats": True}`` or just the list. ``policies`` is a list in seat order
      (``possible_agents``), shuffled per episode when ``shuffle_seats`` (default) so each side
      plays first half the time; or a dict ``{agent: policy_id}`` (seats kept). One policy id
      alone plays every seat. ``prob`` values are weights (normalised); ``match_type`` is optional.
    * an object with ``to_matches()`` returning one of the above (e.g. the league's
      :class:`shoal.league.Matchmaking`).
    """

    def __init__(self, data: Any) -> None:
        if hasattr(data, "to_matches"):
            data = data.to_matches()
        shuffle = True
        if isinstance(data, Mapping):
            if "matches" not in data:
                raise ConfigError(f"matchmaking data needs a 'matches' list, got keys {sorted(data)}")
            shuffle = bool(data.get("shuffle_seats", True))
            data = data["matches"]
        entries = list(data)
        if not entries:
            raise ConfigError("matchmaking data has no matches")
        self.shuffle_seats = shuffle
        self.entries: list[tuple[Any, str | None]] = []
        probs = []
        for e in entries:
            if not isinstance(e, Mapping) or "policies" not in e:
                raise ConfigError(
                    f"each matchmaking entry needs 'policies' (and optional 'prob', 'match_type'), got {e!r}"
                )
            pol = e["policies"]
            pol = dict(pol) if isinstance(pol, Mapping) else ([pol] if isinstance(pol, str) else list(pol))
            self.entries.append((pol, e.get("match_type")))
            probs.append(float(e.get("prob", 1.0)))
        p = np.asarray(probs)
        if (p < 0).any() or p.sum() <= 0:
            raise ConfigError(f"matchmaking probabilities must be >= 0 and not all 0, got {probs}")
        self.probs = p / p.sum()

    def policy_ids(self) -> set[str]:
        out: set[str] = set()
        for pol, _ in self.entries:
            out.update(pol.values() if isinstance(pol, dict) else pol)
        return out

    def check(self, agents: list[str]) -> None:
        for pol, _ in self.entries:
            if isinstance(pol, dict):
                if set(pol) != set(agents):
                    raise ConfigError(f"matchmaking seats {sorted(pol)} are not the env's agents {agents}")
            elif len(pol) not in (1, len(agents)):
                raise ConfigError(
                    f"matchmaking entry {pol} names {len(pol)} policies for {len(agents)} agents "
                    "(give one per agent, or one for all)"
                )

    def assign(self, episode: EpisodeInfo, rng: np.random.Generator) -> tuple[dict[str, str], str | None]:
        pol, match_type = self.entries[int(rng.choice(len(self.entries), p=self.probs))]
        agents = episode.agents
        if isinstance(pol, dict):
            return dict(pol), match_type
        if len(pol) == 1:
            return {a: pol[0] for a in agents}, match_type
        order = rng.permutation(len(pol)) if self.shuffle_seats else range(len(pol))
        return {a: pol[j] for a, j in zip(agents, order)}, match_type


class _FnMapping:
    """A ``policy_mapping_fn(agent_id, episode) -> policy_id``, called once per agent when an episode starts."""

    def __init__(self, fn: Callable[[str, EpisodeInfo], str]) -> None:
        self.fn = fn

    def assign(self, episode: EpisodeInfo, rng: np.random.Generator) -> tuple[dict[str, str], str | None]:
        return {a: self.fn(a, episode) for a in episode.agents}, episode.user_data.get("match_type")


def match_outcome(episode: EpisodeInfo) -> MatchResult:
    """Per-match record: ``policies`` in seat order, ``winner`` a policy id (None on a draw)."""
    agents = episode.agents
    rets = {a: float(episode.returns.get(a, 0.0)) for a in agents}
    best = max(rets.values())
    top = [a for a in agents if rets[a] == best]
    winner_agent = top[0] if len(top) == 1 else None
    return MatchResult(
        policies=tuple(episode.policies[a] for a in agents),
        winner=episode.policies[winner_agent] if winner_agent else None,
        match_type=episode.match_type,
        agents=dict(episode.policies),
        returns=rets,
        winner_agent=winner_agent,
        length=episode.length,
        episode_id=episode.id,
        worker_index=episode.worker_index,
    )


__all__ = ["EpisodeInfo", "MatchSampler", "match_outcome"]
