"""Groups of config keys the framework reads, composed into flat configs: the ``multi_agent``
section (the policies a :class:`~shoal.framework.policies.PolicySet` trains) and the asynchronous
pipeline's sampling, learner thread and learner group (IMPALA, APPO, AlphaStar).

An algorithm's config is :class:`~shoal.config.AlgorithmConfig` plus the groups it uses,
listed as bases (``class APPOConfig(VTraceKeys, AsyncSamplingKeys, ..., AlgorithmConfig)``):
the keys stay flat (``vtrace_lambda``, not ``vtrace.lambda``) and no algorithm's config
inherits another's. A group holds fields and the helpers that read them; it declares no
validator. The checks that span groups are plain functions here, which each config calls
from its own, distinctly named validator, so a check never depends on which same-named
validator pydantic keeps. The groups of the algorithms' own losses are in
:mod:`shoal.algorithms.loss_keys`, the replay's in :mod:`shoal.algorithms.replay_loop`.

A config includes only the groups it uses. Where a user may expect a sibling's keys (AlphaStar's
learners are not APPO's learner thread; DD-PPO has no KL penalty), the config lists them in
``unused_keys`` with the reason, so giving one says why rather than "unknown key".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from pydantic import Field, model_validator

from shoal.config import ResourcesConfig, Section

DEFAULT_SEQUENCE_LENGTH = 50  # V-trace's T when rollout_fragment_length is "auto"


class AsyncSamplingKeys(Section):
    """Asynchronous sampling into train batches of whole sequences (IMPALA, APPO, AlphaStar)."""

    if TYPE_CHECKING:  # AlgorithmConfig's, which every config that takes this group has
        rollout_fragment_length: Union[int, str]

    lr: float = Field(5e-4, gt=0, description="Adam learning rate (lr_schedule overrides it).")
    min_time_s_per_iteration: float = Field(
        1.0, ge=0, description="Asynchronous steps are short: report about once a second."
    )
    train_batch_size: int = Field(500, ge=1, description="Rows (env steps, whole sequences) per learner update.")
    num_sgd_iter: int = Field(1, ge=1, description="Times the learner learns on each train batch.")
    max_requests_in_flight_per_worker: int = Field(2, ge=1, description="Sample requests kept open per rollout actor.")
    broadcast_interval: int = Field(
        1,
        ge=1,
        description="Learner updates between weight broadcasts to the rollout actors (each actor gets the "
        "new weights with its next sample request).",
    )

    def fragment_length(self) -> int:
        """Steps per env per sample request: the V-trace sequence length T."""
        frag = self.rollout_fragment_length
        return frag if isinstance(frag, int) else DEFAULT_SEQUENCE_LENGTH


class LearnerGroupResources(ResourcesConfig):
    """IMPALA's and APPO's resources: the rollout actors', and the learner group's."""

    num_learners: int = Field(
        1,
        ge=1,
        description="Learner processes training data parallel (gradients all-reduced over torch.distributed: "
        "gloo on CPUs, NCCL on whole GPUs); 1: the learner thread in the driver. With more, each is a Ray actor, "
        "train_batch_size is split between them and rollout fragments reach them by object reference.",
    )
    num_cpus_per_learner: float = Field(1.0, gt=0, description="CPUs each learner process reserves (num_learners > 1).")
    num_gpus_per_learner: float = Field(
        0.0, ge=0, description="GPUs each learner process reserves (num_learners > 1); 0 trains on its CPUs."
    )
    learner_collective_timeout_s: float = Field(
        60.0,
        gt=0,
        description="num_learners > 1: how long a learner waits in a gradient all-reduce (and the group's "
        "rendezvous) for its peers before the round counts as failed and the group is re-formed.",
    )

    def learner_backend(self) -> str:
        """The learner group's torch.distributed backend: NCCL when each learner has a whole GPU, else gloo
        (which all-reduces GPU gradients through the host when learners share a GPU)."""
        return "nccl" if self.num_gpus_per_learner >= 1 else "gloo"


class LearnerThreadKeys(Section):
    """IMPALA's background learner thread, single- or multi-device (IMPALA, APPO)."""

    if TYPE_CHECKING:  # AlgorithmConfig's, which every config that takes this group has
        from shoal.config import ResourcesConfig

        resources: ResourcesConfig

    minibatch_buffer_size: int = Field(
        1, ge=1, description="Train batches in the learner's ring; they are learned interleaved."
    )
    learner_queue_size: int = Field(
        16,
        ge=1,
        description="Train batches waiting for the learner; when it is full, cut batches wait in the driver and "
        "no new sample request goes out until the learner catches up (none is dropped).",
    )
    learner_queue_timeout: float = Field(
        300.0, gt=0, description="Seconds the learner may wait for a batch before train() fails."
    )
    num_learner_devices: Optional[int] = Field(
        None,
        ge=1,
        description="Devices the learner splits each batch over; None: one per GPU in resources.num_gpus (at least 1).",
    )
    fake_devices: bool = Field(
        False, description="Run the learner devices as CPU stand-ins (tests, machines without GPUs)."
    )
    num_multi_gpu_tower_stacks: int = Field(
        1, ge=1, description="Multi-device learner: batches preloaded onto the devices."
    )
    num_data_load_threads: int = Field(1, ge=1, description="Multi-device learner: threads that preload the stacks.")

    def multi_device(self) -> bool:
        """Whether the learner is the multi-device one: several devices, or one GPU unless
        ``minibatch_buffer_size`` > 1 asks for the single-device thread's ring (which runs on that GPU)."""
        devices = self.learner_devices()
        return len(devices) > 1 or (devices[0] != "cpu" and self.minibatch_buffer_size == 1)

    def num_devices(self) -> int:
        return self.num_learner_devices or max(1, int(self.resources.num_gpus))

    def learner_devices(self) -> list[str]:
        n = self.num_devices()
        if self.fake_devices or self.resources.num_gpus <= 0:
            return ["cpu"] * n
        return [f"cuda:{i}" for i in range(n)]


