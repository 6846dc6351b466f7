"""Callbacks classes for tests/test_callbacks.py, importable by path (``hook_helpers:Recorder``) from
the test process, the CLI and Ray rollout actors (the tests folder is on their import path)."""

from __future__ import annotations

import shoal

EVENTS: list[tuple] = []  # what the driver's hooks saw, in order (in-process runs only)


class Recorder(shoal.Callbacks):
    """Records the driver hooks; each episode reports its length, a step count and its return."""

    def on_train_result(self, algorithm, result):
        EVENTS.append(("train_result", result["iteration"], algorithm.iteration))
        result["custom_note"] = 7.0

    def on_checkpoint(self, algorithm, path, kind):
        EVENTS.append(("checkpoint", kind, algorithm.iteration, (path / "meta.json").is_file()))

    def on_evaluate(self, algorithm, result):
        EVENTS.append(("evaluate", algorithm.iteration, result["num_episodes"]))
        result["seen_by_hook"] = 1.0

    def on_episode_step(self, episode, obs, reward, info):
        episode.user_data["steps"] = episode.user_data.get("steps", 0) + 1
        episode.user_data["reward"] = episode.user_data.get("reward", 0.0) + reward

    def on_episode_end(self, episode):
        return {
            "length": episode.length,
            "steps": episode.user_data["steps"],
            "return": episode.user_data["reward"],
            "worker": episode.worker_index,
        }


class EndOnly(shoal.Callbacks):
    """Only on_episode_end: the runner must never call on_episode_step."""

    def on_episode_step(self, episode, obs, reward, info):  # pragma: no cover - replaced below
        raise AssertionError("not overridden in the class the runner sees")

    def on_episode_end(self, episode):
        return {"length": episode.length, "has_info": float(isinstance(episode.info, dict))}


del EndOnly.on_episode_step  # the base class's no-op again: what a user who overrides only on_episode_end has


class DriverOnly(shoal.Callbacks):
    def on_train_result(self, algorithm, result):
        result["driver_only"] = 1.0


class NeedsArgs(shoal.Callbacks):
    def __init__(self, factor):
        self.factor = factor


class NotCallbacks:
    pass


class AgentReturns(shoal.Callbacks):
    """Multi-agent: the sum of the agents' returns equals the episode's total return."""

    def on_episode_end(self, episode):
        return {
            "agents": len(episode.agent_returns),
            "sum_gap": sum(episode.agent_returns.values()) - episode.total_return,
        }

    def on_train_result(self, algorithm, result):  # after the league's own keys (added after super().train())
        result["saw_num_policies"] = float("num_policies" in result)


class TerminatedAtThree(shoal.Callbacks):
    """SIGTERM's exception in the moment after ``train()`` counted iteration 3, before its row is written."""

    def on_train_result(self, algorithm, result):
        if result["iteration"] == 3:
            from shoal.runtime import signals

            raise signals.Terminated
