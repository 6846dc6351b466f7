"""Sampling: EnvRunner, inference policies, postprocessing (GAE, ...)."""

from shoal.rollout.env_runner import EnvRunner, Fragment, RolloutMetrics, fragment_to_batch
from shoal.rollout.policies import ActorCriticPolicy
from shoal.rollout.postprocessing import compute_gae, flatten_valid

__all__ = [
    "EnvRunner",
    "Fragment",
    "RolloutMetrics",
    "fragment_to_batch",
    "ActorCriticPolicy",
    "compute_gae",
    "flatten_valid",
]

from shoal.rollout.multi_agent import MultiAgentEnvRunner, PolicyReturnWindows  # noqa: E402

__all__ += ["MultiAgentEnvRunner", "PolicyReturnWindows"]
