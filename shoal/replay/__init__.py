"""Replay: sum tree, uniform and prioritized ring buffers, the replay shard actors wrap, and
per-policy batch replay for learner shards."""

from shoal.replay.batch_replay import BatchReplay
from shoal.replay.buffers import PrioritizedReplayBuffer, ReplayBuffer
from shoal.replay.shard import ReplayShard
from shoal.replay.sum_tree import SumTree, warmup

__all__ = ["BatchReplay", "PrioritizedReplayBuffer", "ReplayBuffer", "ReplayShard", "SumTree", "warmup"]
