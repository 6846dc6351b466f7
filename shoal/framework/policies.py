"""PolicySet: the policies an algorithm trains and plays with, keyed by policy id.

The policy is the unit of training. A single-agent run is the one-policy case (id
``"default"``); a ``multi_agent`` section names several. Each learning policy is a
:class:`~shoal.learn.policy_learner.PolicyLearner` built from its own config (the algorithm's,
with the policy's overrides); a policy outside ``policies_to_train`` keeps its initial weights.

A set made by :meth:`PolicySet.learning_elsewhere` (the league's) holds policies whose learners
run in a runner in other processes: for each learning policy the driver's copy of its latest
weights (``copies``, taken from its results), and frozen entries (a league's snapshots and
frozen players); policies join, leave and freeze as the run goes (``add``, ``remove``,
``freeze``).

The set also keeps the layouts that must not change with the number of policies:

- results: ``learner/<stat>`` for a single policy, ``learner/<id>/<stat>`` for several;
- checkpoints: a single policy's learner state at the top of the algorithm's state
  (``learner``, ``kl``, ``target``), several under ``policies`` and ``frozen``; a set whose
  learners are elsewhere, every policy's weights under ``weights`` (the learners' own state
  is the runner's, which the algorithm saves beside it).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import numpy as np
import torch

from shoal.batch import Batch
from shoal.framework.runner import LearnFn, LocalRunner
from shoal.learn.policy_learner import PolicyLearner

DEFAULT_POLICY = "default"

# (policy config, observation space, action space, seed or None) -> the policy's learner
BuildLearner = Callable[[Any, Any, Any, Optional[int]], PolicyLearner]


class PolicySet:
    def __init__(
        self,
        configs: Mapping[str, Any],
        learners: Mapping[str, PolicyLearner],
        frozen: Mapping[str, dict[str, np.ndarray]],
        *,
        multi: bool,
        learners_elsewhere: bool = False,
    ) -> None:
        self.configs = dict(configs)
        self.trained = dict(learners)
        self.frozen = dict(frozen)
        self.multi = multi
        # learning policies whose learners run elsewhere (a runner's learner actors): the
        # driver's copy of each one's latest weights
        self.copies: dict[str, dict[str, np.ndarray]] = {}
        self.learners_elsewhere = learners_elsewhere

    @classmethod
    def single(cls, config, learner: PolicyLearner) -> "PolicySet":
        return cls({DEFAULT_POLICY: config}, {DEFAULT_POLICY: learner}, {}, multi=False)

    @classmethod
    def for_agents(cls, config, agents, build: BuildLearner) -> "PolicySet":
        """One policy per id of the ``multi_agent`` section, each on the spaces of the agent it plays
        (``agents``: :class:`~shoal.framework.multi_agent.Agents`) with its own seed."""
        from shoal.framework.config_groups import policy_config

        ma = config.multi_agent
        trained = set(ma.trained())
        configs, learners, frozen = {}, {}, {}
        for n, pid in enumerate(ma.policies):
            configs[pid] = policy_config(config, pid)
            obs_space, action_space = agents.spaces[agents.agent_for(pid)]
            pl = build(configs[pid], obs_space, action_space, None if config.seed is None else config.seed + 1 + n)
            if pid in trained:
                learners[pid] = pl
            else:
                frozen[pid] = pl.get_weights()
        return cls(configs, learners, frozen, multi=True)

    @classmethod
    def learning_elsewhere(cls) -> "PolicySet":
        """An empty set whose learning policies learn in a runner elsewhere (the league's learner
        shards): policies are added as the run goes."""
        return cls({}, {}, {}, multi=True, learners_elsewhere=True)

    # ---- ids and learners -----------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        return list(self.configs)

    @property
    def learning(self) -> list[str]:
        """The learning policies: those with a learner here, then those learning elsewhere."""
        return [*self.trained, *self.copies]

    def add(self, pid: str, config, weights: dict[str, np.ndarray], *, learning: bool) -> None:
        """A new policy: learning elsewhere from ``weights`` (its learner is the runner's to add),
        or frozen at them."""
        if pid in self.configs:
            raise ValueError(f"policy {pid!r} is already in the set")
        if learning and not self.learners_elsewhere:
            raise ValueError(f"policy {pid!r} cannot learn elsewhere: this set's learners are its own")
        self.configs[pid] = config
        (self.copies if learning else self.frozen)[pid] = weights

    def remove(self, pid: str) -> dict[str, np.ndarray]:
        """``pid`` leaves the set; its latest weights."""
        weights = self.weights(pid)
        del self.configs[pid]
        for table in (self.trained, self.copies, self.frozen):
            table.pop(pid, None)
        return weights

    def freeze(self, pid: str) -> None:
        """``pid`` stops learning and keeps playing with its latest weights."""
        weights = self.weights(pid)
        self.trained.pop(pid, None)
        self.copies.pop(pid, None)
        self.frozen[pid] = weights

    def __getitem__(self, pid: str) -> PolicyLearner:
        return self.trained[pid]

    def __iter__(self) -> Iterator[tuple[str, PolicyLearner]]:
        """The learning policies, in the section's order."""
        return iter(self.trained.items())

    @property
    def only(self) -> PolicyLearner:
        """The one learning policy of a single-agent run."""
        if self.multi:
            raise AttributeError("a multi-agent run has one learner per policy: use algo.policies[policy_id]")
        return self.trained[DEFAULT_POLICY]

    def learners(self):
        """The Learner of a single policy, or ``{policy_id: Learner}`` (what a learner thread takes)."""
        if not self.multi:
            return self.only.learner
        return {pid: pl.learner for pid, pl in self.trained.items()}

    def local_runner(self, learn: LearnFn) -> LocalRunner:
        """A runner over the learning policies that learns in the driver, each batch by ``learn``."""
        return LocalRunner(dict(self.trained), learn)

    # ---- batches and stats ----------------------------------------------------------------
    def batches(self, sampled: Iterable[Any]) -> dict[str, Batch]:
        """The rows each learning policy learns from this round: a Batch per rollout actor, or
        a ``{policy_id: Batch}`` per actor with several policies (ids without rows are left out)."""
        sampled = list(sampled)
        if not self.multi:
            return {DEFAULT_POLICY: Batch.concat(sampled)} if sampled else {}
        out = {}
        for pid in self.trained:
            rows = [b[pid] for b in sampled if pid in b]
            if rows:
                out[pid] = Batch.concat(rows)
        return out

    def result_keys(self, stats: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Per-policy stats as result keys: ``learner/<stat>``, or ``learner/<id>/<stat>`` with several policies."""
        if not self.multi:
            return {f"learner/{k}": v for k, v in stats.get(DEFAULT_POLICY, {}).items()}
        return {f"learner/{pid}/{k}": v for pid, s in stats.items() for k, v in s.items()}

    def display(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The live display's ``(result key, label)`` pairs: with several policies, the first learning one's."""
        if not self.multi:
            return pairs
        pid = next(iter(self.trained), None)
        if pid is None:
            return []
        return [(f"learner/{pid}/{key.removeprefix('learner/')}", f"{pid}/{label}") for key, label in pairs]

    # ---- weights, config and state --------------------------------------------------------
    def weights(self, pid: str) -> dict[str, np.ndarray]:
        if pid in self.trained:
            return self.trained[pid].get_weights()
        return self.copies[pid] if pid in self.copies else self.frozen[pid]

    def set_weights(self, pid: str, weights: dict[str, np.ndarray]) -> None:
        """``pid``'s weights: its learner's here, else the driver's copy (a learner elsewhere is
        the runner's to set)."""
        if pid in self.trained:
            self.trained[pid].set_weights(weights)
        elif pid in self.copies:
            self.copies[pid] = weights
        elif pid in self.frozen:
            self.frozen[pid] = weights
        else:
            raise KeyError(f"unknown policy {pid!r}; the set holds {self.ids}")

    def get_weights(self):
        """What rollout actors play with: the single policy's weights, or ``{policy_id: weights}``."""
        if not self.multi:
            return self.only.get_weights()
        return {pid: self.weights(pid) for pid in self.configs}

    def apply_config(self, config, changes: Iterable[str]) -> None:
        """``update_config``'s changes, applied to each learning policy; a policy's own overrides still win."""
        if self.learners_elsewhere:  # one config for every policy; their learners take no change mid-run
            self.configs = dict.fromkeys(self.configs, config)
        elif self.multi:
            from shoal.framework.config_groups import policy_config

            self.configs = {pid: policy_config(config, pid) for pid in self.configs}
        else:
            self.configs[DEFAULT_POLICY] = config
        changed = set(changes)
        for pid, pl in self.trained.items():
            pl.apply_config(self.configs[pid], set_lr="lr" in changed)

    def nonfinite_skipped(self) -> int:
        return sum(pl.learner.num_nonfinite_skipped for pl in self.trained.values())

    def get_state(self) -> dict[str, Any]:
        if self.learners_elsewhere:
            return {"weights": {pid: _tensors(self.weights(pid)) for pid in self.configs}}
        if not self.multi:
            return self.only.get_state()
        return {
            "policies": {pid: pl.get_state() for pid, pl in self.trained.items()},
            "frozen": {pid: _tensors(w) for pid, w in self.frozen.items()},
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """The saved weights of the policies the set holds (with learners elsewhere, the driver's
        copies: the algorithm gives the runner's learners their own state)."""
        if self.learners_elsewhere:
            for pid, w in state["weights"].items():
                if pid in self.configs and pid not in self.trained:
                    self.set_weights(pid, {k: v.numpy() for k, v in w.items()})
            return
        if not self.multi:
            self.only.set_state(state)
            return
        for pid, s in state["policies"].items():
            if pid in self.trained:
                self.trained[pid].set_state(s)
        for pid, w in state.get("frozen", {}).items():
            if pid in self.frozen:
                self.frozen[pid] = {k: v.numpy() for k, v in w.items()}


def _tensors(weights: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}


def build_policy_module(
    build: Callable[..., torch.nn.Module], obs_space, action_space, model_config, seed: Optional[int] = None
) -> torch.nn.Module:
    """``build(obs_space, action_space, model_config)``; with a ``seed``, initialised from it and
    leaving the global RNG as it was (each policy of a ``multi_agent`` section has its own)."""
    if seed is None:
        return build(obs_space, action_space, model_config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(obs_space, action_space, model_config)
