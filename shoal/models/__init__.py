"""Networks and action distributions; ``build_actor_critic`` maps spaces to modules."""

from shoal.models.catalog import ActorCritic, QNetwork, build_actor_critic, build_q_network, preprocess_obs
from shoal.models.distributions import Categorical, DiagGaussian, dist_class_for

__all__ = [
    "ActorCritic",
    "QNetwork",
    "build_actor_critic",
    "build_q_network",
    "preprocess_obs",
    "Categorical",
    "DiagGaussian",
    "dist_class_for",
]
