"""Matchmaking as data: which policies meet, with which probabilities, per match type.

A league builder produces a :class:`Matchmaking`; the algorithm sends ``to_dict()`` (plain
lists, dicts, strings and floats) to the rollout actors together with the weights. An actor
picks the policies of each new episode by drawing from its flat ``"matches"`` list
(``{"policies": [home, away], "prob": p, "match_type": name}``, the form
``shoal.rollout.multi_agent.MultiAgentEnvRunner.set_matchmaking`` takes) or with
:func:`sample_match`; no closure travels.

Structure: a list of match types, each with a probability, the learning ("home") policies
that take part in it with their probabilities within the type, and for each home policy a
distribution over its opponents. ``pairs()`` flattens this to one distribution over
``(match_type, home, away)`` triples whose probabilities sum to 1.

``shuffle_seats``: when True the two policies of a sampled match are put in random seat
order (first player / second player), so every policy plays both sides of a turn-based
game equally often.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

_TOL = 1e-6


@dataclass
class MatchType:
    """One kind of match: ``homes`` (learning policy -> probability within this type) and,
    per home policy, ``opponents`` (opponent id -> probability)."""

    name: str
    prob: float
    homes: dict[str, float]
    opponents: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prob": float(self.prob),
            "homes": {k: float(v) for k, v in self.homes.items()},
            "opponents": {h: {k: float(v) for k, v in opp.items()} for h, opp in self.opponents.items()},
        }


@dataclass
class Matchmaking:
    match_types: list[MatchType] = field(default_factory=list)
    version: int = 0
    shuffle_seats: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        total = sum(t.prob for t in self.match_types)
        if self.match_types and abs(total - 1.0) > _TOL:
            raise ValueError(f"match type probabilities sum to {total}, not 1")
        for t in self.match_types:
            if t.prob < 0:
                raise ValueError(f"match type '{t.name}' has negative probability {t.prob}")
            if abs(sum(t.homes.values()) - 1.0) > _TOL:
                raise ValueError(f"home probabilities of match type '{t.name}' do not sum to 1")
            for home in t.homes:
                opp = t.opponents.get(home)
                if not opp or abs(sum(opp.values()) - 1.0) > _TOL:
                    raise ValueError(f"opponent probabilities of '{home}' in match type '{t.name}' do not sum to 1")

    # ---- views ---------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, str, str, float]]:
        """Every ``(match_type, home, away, probability)`` with a positive probability."""
        out = []
        for t in self.match_types:
            for home, ph in t.homes.items():
                for away, pa in t.opponents[home].items():
                    p = t.prob * ph * pa
                    if p > 0:
                        out.append((t.name, home, away, p))
        return out

    def match_type_probs(self) -> dict[str, float]:
        return {t.name: t.prob for t in self.match_types}

    def for_policy(self, pid: str) -> dict[str, dict[str, Any]]:
        """Per match type in which ``pid`` plays home: the probability that a match is of
        this type with ``pid`` at home, and its opponent distribution."""
        return {
            t.name: {"prob": t.prob * t.homes[pid], "opponents": dict(t.opponents[pid])}
            for t in self.match_types
            if pid in t.homes
        }

    def policy_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for _, home, away, _ in self.pairs():
            seen.setdefault(home)
            seen.setdefault(away)
        return list(seen)

    # ---- sampling ------------------------------------------------------------------
    def to_matches(self) -> dict[str, Any]:
        """The flat form alone: ``{"matches": [...], "shuffle_seats": bool}``."""
        d = self.to_dict()
        return {"matches": d["matches"], "shuffle_seats": d["shuffle_seats"]}

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        return sample_match(self.to_dict(), rng)

    # ---- plain data ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data for rollout actors: the nested form and the flat ``matches`` list."""
        return {
            "version": int(self.version),
            "shuffle_seats": bool(self.shuffle_seats),
            "match_types": [t.to_dict() for t in self.match_types],
            "matches": [{"match_type": m, "policies": [h, a], "prob": float(p)} for m, h, a, p in self.pairs()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Matchmaking":
        types = [
            MatchType(t["name"], float(t["prob"]), dict(t["homes"]), {h: dict(o) for h, o in t["opponents"].items()})
            for t in data["match_types"]
        ]
        return cls(types, version=int(data.get("version", 0)), shuffle_seats=bool(data.get("shuffle_seats", True)))


def sample_match(data: dict[str, Any], rng: Optional[np.random.Generator] = None) -> dict[str, Any]:
    """Draw one match from ``Matchmaking.to_dict()`` data.

    Returns ``{"match_type": str, "policies": [seat0_policy, seat1_policy], "home": str}``;
    with ``shuffle_seats`` the home policy takes either seat with probability 1/2.
    """
    rng = rng if rng is not None else np.random.default_rng()
    matches = data["matches"]
    if not matches:
        raise ValueError("the matchmaking data holds no matches")
    p = np.array([m["prob"] for m in matches], dtype=np.float64)
    m = matches[int(rng.choice(len(matches), p=p / p.sum()))]
    home, away = m["policies"]
    seats = [away, home] if data.get("shuffle_seats", True) and rng.random() < 0.5 else [home, away]
    return {"match_type": m["match_type"], "policies": seats, "home": home}


def normalized(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum to 1 (uniform when they sum to 0)."""
    total = float(sum(weights.values()))
    if total <= 0:
        return {k: 1.0 / len(weights) for k in weights}
    return {k: float(v) / total for k, v in weights.items()}
