"""AlphaStar: league self-play on APPO with distributed learners.

Reads in order: setup, the league's records, training_step (the config is
``alpha_star_config.py``'s, the policy learner ``alpha_star_learner.py``'s). Reuses APPO's loss and
target network (functions and a small class), the multi-agent runner (as the league's rollout
actor, ``shoal.rollout.league``), the league builders and the learner shards; nothing here
subclasses another algorithm.

The data flow:

- Rollout actors (:class:`LeagueRolloutActor`, a MultiAgentEnvRunner) play the games the
  league's matchmaking data asks for and put each learning policy's sequences straight
  into that policy's shard replay actor (``add_batch``); the driver only gets metrics and
  match outcomes back.
- Policy learner actors (:class:`APPOPolicyLearner`) pull a mix of new and replayed batches
  from their shard (``replay_ratio``, ``replay_buffer_capacity`` batches), learn with the
  APPO loss under the stored action masks, and return their new weights; a policy named in
  ``resources.learner_groups`` learns in a group of K replicas instead (``alpha_star_group``).
- The driver keeps ``max_requests_in_flight_per_worker`` requests open to every rollout
  actor and every policy learner, collects what is ready and never waits on one actor.
  New weights go to the rollout actors with the matchmaking data in one object-store put.
- After every iteration the league builder sees the match results and the result dict and
  may add (a learner in the first free shard slot, weights copied from the parent), reset,
  freeze (learner released, the policy keeps playing) or remove policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from shoal.algorithms.alpha_star_average import AverageOpponents
from shoal.algorithms.alpha_star_config import AlphaStarConfig
from shoal.algorithms.alpha_star_group import LeagueRunner, group_bundles
from shoal.algorithms.alpha_star_learner import APPOPolicyLearner
from shoal.algorithms.league_evaluator import LeagueEvaluator
from shoal.config import AlgorithmConfig
from shoal.envs.multi_agent import make_multi_agent_env
from shoal.errors import ConfigError, EnvError
from shoal.framework.base import Algorithm
from shoal.framework.pipeline import WAIT_S
from shoal.framework.policies import PolicySet
from shoal.framework.runner import RemoteLearner
from shoal.framework.weights_publisher import WeightsPublisher
from shoal.league import LeagueChanges, make_league_builder
from shoal.league.builder import MatchResult
from shoal.learn.distributed_learners import DistributedLearners, shard_plan, shard_sizes
from shoal.logging.metrics import Phase
from shoal.models import build_actor_critic
from shoal.replay import BatchReplay
from shoal.rollout.league import LeagueRolloutActor, SyncMessage, store_batches
from shoal.rollout.multi_agent import PolicyReturnWindows
from shoal.runtime.placement import DRIVER, BundleGroup
from shoal.seeding import derive_seed

UNDECIDED_GAMES_LIMIT = 500  # games without a single winner before the league refuses the env


# ---- algorithm --------------------------------------------------------------------------
@dataclass
class LeagueSync:
    """What the rollout actors have not been told yet, and when to tell them (``broadcast()``)."""

    changed: set[str] = field(default_factory=set)  # policies whose weights were not sent yet
    removed: list[str] = field(default_factory=list)  # policies removed since the last broadcast
    learned_since_broadcast: int = 0  # learner results since the last broadcast
    replay_restarts_sent: int = 0  # replay actor restarts whose new handles the rollout actors have


class AlphaStar(Algorithm):
    evaluator_cls = LeagueEvaluator  # scored against fixed yardsticks: scripted players, exploitability
    config_cls = AlphaStarConfig
    is_league = True
    result_keys = (
        *Algorithm.result_keys,
        *("num_policies", "num_learning_policies", "num_matches_this_iter", "num_learner_restarts"),
        *("num_learner_regroups", "num_replay_actor_restarts"),
    )
    config: AlphaStarConfig
    evaluator: LeagueEvaluator
    policies: PolicySet  # every player; the learning ones' learners are on the shards (``runner``)

    def describe_env(self):
        env = make_multi_agent_env(self.config.env, self.config.env_config)  # fails early on a bad env
        agents = list(env.possible_agents)
        if len(agents) != 2 and getattr(make_league_builder(self.config.league), "name", "") == "alpha_star":
            env.close()
            raise ConfigError(
                f"The alpha_star league builder plays two-player games; {self.config.env!r} has "
                f"{len(agents)} agents ({', '.join(agents)}). For more agents use ppo, impala or appo "
                "with a multi_agent section, or a league builder of your own (league: "
                "'package.module:Builder')."
            )
        agent = agents[0]
        self.obs_space, self.action_space = env.observation_space(agent), env.action_space(agent)
        env.close()
        return None

    def setup(self) -> None:
        cfg, res = self.config, self.config.resources
        remote = res.num_workers > 0
        # Remote rollout actors with learners in the driver: the batches travel back with the metrics.
        self._driver_stores = remote and not res.learners_remote()
        self.league = make_league_builder(cfg.league)
        self.returns = PolicyReturnWindows(100)
        plan = shard_plan(res.num_gpus, cfg.max_num_policies_to_train, res.num_learner_shards)
        self.learners = DistributedLearners(
            APPOPolicyLearner,
            BatchReplay,
            plan,
            remote=res.learners_remote(),
            max_in_flight=cfg.max_requests_in_flight_per_worker,
            replay_kwargs={"capacity": cfg.replay_buffer_capacity, "replay_ratio": cfg.replay_ratio, "seed": cfg.seed},
            policy_num_cpus=res.num_cpus_per_learner,
            max_restarts=res.max_worker_restarts,
            restart_window_s=res.worker_restart_window_s,
            resource_wait_s=res.resource_wait_s,
            address=res.address,
            request_timeout_s=res.request_timeout_s,
            start_timeout_s=res.actor_start_timeout_s,
            placement=self.actor_resources("learner shard").placement if res.learners_remote() else None,
        )
        # where the trainable policies learn: shard learners, and learner groups (resources.learner_groups)
        self.runner = LeagueRunner.of(self)
        # the players: the driver's copy of each learning one's latest weights, and the frozen ones
        self.policies = PolicySet.learning_elsewhere()
        self.sync = LeagueSync()
        for pid, spec in self.league.initial_policies().items():
            self._add(pid, self._fresh_weights(pid), spec.trainable)
        self.average_opponents = AverageOpponents(self)  # league.main_vs_average_prob: main against its average
        self.average_opponents.add()
        self.sync.changed.clear()
        self._matches_this_iter = 0
        self._games_seen = self._games_decided = 0  # since this process built the league: any winner at all?
        self._learner_stats: dict[str, float] = {}  # the last stats of every learner: stable result columns
        # lazy, like every algorithm's: a run restored only to evaluate starts none; built from multi_agent_runner_args
        self.env_runners = self.make_env_runners(
            None,
            None,
            cfg.fragment_length(),
            max_in_flight=cfg.max_requests_in_flight_per_worker,
            runner_cls=LeagueRolloutActor,
        )
        # a published sync message holds only what changed; a recreated actor is sent the whole league
        self.publisher = WeightsPublisher(
            lambda: self.env_runners, full=lambda: [("sync", (self._message(full=True),))]
        )
        self.best_metric, self.best_metric_mode = self.evaluator.best_metric()

    @classmethod
    def resource_plan(cls, config: AlgorithmConfig) -> list[BundleGroup]:
        """The shared plan plus the learner shards when they are Ray actors: one bundle per shard
        (its replay actor and a learner per slot, with their GPUs), spread over the nodes; the
        driver then needs no GPU."""
        assert isinstance(config, AlphaStarConfig)
        plan, res = super().resource_plan(config), config.resources
        if not res.learners_remote():
            return plan
        shards = shard_plan(res.num_gpus, config.max_num_policies_to_train, res.num_learner_shards)
        sizes = shard_sizes(shards, 0.0, res.num_cpus_per_learner)
        plan[0] = BundleGroup(DRIVER, 1, 1.0)
        plan.insert(
            1,
            BundleGroup(
                "learner shard",
                len(sizes),
                max(c for c, _ in sizes),
                max(g for _, g in sizes),
                spread=True,
                sizes=sizes,
                cpu_key="resources.num_cpus_per_learner",
            ),
        )
        return plan + group_bundles(config)

    # ---- helpers ---------------------------------------------------------------------------
    def exploitability(self, policy_id: str = "main") -> float:
        """NashConv / 2 of ``policy_id``'s sampling policy on an OpenSpiel game (:class:`LeagueEvaluator`);
        ``"<player>@average"``: a learning player's average (``average_policy``)."""
        return self.evaluator.exploitability(policy_id)

    def average_weights(self, policy_id: str = "main") -> dict:
        """A learning policy's average (``average_policy``), from its learner."""
        if self.config.average_policy is None:
            raise ConfigError(
                f"'{policy_id}@average' is a learning policy's average, and this league keeps none "
                "(average_policy is None): set average_policy (parameters or behaviour)"
            )
        if policy_id not in self.policies.copies:
            raise ConfigError(
                f"'{policy_id}@average': {policy_id!r} is not learning; the learning policies, which keep an "
                f"average, are {', '.join(self.policies.learning)}"
            )
        return self.runner.call(policy_id, "average_weights")

    def league_mixture(self, policy_ids: Optional[list[str]] = None):
        """The frozen players' Nash mixture and its exploitability (:class:`LeagueEvaluator`)."""
        return self.evaluator.league_mixture(policy_ids)

    def evaluate_vs(
        self,
        opponent: str = "random",
        num_games: int = 100,
        policy_id: str = "main",
        num_envs: int = 16,
        explore: Optional[bool] = None,
    ) -> dict[str, float]:
        """Win rate of ``policy_id`` against "random", "heuristic", "heuristic2" or another policy;
        greedy, or sampled on an OpenSpiel game (``explore`` None; :meth:`LeagueEvaluator.samples`)."""
        return self.evaluator.evaluate_vs(opponent, num_games, policy_id, num_envs, explore)

    def _fresh_weights(self, pid: str) -> dict:
        seed = derive_seed(
            self.config.seed, index=len(self.policies.ids), stride=1, offset=1
        )  # the n-th policy: seed + 1 + n
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            module = build_actor_critic(self.obs_space, self.action_space, self.config.model)
        return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}

    def _add(self, pid: str, weights: dict, trainable: bool) -> None:
        self.policies.add(pid, self.config, weights, learning=trainable)
        self.sync.changed.add(pid)
        if trainable:
            args = (self.config, self.obs_space, self.action_space, self._idle_sleep())
            self.runner.add_policy(pid, RemoteLearner(args, weights))

    def _idle_sleep(self) -> float:
        return self.config.learner_idle_sleep_s if self.config.resources.learners_remote() else 0.0

    def multi_agent_runner_args(self, index: int):
        """A rollout actor's ``(args, kwargs)``: every player with its weights, the matchmaking
        data and where each learning policy's batches go."""
        return (self.config, index, self._specs(), self._mm(), self._replay()), {}

    def _specs(self) -> dict[str, dict]:
        learning = set(self.policies.copies)
        return {pid: {"weights": w, "trainable": pid in learning} for pid, w in self.policies.get_weights().items()}

    def _mm(self) -> dict:
        return self.league.matchmaking().to_dict()

    def log_tensorboard_extras(self, writer, step: int) -> None:
        """The league's tables and win-rate heatmap in TensorBoard (the trainer calls this at checkpoints)."""
        from shoal.league.report import add_league_to_tensorboard, league_report

        add_league_to_tensorboard(writer, league_report(self.league), step)

    def _replay(self) -> dict:
        return {} if self._driver_stores else self.learners.replay_proxies()

    def _message(self, full: bool = False) -> SyncMessage:
        weights = self.policies.get_weights()
        return SyncMessage(
            weights=weights if full else {pid: w for pid, w in weights.items() if pid in self.sync.changed},
            matchmaking=self._mm(),
            train=self.policies.learning,
            replay=self._replay(),
            remove=list(self.sync.removed),
        )

    def _record_matches(self, metrics) -> None:
        """The rollout actors' finished games into the return windows and the league. A game that
        never has a winner in its first :data:`UNDECIDED_GAMES_LIMIT` games is an EnvError: the
        players' returns are not reaching the learners (all draws is what a wrapper that drops
        terminal rewards looks like), and a league on it would train on zeros without a word."""
        for m in metrics:
            self.returns.add(m)
            self.league.record_results(m.matches)
            self._matches_this_iter += len(m.matches)
            self._games_seen += len(m.matches)
            self._games_decided += sum(MatchResult.coerce(r).winner is not None for r in m.matches)
        if self._games_decided == 0 and self._games_seen >= UNDECIDED_GAMES_LIMIT:
            raise EnvError(
                f"None of the first {self._games_seen} games of {self.config.env_name()!r} had a winner: every player's "
                "return was the same in each. The players' rewards are not reaching the learners: the env must give "
                "each player its reward by its terminal step (a wrapper that ends the agent loop without a terminal "
                "step, as shimmy's OpenSpiel wrapper does on Kuhn poker, gives only zeros; use env: "
                "openspiel:<game>). A game in which every match is a draw has nothing to learn."
            )

    def display_metrics(self) -> list[tuple[str, str]]:
        """Main's learner figures; the headline is ``best_metric`` (main's exploitability on an OpenSpiel
        game, else its win rate against a fixed opponent, with evaluation on)."""
        return [(f"learner/main/{k}", f"main/{k}") for k in ("policy_loss", "vf_loss", "entropy")]

    def samples_when_evaluated(self) -> bool:
        """On an OpenSpiel game: its figure, exploitability, is of the sampling policy, and its
        greedy player is a pure strategy a best response exploits (:meth:`LeagueEvaluator.samples`)."""
        return self.evaluator.samples()

    def summary_lines(self, results: list[dict[str, Any]]) -> list[str]:
        return self.evaluator.summary_lines(results)

    def get_weights(self, policy_ids=None) -> dict[str, dict]:
        return {pid: self.policies.weights(pid) for pid in (policy_ids or self.policies.ids)}

    def broadcast(self) -> None:
        """One put: the changed weights, the matchmaking, who learns, where to store batches, who left."""
        self.sync.replay_restarts_sent = self.learners.num_replay_restarts
        self.publisher.publish([("sync", (self.publisher.put(self._message()),))])
        self.publisher.send()
        self.sync.changed, self.sync.removed = set(), []
        self.sync.learned_since_broadcast = 0

    # ---- the execution plan ------------------------------------------------------------------
    def training_step(self) -> dict[str, Any]:
        with self.timers.time(Phase.SAMPLE):
            if self._driver_stores:
                self.env_runners.submit("sample_and_return")
                metrics, replay = [], self.learners.replay_proxies()
                for _, (batches, m) in self.env_runners.fetch_ready(WAIT_S):
                    metrics.append(m)
                    store_batches(batches, replay)
            else:
                self.env_runners.submit("sample_and_store")
                metrics = [m for _, m in self.env_runners.fetch_ready(WAIT_S)]
            self.record_rollouts(metrics)
            self._record_matches(metrics)
        with self.timers.time(Phase.LEARN):
            self.runner.submit({pid: self.counters["env_steps_sampled"] for pid in self.policies.copies})
            stats = self._learner_stats  # the last stats of every learner: stable result columns
            for r in self.runner.results(WAIT_S):
                pid = r.policy_id
                if pid not in self.policies.copies or r.weights is None:
                    continue
                self.counters["env_steps_trained"] += r.env_steps
                self.policies.set_weights(pid, r.weights)  # the learners keep theirs (fetch_ready)
                self.sync.changed.add(pid)
                stats.update({f"learner/{pid}/{k}": v for k, v in r.stats.items()})
                self.sync.learned_since_broadcast += 1
        with self.timers.time(Phase.SYNC):
            # every `broadcast_interval` learner results (the league's changes go out after each iteration anyway),
            # and at once when a replay actor was recreated: the rollout actors must write to the new one
            replay_restarts = self.learners.num_replay_restarts
            if replay_restarts != self.sync.replay_restarts_sent or (
                self.sync.changed and self.sync.learned_since_broadcast >= self.config.broadcast_interval
            ):
                self.broadcast()
        return dict(stats)

    def nonfinite_updates_skipped(self) -> int:
        """The policy learners' counts, as each last reported them."""
        return int(sum(v for k, v in self._learner_stats.items() if k.endswith("/num_nonfinite_skipped")))

    def train(self) -> dict[str, Any]:
        self._matches_this_iter = 0
        result = super().train()
        with self.timers.time(Phase.LEAGUE):
            self.learners.check_replays()  # a recreated replay actor's handle goes out with this broadcast
            self.apply_league_changes(self.league.build(self, result))
            self.average_opponents.refresh()
            self.broadcast()  # the matchmaking's win-rate weights move every iteration
        result.update(self.returns.metrics())
        result.update(self.league.metrics())
        result.update(
            {
                "num_policies": len(self.league.players),  # not the rollout-only main@average
                "num_learning_policies": len(self.policies.learning),
                "num_matches_this_iter": self._matches_this_iter,
                "num_learner_restarts": self.runner.num_restarts,
                "num_learner_regroups": self.runner.num_regroups,
                "num_replay_actor_restarts": self.learners.num_replay_restarts,
            }
        )
        return result

    def apply_league_changes(self, changes: LeagueChanges) -> None:
        """Freezes and removals first, so the learner slots they free can take this build's
        additions (a full league would refuse them); a snapshot copies its parent's weights as
        they were before any reset in the same build."""
        parents = {a.new_id: self.policies.weights(a.from_id) for a in changes.add if a.from_id}
        for pid in [*changes.freeze, *changes.remove]:
            if pid in self.policies.copies:
                self.runner.remove_policy(pid)
                self.policies.freeze(pid)
        for pid in changes.remove:
            if pid in self.policies.ids:
                self.policies.remove(pid)
            self.sync.changed.discard(pid)
            self._learner_stats = {k: v for k, v in self._learner_stats.items() if not k.startswith(f"learner/{pid}/")}
            self.sync.removed.append(pid)
        for a in changes.add:
            self._add(a.new_id, parents.get(a.new_id) or self._fresh_weights(a.new_id), a.trainable)
        for pid in changes.reset:
            weights = self._fresh_weights(pid)
            self.policies.set_weights(pid, weights)
            self.sync.changed.add(pid)
            if pid in self.policies.copies:
                self.runner.set_weights(pid, weights)  # every replica of a learner group

    # ---- state -------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            "league": self.league.get_state(),  # every player's weights are the policies' (``weights``)
            "learners": {pid: self.runner.call(pid, "get_state") for pid in self.policies.copies},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue the checkpoint's league: its players, their weights, who learns, the learners' optimizers."""
        super().set_state(state)
        self.league.set_state(state["league"])
        before = set(self.policies.ids)
        for pid in self.policies.ids:
            if pid in self.policies.copies:
                self.runner.remove_policy(pid)
            self.policies.remove(pid)
        self.sync.changed = set()
        for pid, spec in self.league.players.items():
            self._add(pid, {k: v.numpy() for k, v in state["weights"][pid].items()}, spec.trainable)
        for pid, learner_state in state.get("learners", {}).items():  # optimizer and target network too
            if pid in self.policies.copies:
                self.runner.set_state(pid, learner_state)
                self.policies.set_weights(pid, self.runner.get_weights(pid))
                self.sync.changed.add(pid)
        self.average_opponents.add()
        self.sync.removed = sorted(before - set(self.policies.ids))
        self.broadcast()

    def stop(self) -> None:
        self.runner.stop()
        super().stop()
