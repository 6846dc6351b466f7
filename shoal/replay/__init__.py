"""Replay: sum tree, uniform and prioritized ring buffers, and the replay shard actors wrap."""

from shoal.replay.buffers import PrioritizedReplayBuffer, ReplayBuffer
from shoal.replay.shard import ReplayShard
from shoal.replay.sum_tree import SumTree, warmup

__all__ = ["PrioritizedReplayBuffer", "ReplayBuffer", "ReplayShard", "SumTree", "warmup"]
