"""Networks and action distributions; ``build_actor_critic`` maps spaces to modules."""

from shoal.models.catalog import ActorCritic, build_actor_critic, preprocess_obs
from shoal.models.distributions import Categorical, DiagGaussian, dist_class_for

__all__ = ["ActorCritic", "build_actor_critic", "preprocess_obs", "Categorical", "DiagGaussian", "dist_class_for"]
