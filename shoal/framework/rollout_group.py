"""The run's actors: what it reserves (one bundle per actor, grouped by kind) and its rollout
actor group, the one constructor that picks the runner from the env kind."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.config import AlgorithmConfig
from shoal.rollout.env_runner import EnvRunner
from shoal.rollout.multi_agent import MultiAgentEnvRunner
from shoal.runtime import ActorResources, LazyActorGroup, make_actor_group
from shoal.runtime.placement import DRIVER, BundleGroup

if TYPE_CHECKING:
    from shoal.framework.base import Algorithm


def base_resource_plan(config: AlgorithmConfig) -> list[BundleGroup]:
    """The driver's bundle, then the rollout and evaluation actors' (none with ``num_workers=0``
    and no evaluation workers): what every algorithm reserves before its own groups."""
    res = config.resources
    plan = [BundleGroup(DRIVER, 1, 1.0, getattr(res, "num_gpus", 0.0))]
    spread = res.worker_placement == "SPREAD"  # over the nodes: the run's placement group becomes SPREAD
    if res.num_workers > 0:
        plan.append(BundleGroup("rollout actor", res.num_workers, res.num_cpus_per_worker, spread=spread))
    if config.evaluation.evaluation_num_workers > 0:  # remote even when rollouts are not
        plan.append(
            BundleGroup(
                "evaluation actor", config.evaluation.evaluation_num_workers, res.num_cpus_per_worker, spread=spread
            )
        )
    return plan


def rollout_group(
    algo: "Algorithm",
    policy_cls,
    postprocess,
    fragment_length: int,
    *,
    max_in_flight: int = 1,
    runner_cls: type = EnvRunner,
) -> LazyActorGroup:
    """``algo``'s rollout actors (see :meth:`Algorithm.make_env_runners`): in the driver with
    ``num_workers=0`` (one runner, index 0), else Ray actors indexed from 1; a game (a
    ``multi_agent`` section, or a league) gets the
    :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner`, or the subclass of it given as
    ``runner_cls`` (the league's), each built from ``algo.multi_agent_runner_args(index)``. A
    recreated actor is sent the last broadcast weights (the publisher's ``restart_calls()``),
    else the normalizer's statistics, then ``algo.restart_calls()``."""
    config = algo.config
    res = config.resources
    remote = res.num_workers > 0
    n, first = max(res.num_workers, 1), 1 if remote else 0
    multi = algo.is_multi_agent or algo.is_league

    def ctor(i: int):
        if multi:
            return algo.multi_agent_runner_args(i)
        return (config, i, policy_cls, postprocess, fragment_length), {}

    if multi and not issubclass(runner_cls, MultiAgentEnvRunner):  # the env kind picks the runner: sequences per policy
        runner_cls = MultiAgentEnvRunner
    group = LazyActorGroup(
        lambda: make_actor_group(
            runner_cls,
            n,
            ctor,
            remote=remote,
            resources=algo.actor_resources("rollout actor") if remote else ActorResources.of_workers(res),
            max_in_flight=max_in_flight,
            name="rollout actor",
            first_index=first,
            about=f"env {config.env_name()}",
        ),
        n,
        first_index=first,
        max_in_flight=max_in_flight,
    )
    group.on_restart = lambda: (algo.publisher.restart_calls() or algo.normalizer_calls()) + algo.restart_calls()
    return group
