"""Learners: the optimizer side. Algorithms supply the loss; learners own modules and devices."""

from shoal.learn.distributed_learners import DistributedLearners, ShardPlan, shard_plan
from shoal.learn.learner import Learner, resolve_device
from shoal.schedule import PiecewiseSchedule

__all__ = ["Learner", "PiecewiseSchedule", "resolve_device"]
__all__ += ["DistributedLearners", "ShardPlan", "shard_plan"]
