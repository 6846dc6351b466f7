"""Four independent CartPole-v1 agents as one PettingZoo ParallelEnv (shoal.envs.multi_cartpole), and a league builder
that maps agent_i to policy p_i (multi-agent APPO through the AlphaStar algorithm)."""

from __future__ import annotations

from shoal.envs.multi_cartpole import MultiCartPole
from shoal.league.builder import LeagueBuilder, policy_spec

__all__ = ["IndependentPolicies", "MultiCartPole"]

NUM_AGENTS = 4


class _FixedMapping:
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def to_dict(self):
        return {"matches": [{"policies": dict(self.mapping), "match_type": "independent"}], "shuffle_seats": False}


class IndependentPolicies(LeagueBuilder):
    """agent_i always plays policy p_i; every policy learns; the league never changes."""

    def __init__(self, num_agents: int = NUM_AGENTS) -> None:
        super().__init__()
        self.num_agents = num_agents

    def _initial_players(self):
        return {f"p{i}": policy_spec("main", True) for i in range(self.num_agents)}

    def matchmaking(self):
        return _FixedMapping({f"agent_{i}": f"p{i}" for i in range(self.num_agents)})

    def record_results(self, match_results) -> None:  # not two-player games: no payoff table, just counts
        n = sum(1 for _ in match_results)
        self.match_type_counts["independent"] = self.match_type_counts.get("independent", 0) + n