# ---- checks that span groups: each config calls the ones that apply from its own validator --
def check_whole_sequences(cfg) -> None:
    """Train batches are whole V-trace sequences."""
    T = cfg.fragment_length()
    if cfg.train_batch_size % T:
        raise ValueError(
            f"train_batch_size ({cfg.train_batch_size}) must be a multiple of rollout_fragment_length "
            f"({T}): the learner trains on whole sequences"
        )


def check_learner_thread(cfg) -> None:
    """The learner devices exist and split the batch evenly; each thread's own keys only."""
    T, n, gpus = cfg.fragment_length(), cfg.num_devices(), cfg.resources.num_gpus
    if n > 1 and not cfg.fake_devices and n > int(gpus):
        raise ValueError(
            f"num_learner_devices ({n}) needs as many GPUs but resources.num_gpus is {gpus:g}; "
            "set fake_devices=true to run the devices on the CPU"
        )
    if (cfg.train_batch_size // T) % n:
        raise ValueError(
            f"train_batch_size ({cfg.train_batch_size}) holds {cfg.train_batch_size // T} sequences of "
            f"{T} steps, which do not divide evenly over {n} learner devices"
        )
    if n > 1 and cfg.minibatch_buffer_size != 1:
        raise ValueError(
            f"minibatch_buffer_size ({cfg.minibatch_buffer_size}) is a setting of the single-device "
            "learner thread; the multi-device learner (several devices) preloads "
            "num_multi_gpu_tower_stacks stacks instead: leave it at 1"
        )
    stacks = {
        k: getattr(cfg, k) for k in ("num_multi_gpu_tower_stacks", "num_data_load_threads") if getattr(cfg, k) != 1
    }
    if stacks and cfg.minibatch_buffer_size != 1 and cfg.learner_devices()[0] != "cpu":
        raise ValueError(
            f"{', '.join(f'{k} ({v})' for k, v in stacks.items())}: settings of the multi-device "
            f"learner, but minibatch_buffer_size ({cfg.minibatch_buffer_size}) runs one GPU with the "
            "single-device learner thread and its ring; set one or the other"
        )
    if stacks and not cfg.multi_device():
        raise ValueError(
            f"{', '.join(f'{k} ({v})' for k, v in stacks.items())}: settings of the multi-device learner, "
            "which runs only with several devices or a GPU (num_learner_devices, resources.num_gpus); "
            "the single-device learner thread uses minibatch_buffer_size instead"
        )


def check_learner_group(cfg) -> None:
    """``resources.num_learners`` > 1: what the learner group needs (see :mod:`shoal.framework.learner_group`);
    with a ``multi_agent`` section, each learning policy has a group of its own. Whether the
    learners fit (num learning policies x num_learners x num_cpus_per_learner, with the rollout
    actors) is checked against the cluster when the run reserves its placement group."""
    res = cfg.resources
    K = res.num_learners
    if K == 1:
        return
    why = f"resources.num_learners={K} (a learner group)"
    if res.num_workers < 1:
        raise ValueError(
            f"{why} needs remote rollout actors (resources.num_workers >= 1): their fragments go to the "
            "learners by object reference, which the driver's own sampling (num_workers=0) has none of"
        )
    if res.num_gpus > 0:
        raise ValueError(
            f"{why}: the driver does not train, so resources.num_gpus ({res.num_gpus:g}) would go unused; "
            "give each learner its GPU with resources.num_gpus_per_learner"
        )
    if cfg.num_learner_devices not in (None, 1) or cfg.fake_devices:
        raise ValueError(
            f"{why}: each learner trains on one device; num_learner_devices and fake_devices are settings of "
            "the multi-device learner in the driver (num_learners: 1)"
        )
    g = res.num_gpus_per_learner
    if g > 1:
        raise ValueError(f"{why}: resources.num_gpus_per_learner ({g:g}) above 1; each learner trains on one GPU")
    frag = cfg.fragment_length() * res.num_envs_per_worker
    if cfg.train_batch_size % (K * frag):
        raise ValueError(
            f"{why}: train_batch_size ({cfg.train_batch_size}) must split into whole rollout fragments "
            f"for each learner: a multiple of num_learners x rollout_fragment_length x "
            f"resources.num_envs_per_worker = {K} x {cfg.fragment_length()} x {res.num_envs_per_worker} = {K * frag}"
        )


# ---- multi-agent without a league (PPO, IMPALA, APPO) ----------------------------------------
class PolicyOverrides(Section):
    """One policy of a ``multi_agent`` section: what differs from the algorithm's own config."""

    model: dict[str, Any] = Field(
        default_factory=dict,
        description="Keys of the model section that differ for this policy (e.g. {hiddens: [128]}).",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Hyperparameters that differ for this policy's "
        "learner (lr, entropy_coeff, clip_param, num_sgd_iter, ...).",
    )


PER_RUN_KEYS = (
    "env",
    "env_config",
    "seed",
    "resources",
    "evaluation",
    "env_preprocessing",
    "rollout_fragment_length",
    "train_batch_size",
    "min_time_s_per_iteration",
    "min_env_steps_per_iteration",
    "multi_agent",
    "model",
    "max_requests_in_flight_per_worker",
    "broadcast_interval",
    "learner_queue_size",
    "learner_queue_timeout",
    "minibatch_buffer_size",
    "num_learner_devices",
    "fake_devices",
    "num_multi_gpu_tower_stacks",
    "num_data_load_threads",
)


class MultiAgentConfig(Section):
    """Several policies on a PettingZoo env (Parallel or AEC, any number of agents), without a league."""

    policies: dict[str, Optional[PolicyOverrides]] = Field(
        ..., description="Policy ids, each with optional model and hyperparameter overrides ({id: null} for none)."
    )
    policy_mapping: Union[str, dict[str, str], None] = Field(
        None,
        description="Which policy plays each agent: a dict agent -> policy id, or an import path to a function "
        "(agent_id, episode) -> policy_id called when each episode starts. None: the one policy plays every agent.",
    )
    policies_to_train: Optional[list[str]] = Field(
        None, description="The policies that learn; the others keep their initial weights. None: all of them."
    )

    @model_validator(mode="after")
    def _check_policies(self) -> "MultiAgentConfig":
        ids = list(self.policies)
        if not ids:
            raise ValueError("multi_agent.policies is empty: name at least one policy, e.g. {shared: null}")
        if self.policy_mapping is None and len(ids) > 1:
            raise ValueError(
                f"multi_agent.policy_mapping is needed with several policies ({', '.join(ids)}): a dict "
                "agent -> policy id, or an import path to a function (agent_id, episode) -> policy_id"
            )
        if isinstance(self.policy_mapping, dict):
            unknown = sorted(set(self.policy_mapping.values()) - set(ids))
            if unknown:
                raise ValueError(
                    f"multi_agent.policy_mapping maps agents to unknown policies {unknown}; policies: {', '.join(ids)}"
                )
        elif isinstance(self.policy_mapping, str):
            from shoal.imports import import_path

            try:
                fn = import_path(self.policy_mapping)
            except (ImportError, AttributeError, ValueError) as e:
                raise ValueError(
                    f"multi_agent.policy_mapping '{self.policy_mapping}' cannot be imported: {e}"
                ) from None
            if not callable(fn):
                raise ValueError(f"multi_agent.policy_mapping '{self.policy_mapping}' is not callable")
        if self.policies_to_train is not None:
            unknown = sorted(set(self.policies_to_train) - set(ids))
            if unknown:
                raise ValueError(
                    f"multi_agent.policies_to_train names unknown policies {unknown}; policies: {', '.join(ids)}"
                )
            if not self.policies_to_train:
                raise ValueError("multi_agent.policies_to_train is empty: at least one policy must learn")
        return self

    def trained(self) -> list[str]:
        return list(self.policies_to_train) if self.policies_to_train is not None else list(self.policies)


class MultiAgentKeys(Section):
    """The ``multi_agent`` section (PPO, IMPALA, APPO): see :mod:`shoal.framework.multi_agent`."""

    multi_agent: Optional[MultiAgentConfig] = Field(
        None,
        description="Several policies on a PettingZoo env (Parallel or AEC, any number of agents): policies, "
        "policy_mapping, policies_to_train. None: a single-agent Gymnasium env.",
    )


# what IMPALA and APPO also fix for the whole run: one learner thread trains every policy
ASYNC_PER_RUN_KEYS = PER_RUN_KEYS + ("num_sgd_iter",)


def check_multi_agent(config, per_run_keys: tuple[str, ...] = PER_RUN_KEYS) -> None:
    """Each policy's overrides make a valid config of the algorithm, and change no ``per_run_keys``."""
    ma = config.multi_agent
    if ma is None:
        return
    for pid, spec in ma.policies.items():
        if spec is None:
            continue
        bad = sorted(set(spec.config) & set(per_run_keys))
        if bad:
            raise ValueError(
                f"multi_agent.policies.{pid}.config sets {bad[0]}, which is one per run, not per policy "
                "(per-policy model keys go in multi_agent.policies.<id>.model)"
            )
        try:
            policy_config(config, pid)
        except Exception as e:  # a ConfigError naming the key, said for this policy
            msg = str(e).removeprefix(f"Invalid {type(config).__name__}: ").rstrip(".")
            raise ValueError(f"multi_agent.policies.{pid}: {msg}") from None


def policy_config(config, pid: str):
    """The algorithm's config as policy ``pid`` learns with it: its overrides applied, no multi_agent."""
    spec = config.multi_agent.policies[pid]
    data = config.to_dict()
    data.pop("multi_agent", None)
    if spec is not None:
        data.update(spec.config)
        data["model"] = {**data.get("model", {}), **spec.model}
    return type(config).from_dict(data)
