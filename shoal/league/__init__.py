"""League self-play: builders, their records (PlayerSpec, AddPolicy, MatchResult), payoff table,
matchmaking data and reports.

See :mod:`shoal.league.builder` for how an algorithm drives a builder and
:mod:`shoal.league.alpha_star` for the AlphaStar league's rules.
"""

from shoal.league.alpha_star import AlphaStarLeagueBuilder, AlphaStarLeagueConfig
from shoal.league.builder import (
    LEAGUE_BUILDERS,
    AddPolicy,
    LeagueBuilder,
    LeagueChanges,
    MatchResult,
    NoLeagueBuilder,
    PlayerSpec,
    make_league_builder,
    policy_spec,
    resolve_league_builder,
)
from shoal.league.matchmaking import Matchmaking, MatchType, sample_match
from shoal.league.payoff import PFSP_WEIGHTINGS, PayoffTable, pfsp_probs, pfsp_weights
from shoal.league.report import format_league_report, league_report, write_league_report

__all__ = [
    "AddPolicy",
    "AlphaStarLeagueBuilder",
    "AlphaStarLeagueConfig",
    "LEAGUE_BUILDERS",
    "LeagueBuilder",
    "LeagueChanges",
    "MatchResult",
    "NoLeagueBuilder",
    "PlayerSpec",
    "make_league_builder",
    "policy_spec",
    "resolve_league_builder",
    "Matchmaking",
    "MatchType",
    "sample_match",
    "PFSP_WEIGHTINGS",
    "PayoffTable",
    "pfsp_probs",
    "pfsp_weights",
    "format_league_report",
    "league_report",
    "write_league_report",
]
