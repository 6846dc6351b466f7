"""Typed, validated configs.

Every algorithm has one pydantic model (``extra="forbid"``) made of hyperparameters plus
sections: ``resources`` (workers, envs, CPUs, GPUs: where things run), ``model`` (network
shape) and ``evaluation``. Validation happens once, in the constructor, before anything
starts; errors are :class:`~shoal.errors.ConfigError` with one readable paragraph that
names the key and what is allowed, and suggests the closest valid key for a misspelling.

Overrides come from YAML files and ``key=value`` strings (dotted keys reach into sections:
``resources.num_workers=2``).

Some keys a user may expect mean nothing to an algorithm: an inherited one (Ape-X's fixed
per-actor epsilons make DQN's epsilon schedule meaningless), or a key of a sibling algorithm
that this one does not have (DD-PPO has no KL penalty, which PPO has). A class lists them in
``unused_keys`` (key -> why), which every section and config has: giving one (constructor,
YAML, ``--set``, assignment) is a ConfigError naming the key, the algorithm and the reason,
instead of "unknown key". An inherited one is left out of ``to_dict()`` (so of config.yaml and
checkpoints) and of the valid keys that error messages list, and keeps its default for code
shared with the parent. A checkpoint written before a key was declared unused still loads
(``without_unused``).
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Iterable, Literal, Optional, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from shoal.errors import ConfigError
from shoal.files import YamlRefused, redact_secrets, safe_yaml
from shoal.imports import import_path
from shoal.seeding import MAX_SEED

if TYPE_CHECKING:
    from shoal.algorithms.base import Algorithm


def _schedule_points(key: str, value: str) -> Callable[[Any], Any]:
    """Before validation: each point of schedule ``key`` is a pair [env_steps, ``value``]."""

    def check(v: Any) -> Any:
        for i, point in enumerate(v if isinstance(v, (list, tuple)) else []):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ValueError(
                    f"{key}[{i}] is {point!r}; each point is [env_steps, {value}], e.g. [[0, 0.001], [100000, 0.0001]]"
                )
        return v

    return check


def _schedule_order(key: str, value: str) -> Callable[[Any], Any]:
    """After validation: at least one point, env steps increasing from >= 0, values finite and >= 0."""

    def check(v: Any) -> Any:
        if v is not None:
            if not v:
                raise ValueError(f"{key} needs at least one [env_steps, {value}] point")
            steps = [s for s, _ in v]
            if steps != sorted(steps) or steps[0] < 0:
                raise ValueError(f"{key} points must have non-negative, increasing env_steps")
            if any(not (0 <= y < math.inf) for _, y in v):
                raise ValueError(f"{key} values must be finite numbers >= 0")
        return v

    return check


# piecewise-linear schedules over sampled env steps, [[env_steps, value], ...] or None
LRSchedule = Annotated[
    Optional[list[tuple[int, float]]],
    BeforeValidator(_schedule_points("lr_schedule", "lr")),
    AfterValidator(_schedule_order("lr_schedule", "lr")),
]
EntropySchedule = Annotated[  # the key of every config with an entropy bonus (PPO's and V-trace's groups)
    Optional[list[tuple[int, float]]],
    BeforeValidator(_schedule_points("entropy_coeff_schedule", "entropy_coeff")),
    AfterValidator(_schedule_order("entropy_coeff_schedule", "entropy_coeff")),
    Field(
        description="Piecewise-linear [[env_steps, entropy_coeff], ...] over sampled env steps; overrides "
        "entropy_coeff when set."
    ),
]

EnvSpec = Union[str, Callable[..., Any]]


class Section(BaseModel):
    """A config section: strict keys, validated on assignment too; ``unused_keys`` refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # no inf or NaN value
    unused_keys: ClassVar[
        dict[str, str]
    ] = {}  # refused key (inherited, or a sibling's) -> why this class does not use it

    def __init__(self, **data: Any) -> None:
        given = unused_keys_given(type(self), data)
        if given:
            raise ConfigError(f"Invalid {type(self).__name__}: " + " ".join(given))
        super().__init__(**data)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).unused_keys:
            raise ConfigError(f"Invalid {type(self).__name__}: {_unused_message(type(self), name)}")
        missing = object()
        old = self.__dict__.get(name, missing)
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            # pydantic has already stored the value when a model validator rejects it: undo that.
            if old is not missing:
                self.__dict__[name] = old
            raise ConfigError(format_validation_error(type(self), e)) from None


class ResourcesConfig(Section):
    """Where things run. Kept apart from hyperparameters."""

    num_workers: int = Field(
        0, ge=0, description="Remote rollout actors; 0 samples in the driver without starting Ray."
    )
    num_envs_per_worker: int = Field(8, ge=1, description="Vectorized envs per rollout actor (or in the driver).")
    num_cpus_per_worker: float = Field(
        1.0, gt=0, description="CPUs each rollout actor reserves; fractions let more actors than cores run."
    )
    num_gpus: float = Field(0.0, ge=0, description="GPUs for the learner in the driver.")
    torch_threads: int = Field(1, ge=1, description="torch.set_num_threads in every worker and learner process.")
    retain_freed_memory: bool = Field(
        True,
        description="Every shoal process keeps freed memory below 32 MB for reuse (glibc "
        "mallopt) instead of returning it to the kernel: no page faults per minibatch.",
    )
    address: Optional[str] = Field(
        None,
        description="Ray address: None starts a local instance; 'auto', 'host:port' (the GCS) or 'ray://host:port' connects.",
    )
    max_worker_restarts: int = Field(
        100,
        ge=0,
        description="Restarts of failed actors (of one kind) allowed in any "
        "worker_restart_window_s seconds; one more stops the run with a WorkerError.",
    )
    worker_restart_window_s: float = Field(
        600.0,
        gt=0,
        description="The rolling window of max_worker_restarts: only restarts within the last this many seconds count.",
    )
    request_timeout_s: Optional[float] = Field(
        600.0,
        gt=0,
        description="Seconds any request to a Ray actor (a rollout fragment, a DD-PPO round, a replay "
        "sample, a learner update, an evaluation) may stay unanswered before its actor counts as hung (an env stuck in "
        "step): it is killed and recreated like a dead one (num_worker_timeouts, num_worker_restarts). Healthy "
        "requests take seconds; raise it for envs slower than that. DD-PPO waits at least twice "
        "torch_distributed_timeout_s. null: wait forever.",
    )
    actor_start_timeout_s: Optional[float] = Field(
        300.0,
        gt=0,
        description="Seconds a new or recreated Ray actor may take to start (process start, imports, "
        "building its envs) while a request waits on it; longer counts as hung (an env constructor stuck) and it is "
        "killed and recreated like a dead one; three such timeouts in a row of one actor stop the run with a "
        "WorkerError. null: wait forever.",
    )
    resource_wait_s: float = Field(
        30.0,
        gt=0,
        description="Seconds to wait for the cluster to grant the placement group, "
        "and, when an actor of a lost node is recreated, for its share to be re-placed.",
    )
    worker_placement: Literal["PACK", "SPREAD"] = Field(
        "PACK",
        description="How rollout actors spread over a cluster's nodes: 'PACK' fills as few nodes as fit them, "
        "'SPREAD' puts each on a different node where it can (so one lost node takes fewer of them).",
    )

    @field_validator("address")
    @classmethod
    def _address_form(cls, v: Optional[str]) -> Optional[str]:
        if v is None or v in ("auto", "local"):
            return v
        host, sep, port = v.removeprefix("ray://").rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(
                "the Ray address must be 'auto', 'host:port' or 'ray://host:port' with a port "
                "from 1 to 65535 (None starts a local Ray instance)"
            )
        return v


class ModelConfig(Section):
    """The network: torso, MLP layers, an optional LSTM core, or a custom module by import path."""

    hiddens: list[int] = Field(default_factory=lambda: [64, 64], description="Hidden layer sizes of each MLP.")
    activation: str = Field("tanh", description="tanh, relu or elu.")
    vf_share_layers: bool = Field(False, description="Share the hidden layers between policy and value heads.")
    init_log_std: float = Field(0.0, description="Initial log std of the diagonal Gaussian (Box actions).")
    conv_filters: list[list[int]] = Field(
        default_factory=list,
        description="Conv layers [out_channels, kernel, stride] (no padding) of the 'conv' torso, "
        "for image-like (H, W, C) or (C, H, W) Box observations; empty: no such torso.",
    )
    torso: Literal["auto", "mlp", "nature_cnn", "impala_cnn", "conv"] = Field(
        "auto",
        description="What sees the observation before the MLPs (hiddens): 'mlp' nothing (flat rows); 'nature_cnn' "
        "the DQN Nature network (3 convs, dense 512); 'impala_cnn' IMPALA's residual network (15 convs, dense 256); "
        "'conv' the conv_filters layers. 'auto': conv when conv_filters is set, nature_cnn for a 3-d uint8 Box "
        "observation of frames at least 36x36, mlp otherwise. CNN torsos scale uint8 observations to [0, 1].",
    )
    frame_layout: Literal["auto", "channels_first", "channels_last"] = Field(
        "auto",
        description="Axis order of image observations for CNN torsos: (C, H, W) or (H, W, C). 'auto' takes "
        "the first or last axis as the channels when it is at most 16 long and shorter than the other two.",
    )

    custom: Optional[str] = Field(
        None,
        description="Your own network, 'package.module:ClassName', built as "
        "ClassName(obs_space, action_space, num_outputs, **custom_kwargs) in every process "
        "(the protocol: shoal.models.custom). Replaces the network the keys above describe.",
    )
    custom_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the model.custom class."
    )
    use_lstm: bool = Field(
        False,
        description="Recurrent policy and value: an LSTM after the MLP (hiddens), its state "
        "carried across steps and reset at episode starts. PPO, DD-PPO, IMPALA, APPO and "
        "alpha_star; not DQN or Ape-X.",
    )
    lstm_cell_size: int = Field(
        256, ge=1, description="Units of the LSTM (use_lstm); the state is twice that per network (h and c)."
    )
    max_seq_len: int = Field(
        32,
        ge=1,
        description="PPO and DD-PPO with use_lstm: steps per training sequence (the "
        "runner records the state every max_seq_len steps; gradients flow within a sequence). "
        "rollout_fragment_length must be a multiple of it. IMPALA, APPO and alpha_star unroll "
        "whole fragments instead.",
    )

    @field_validator("hiddens")
    @classmethod
    def _positive_sizes(cls, v: list[int]) -> list[int]:
        bad = [h for h in v if h < 1]
        if bad:
            raise ValueError(
                f"every hidden layer size must be a positive integer (e.g. [64, 64]; [] for none), but {bad[0]} is not"
            )
        return v

    @field_validator("activation")
    @classmethod
    def _known_activation(cls, v: str) -> str:
        allowed = ("tanh", "relu", "elu")
        if v not in allowed:
            raise ValueError(f"activation must be one of {', '.join(allowed)}")
        return v

    @field_validator("conv_filters")
    @classmethod
    def _conv_triples(cls, v: list[list[int]]) -> list[list[int]]:
        for i, f in enumerate(v):
            if len(f) != 3 or any(x < 1 for x in f):
                raise ValueError(
                    f"conv_filters[{i}] is {f}; each layer is [out_channels, kernel, stride], three positive integers"
                )
        return v

    @model_validator(mode="after")
    def _lstm_keys_need_lstm(self) -> "ModelConfig":
        if self.custom is not None:
            return self
        stray = self.changed({"lstm_cell_size", "max_seq_len"})
        if stray and not self.use_lstm:
            raise ValueError(
                f"model.{stray[0]} is set but model.use_lstm is false: it sizes the LSTM's state and "
                "sequences. Set model.use_lstm: true, or leave it out"
            )
        return self

    @model_validator(mode="after")
    def _custom_model(self) -> "ModelConfig":
        if self.custom is None:
            if self.custom_kwargs:
                raise ValueError(
                    "model.custom_kwargs is set but model.custom is not: they are the arguments of a "
                    "custom model class. Set model.custom: 'package.module:ClassName', or leave them out"
                )
            return self
        from shoal.models.custom import load_custom_class

        cls = load_custom_class(self.custom)  # a clear error now, before anything starts
        builtin = self.changed(
            {
                "hiddens",
                "activation",
                "vf_share_layers",
                "init_log_std",
                "conv_filters",
                "torso",
                "frame_layout",
                "use_lstm",
                "lstm_cell_size",
            }
        )
        if builtin:
            raise ValueError(
                f"model.{builtin[0]} describes shoal's own network, which model.custom "
                f"('{self.custom}') replaces: pass your class's settings in model.custom_kwargs "
                "instead"
            )
        if self.changed({"max_seq_len"}) and not getattr(cls, "recurrent", False):
            raise ValueError(
                f"model.max_seq_len is set, but model.custom '{self.custom}' is not recurrent (its class "
                "has no recurrent = True): leave it out"
            )
        return self

    def changed(self, keys: set[str]) -> list[str]:
        """Those of ``keys`` whose value is not the default (a saved config lists defaults too)."""
        return sorted(
            k for k in keys if getattr(self, k) != type(self).model_fields[k].get_default(call_default_factory=True)
        )

    def is_recurrent(self) -> bool:
        """Whether the model carries state: ``use_lstm``, or a custom class with ``recurrent = True``."""
        if self.custom is not None:
            from shoal.models.custom import load_custom_class

            return bool(getattr(load_custom_class(self.custom), "recurrent", False))
        return self.use_lstm

    @model_validator(mode="after")
    def _filters_need_conv_torso(self) -> "ModelConfig":
        if self.conv_filters and self.torso not in ("auto", "conv"):
            raise ValueError(
                f"model.conv_filters is set, but model.torso is '{self.torso}': conv_filters are the "
                "layers of the 'conv' torso. Set model.torso to conv (or auto), or leave "
                "model.conv_filters empty"
            )
        return self


class EnvPreprocessingConfig(Section):
    """How frames of an Atari (ALE) env become observations: DeepMind's standard preprocessing.

    Applies to envs whose Gymnasium id is an ALE game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``);
    setting a key for any other env is an error. Observations are ``frame_stack`` uint8 frames of
    ``screen_size`` x ``screen_size`` grayscale pixels, channel-first. Reported episode returns
    are always the raw game score over whole games.
    """

    backend: Literal["auto", "ale_vector", "gymnasium"] = Field(
        "auto",
        description="auto (ale_vector), ale_vector (ale-py's threaded vector env, preprocessing in C++) or "
        "gymnasium (Gymnasium's AtariPreprocessing and FrameStackObservation wrappers in a sync vector env).",
    )
    noop_max: int = Field(30, ge=0, description="Up to this many no-op actions after each reset (random count).")
    frame_skip: int = Field(4, ge=1, description="Emulator frames per agent step (the action repeats).")
    max_pool: bool = Field(
        True,
        description="Each observation is the pixel-wise max of the last two frames of a skip (Atari sprites flicker).",
    )
    screen_size: int = Field(84, ge=8, description="Frames are resized to screen_size x screen_size grayscale.")
    frame_stack: int = Field(4, ge=1, description="The last frame_stack frames form one observation.")
    episodic_life: bool = Field(
        False,
        description="A lost life ends the episode for learning (no bootstrap across it); "
        "the game, and its reported return, go on.",
    )
    fire_reset: Union[Literal["auto"], bool] = Field(
        "auto",
        description="Press FIRE where a game waits for it: FIRE then action 2 at the start of each game, FIRE "
        "after each lost life. auto: for games whose action 1 is FIRE (Breakout, Pong, ...); true for another is an error.",
    )
    clip_rewards: bool = Field(
        True, description="Learn from the sign of each reward (-1, 0, +1); reported returns stay raw game scores."
    )
    repeat_action_probability: Optional[float] = Field(
        None, ge=0, le=1, description="Sticky actions; None keeps the id's own (0.25 for v5 ids, 0 for NoFrameskip-v4)."
    )
    max_episode_frames: Optional[int] = Field(
        None,
        ge=1,
        description="Emulator frames before an episode is truncated; None keeps the id's own (108,000 for v5).",
    )
    num_threads: int = Field(
        1,
        ge=1,
        description="Threads of the ale_vector back end per vector env (one per CPU "
        "the rollout actor reserves is a good choice).",
    )

    @model_validator(mode="after")
    def _backend_supports(self):
        if self.backend == "gymnasium":
            if not self.max_pool:
                raise ValueError(
                    "the gymnasium back end always max-pools the last two frames; use backend "
                    "ale_vector for max_pool: false"
                )
            if self.num_threads != 1:
                raise ValueError("num_threads applies to the ale_vector back end only")
        return self

    def resolved_backend(self) -> str:
        return "ale_vector" if self.backend == "auto" else self.backend


class NormalizeConfig(Section):
    """Observation and reward normalization by running statistics (shoal.envs.normalize).

    Each rollout actor gathers running means and variances; the driver merges them by counts
    and sends the merged ones back with the weights. They are saved in checkpoints and used,
    frozen, wherever the policy acts outside training (evaluation, ``predict``, ``load_policy``).
    Reported episode returns are always the env's raw rewards.
    """

    obs: bool = Field(
        False,
        description="Feed the policy (obs - running mean) / running std of each observation "
        "feature, clipped to clip_obs. Box observations of floats only (not uint8 frames).",
    )
    reward: bool = Field(
        False,
        description="Learn from rewards divided by the running std of the discounted "
        "return (gamma), clipped to clip_reward; reported returns stay raw.",
    )
    clip_obs: float = Field(10.0, gt=0, description="Normalized observations are clipped to [-clip_obs, clip_obs].")
    clip_reward: float = Field(10.0, gt=0, description="Scaled rewards are clipped to [-clip_reward, clip_reward].")
    gamma: Optional[float] = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Discount of the return whose std scales rewards; None: the algorithm's gamma.",
    )
    epsilon: float = Field(
        1e-8, gt=0, description="Added to the variance before the square root (no division by zero)."
    )

    @model_validator(mode="after")
    def _keys_need_a_switch(self) -> "NormalizeConfig":
        defaults = {k: f.get_default() for k, f in type(self).model_fields.items()}
        needs = {"clip_obs": "obs", "clip_reward": "reward", "gamma": "reward"}
        for key, switch in needs.items():
            if getattr(self, key) != defaults[key] and not getattr(self, switch):
                raise ValueError(
                    f"normalize.{key} is set but normalize.{switch} is false: it applies to "
                    f"{switch} normalization only. Set normalize.{switch}: true, or leave it out"
                )
        if self.epsilon != defaults["epsilon"] and not (self.obs or self.reward):
            raise ValueError("normalize.epsilon is set but neither normalize.obs nor normalize.reward is true")
        return self

    def enabled(self) -> bool:
        return self.obs or self.reward


class EvaluationConfig(Section):
    """Greedy evaluation episodes during training, every ``evaluation_interval`` iterations."""

    evaluation_interval: Optional[int] = Field(None, ge=1, description="Evaluate every N iterations; None never.")
    evaluation_num_workers: int = Field(0, ge=0, description="Separate evaluation actors; 0 evaluates in the driver.")
    evaluation_num_episodes: int = Field(10, ge=1, description="Greedy episodes per evaluation.")


class WandbConfig(Section):
    """Weights & Biases settings (used when ``logging.writers`` lists wandb)."""

    project: str = Field("shoal", description="W&B project the run goes to.")
    entity: Optional[str] = Field(None, description="W&B entity (user or team); None: your default entity.")
    group: Optional[str] = Field(None, description="W&B group that gathers related runs.")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="offline writes under the run directory (upload later with `wandb sync`); online "
        "streams to the W&B server; disabled logs nothing.",
    )
    tags: list[str] = Field(default_factory=list, description="W&B tags of the run.")


class MlflowConfig(Section):
    """MLflow settings (used when ``logging.writers`` lists mlflow)."""

    tracking_uri: Optional[str] = Field(
        None, description="MLflow tracking URI; None: a file store in the run directory's mlruns/ folder."
    )
    experiment_name: str = Field("shoal", description="MLflow experiment the run is filed under (created if missing).")


LOGGER_EXTRAS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}  # writer -> (module, pip extra)


WriterName = Literal["tensorboard", "wandb", "mlflow"]


def _default_writers() -> list[WriterName]:
    return ["tensorboard"]


class LoggingConfig(Section):
    """Where each iteration's result goes besides results.jsonl and progress.csv (always written)."""

    writers: list[WriterName] = Field(
        default_factory=_default_writers,
        description="Loggers of the run directory: any of tensorboard, "
        "wandb (pip install -e '.[wandb]' in the shoal checkout), mlflow (pip install -e '.[mlflow]').",
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases settings.")
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="MLflow settings.")

    @model_validator(mode="after")
    def _settings_need_writer(self) -> "LoggingConfig":
        for name in ("wandb", "mlflow"):
            if name not in self.writers and getattr(self, name) != type(getattr(self, name))():
                raise ValueError(
                    f"logging.{name} settings are given but logging.writers does not list {name}: "
                    f"add {name} to logging.writers, or leave logging.{name} out"
                )
        return self

    def check_installed(self) -> None:
        """A ConfigError naming the extra to install for each chosen logger whose package is missing."""
        import importlib.util

        for name in self.writers:
            module, extra = LOGGER_EXTRAS.get(name, (None, None))
            if module and importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"logging.writers lists {name}, but the {module} package is not installed: "
                    f"pip install -e '.[{extra}]' in the shoal checkout, or remove {name} from logging.writers."
                )


class AlgorithmConfig(Section):
    """Fields every algorithm shares. Subclasses add their hyperparameters and may override the
    hooks declared here (``min_workers``, ``small_machine_preset()``, ``epsilon_schedule()``)."""

    algo: ClassVar[str] = ""
    min_workers: ClassVar[int] = 0
    """The fewest rollout workers (``resources.num_workers``) the algorithm can run with. With 0,
    ``shoal evaluate`` restores a run with no workers and evaluates in the driver; an algorithm
    whose workers are its learners (DD-PPO: 1) keeps the saved number, and starts none to evaluate."""
    lstm_sequences: ClassVar[Optional[str]] = None
    """How the algorithm trains a recurrent model (``model.use_lstm``): ``"max_seq_len"`` (sequences
    of ``model.max_seq_len`` steps), ``"fragments"`` (whole rollout fragments) or None (it cannot;
    ``lstm_refusal`` says why)."""
    lstm_refusal: ClassVar[str] = "this algorithm has no recurrent models"
    mutable_keys: ClassVar[frozenset[str]] = frozenset({"lr", "grad_clip"})
    """Keys a run can change mid-run (``Algorithm.update_config``; what Tune's PBT may perturb):
    values the driver's learner reads at each update. Keys that shape buffers, actors or the
    network (batch sizes, ``gamma``, which the rollout actors' postprocessing bakes in, the
    model) are not in it."""
    box_action_defaults: ClassVar[dict[str, Any]] = {}
    """Defaults for an env with ``Box`` (continuous) actions, by dotted key, where they differ from
    the class's: applied when the run is built (:meth:`for_env`) to the keys the config leaves
    unset, and shown beside the plain defaults by ``shoal config``."""
    algorithm_cls: ClassVar[Optional[type[Algorithm]]] = None
    """The :class:`~shoal.algorithms.base.Algorithm` subclass that ``build()`` makes. An algorithm
    class that names this class as its ``config_cls`` sets it when it is defined, so importing
    an algorithm's module (as the registry does to find its config class) registers it."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    env: EnvSpec = Field(
        ..., description="Gymnasium id, 'module:callable' import path, or a callable returning an env."
    )
    env_config: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the env constructor.")
    seed: Optional[int] = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="Seed for torch, numpy and the envs; runs with "
        "num_workers=0 are then reproducible. A whole number from 0 to 2,130,706,431.",
    )
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount factor of future rewards.")
    lr: float = Field(3e-4, gt=0, allow_inf_nan=False, description="Adam learning rate (lr_schedule overrides it).")
    lr_schedule: LRSchedule = Field(None, description="Piecewise-linear [[env_steps, lr], ...]; overrides lr when set.")
    grad_clip: Optional[float] = Field(0.5, gt=0, description="Global gradient-norm clip; None disables.")
    max_consecutive_env_failures: int = Field(
        5,
        ge=1,
        description="An env that raises in step/reset is recreated, its fragment dropped (num_env_failures); "
        "this many failures in a row, with no fragment sampled between them, stop the run with an EnvFailureError.",
    )
    max_nonfinite_updates: int = Field(
        20,
        ge=1,
        description="Learner updates with a NaN/inf loss or gradient are skipped; this many in a row stop "
        "the run with a DivergenceError (counted in num_nonfinite_updates_skipped).",
    )
    rollout_fragment_length: Union[int, str] = Field("auto", description="Steps per env per sample call, or 'auto'.")
    min_time_s_per_iteration: float = Field(
        0.0, ge=0, description="An iteration repeats training steps until it has lasted this long."
    )
    min_env_steps_per_iteration: int = Field(
        0, ge=0, description="An iteration repeats training steps until it has sampled this many env steps."
    )
    episode_window: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Finished episodes averaged into episode_return_mean (and its min, max and episode_len_mean): "
        "the figure stop.reward reads.",
    )
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig,
        description="Where things run: rollout actors, envs per actor, CPUs, GPUs, Ray address.",
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The network: torso, hidden layers, LSTM, or a custom class."
    )
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="Greedy evaluation episodes during training."
    )
    env_preprocessing: EnvPreprocessingConfig = Field(
        default_factory=EnvPreprocessingConfig, description="Frame preprocessing for Atari (ALE) envs."
    )
    normalize: NormalizeConfig = Field(
        default_factory=NormalizeConfig,
        description="Observation and reward normalization by running mean and std, saved in checkpoints.",
    )
    callbacks: Optional[Union[str, type]] = Field(
        None,
        description="Your hooks, a shoal.Callbacks subclass: 'package.module:ClassName' (or the class, in "
        "Python); built with no arguments in the driver and in every rollout actor. See docs/guide/callbacks.md.",
    )
    logging: LoggingConfig = Field(
        default_factory=LoggingConfig,
        description="Loggers besides results.jsonl and progress.csv: TensorBoard, Weights & Biases, MLflow.",
    )

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(format_validation_error(type(self), e)) from None

    @field_validator("rollout_fragment_length")
    @classmethod
    def _fragment(cls, v: Union[int, str]) -> Union[int, str]:
        if v == "auto" or (isinstance(v, int) and v >= 1):
            return v
        raise ValueError("rollout_fragment_length must be a positive integer or 'auto'")

    @field_validator("callbacks")
    @classmethod
    def _callbacks_class(cls, v: Any) -> Any:
        if v is not None:
            from shoal.callbacks import resolve_callbacks

            resolve_callbacks(v)  # importable, a Callbacks subclass, builds with no arguments
        return v

    @model_validator(mode="after")
    def _check_recurrent(self):
        model = self.model
        if not model.is_recurrent():
            return self
        name = type(self).algo or type(self).__name__
        if self.lstm_sequences is None:
            what = "model.use_lstm" if model.custom is None else f"a recurrent model.custom ('{model.custom}')"
            raise ValueError(f"{what} is not supported by {name}: {self.lstm_refusal}")
        if self.lstm_sequences == "fragments" and model.changed({"max_seq_len"}):
            raise ValueError(
                f"model.max_seq_len is not used by {name}: it unrolls the LSTM over whole fragments; "
                "set rollout_fragment_length for the sequence length instead"
            )
        if self.lstm_sequences == "max_seq_len" and isinstance(self.rollout_fragment_length, int):
            if self.rollout_fragment_length % model.max_seq_len:
                raise ValueError(
                    f"rollout_fragment_length ({self.rollout_fragment_length}) must be a multiple of "
                    f"model.max_seq_len ({model.max_seq_len}) with a recurrent model: each fragment is "
                    "cut into whole training sequences"
                )
        return self

    def fragment_length(self) -> int:
        """Steps per env per sample request: ``rollout_fragment_length``. What 'auto' means is the
        algorithm's (PPO: the train batch over the envs; IMPALA: the V-trace sequence length; the
        Q-learners: 16 steps), so a config class that allows 'auto' overrides this; the base has
        no rule for it and raises a ConfigError."""
        frag = self.rollout_fragment_length
        if isinstance(frag, int):
            return frag
        raise ConfigError(
            f"rollout_fragment_length is {frag!r}, but {type(self).__name__} does not say what that means: "
            "set rollout_fragment_length to a number of steps, or define fragment_length() on the config "
            "class to resolve it."
        )

    def state_sequence_length(self) -> int:
        """Steps per training sequence of a recurrent model: the runner records the state at each
        sequence's start (``model.max_seq_len``, or the whole fragment)."""
        if self.lstm_sequences == "max_seq_len":
            return self.model.max_seq_len
        return self.fragment_length()

    # ---- API -----------------------------------------------------------------------
    def build(self):
        """Validate the env and build the algorithm this config describes."""
        algorithm_cls, name = type(self).algorithm_cls, type(self).__name__
        # A config subclass with an algo name of its own but no algorithm inherits its parent's: refuse that one.
        if algorithm_cls is None or algorithm_cls.config_cls.algo != self.algo:
            raise ConfigError(
                f"No algorithm builds {name} (algo '{self.algo}'): an Algorithm subclass becomes "
                f"its builder by setting config_cls = {name}."
            )
        return algorithm_cls(self)

    def env_name(self) -> str:
        return env_spec_name(self.env)

    # ---- hooks for subclasses -------------------------------------------------------------
    @classmethod
    def small_machine_preset(cls) -> Optional[dict[str, Any]]:
        """Config keys ``shoal train`` starts from when the user gives no resources, or None.

        A nested dict like a YAML file's (``{"resources": {...}, "lr": ...}``) for an algorithm
        whose defaults do not suit a small machine (Ape-X); any resources setting the user gives
        (flag, ``--set`` or config file) means the defaults are used instead. None: no preset.
        """
        return None

    def epsilon_schedule(self) -> Optional[list[tuple[int, float]]]:
        """Epsilon-greedy exploration annealed over sampled env steps, as piecewise-linear
        ``[(env_steps, epsilon), ...]`` points (DQN), or None for no schedule: a Q policy then keeps
        the epsilon it is given (Ape-X's fixed per-actor values), and other policies never ask."""
        return None

    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        """Plain data (YAML/JSON-safe), less unused keys; a callable env becomes its import path.
        ``redact``: passwords inside URLs (``https://user:secret@host``) become ``***``, as in every
        file shoal writes (config.yaml, checkpoints, logger params)."""
        d = self.model_dump(mode="python", exclude=_unused_tree(type(self)) or None)
        if redact:
            d = redact_secrets(d)
        d["env"] = env_spec_to_str(self.env)
        for key in ("lr_schedule", "entropy_coeff_schedule"):  # tuples to YAML lists
            if key in d:
                d[key] = [list(p) for p in d[key]] if d[key] else None
        if "callbacks" in d:
            from shoal.callbacks import callbacks_to_str

            d["callbacks"] = callbacks_to_str(self.callbacks)
        return d

    def to_yaml(self) -> str:
        """The config as a YAML document with every key that applies (what a run's ``config.yaml``
        holds): ``env_preprocessing``, Atari's frame preprocessing, is left out for another env while
        it holds its defaults (a non-default value there is refused for such an env anyway)."""
        from shoal.gym_ids import is_ale_id

        data = self.to_dict(redact=True)
        if not is_ale_id(self.env) and self.env_preprocessing == type(self.env_preprocessing)():
            data.pop("env_preprocessing", None)
        return yaml.safe_dump({"algo": self.algo, **data}, sort_keys=False)

    def for_env(self, observation_space: Any, action_space: Any) -> "AlgorithmConfig":
        """This config with the defaults that depend on the env's spaces filled in: for ``Box``
        actions the ``box_action_defaults`` of keys it leaves unset (a single-agent env only; the
        keys it sets stay as they are). Itself when nothing changes."""
        import gymnasium as gym

        if not self.box_action_defaults or not isinstance(action_space, gym.spaces.Box):
            return self
        if getattr(self, "multi_agent", None) is not None:
            return self
        data = self.model_dump(exclude_unset=True)
        changed = False
        for dotted, value in self.box_action_defaults.items():
            *sections, key = dotted.split(".")
            holder: Any = self
            for name in sections:
                holder = getattr(holder, name)
            if key in holder.model_fields_set:
                continue
            target = data
            for name in sections:
                target = target.setdefault(name, {})
            target[key] = value
            changed = True
        return type(self).model_validate(data) if changed else self

    def copy_with(self, overrides: dict[str, Any] | None = None, /, **changes: Any) -> "AlgorithmConfig":
        """A new config with nested overrides applied, validated as the constructor validates:
        ``copy_with({"resources": {"num_workers": 2}})``, ``copy_with(lr=1e-4, resources={...})``
        or both (keywords last). A section given as a dict is merged into the current one."""
        return type(self).from_dict(deep_merge(deep_merge(self.to_dict(), overrides or {}), changes))

    @classmethod
    def without_unused(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` less the keys this class declares unused, sections included: for a config
        saved before they were declared (a checkpoint's), on which they never had an effect."""
        return _drop_unused(cls, data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AlgorithmConfig":
        """A validated config from plain data (``to_dict``'s, or a YAML file's); an ``algo`` entry
        must name this class's algorithm."""
        data = dict(data)
        algo = data.pop("algo", cls.algo)
        if algo != cls.algo:
            raise ConfigError(f"This config is for algorithm '{algo}', not '{cls.algo}'.")
        return cls(**data)


# ---- env specs -------------------------------------------------------------------------
def env_spec_to_str(env: EnvSpec) -> str:
    if isinstance(env, str):
        return env
    mod, qual = getattr(env, "__module__", None), getattr(env, "__qualname__", None)
    if mod and qual and "<" not in qual:
        return f"{mod}:{qual}"
    return repr(env)


GENERIC_FACTORY_NAMES = frozenset({"make", "make_env", "env", "parallel_env", "raw_env", "create", "build"})
"""Factory names that say nothing of the env: an import path's name then leads with what holds it."""


def env_spec_name(env: EnvSpec) -> str:
    """A short name for run directories and titles: the Gymnasium id (``ALE/Pong-v5`` ->
    ``ALE_Pong-v5``), or the function or class name of an import path or callable
    (``my_pkg.envs:make_maze`` -> ``make_maze``; a lambda is ``lambda``, a ``functools.partial``
    its function's name). An import path to a generic factory (:data:`GENERIC_FACTORY_NAMES`)
    leads with the part before it: ``my_pkg.envs:make`` -> ``envs-make``,
    ``pettingzoo.classic.rps_v2:parallel_env`` -> ``rps_v2-parallel_env``."""
    if isinstance(env, str):
        name = env
        if ":" in env:
            module, _, attr = env.partition(":")
            *holders, name = [*module.split("."), *attr.split(".")]
            if name in GENERIC_FACTORY_NAMES and holders and holders[-1]:
                name = f"{holders[-1]}-{name}"
    else:
        target = getattr(env, "func", env)  # functools.partial
        name = getattr(target, "__name__", None) or type(target).__name__
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("<lambda>", "lambda"))
    return name or "env"


# ---- overrides -------------------------------------------------------------------------
def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in ("env_config",):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_set_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["lr=1e-3", "resources.num_workers=2"]`` -> nested dict. Values parse as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects key=value (e.g. lr=0.001 or resources.num_workers=2), got '{item}'.")
        try:
            value = safe_yaml(raw) if raw.strip() else None
        except YamlRefused as e:
            raise ConfigError(f"--set {key}: the value is refused: {yaml_problem(e)}.") from None
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: '{p}' was already given a value, so it cannot also be a section.")
        node[parts[-1]] = value
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; any other content is a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(
            f"Config file '{path}' {what}; give a YAML file of config keys (`shoal config ALGO --yaml` prints one)."
        )
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"Config file '{path}' is not a text file: byte {e.start} is not UTF-8. A config file is "
            "UTF-8 YAML text of keys and values (`shoal config ALGO --yaml` prints one)."
        ) from None
    try:
        data = safe_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file '{path}' is not valid YAML: {yaml_problem(e)}.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys to values, got {type(data).__name__}.")
    return data


def yaml_problem(e: yaml.YAMLError) -> str:
    """One line for a YAML parse error: what is wrong and where (line and column, 1-based)."""
    problem = getattr(e, "problem", None) or " ".join(str(e).split())
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    hint = " (YAML indents with spaces, never tabs)" if "\\t" in problem else ""
    return f"{problem}{where}{hint}"


# ---- unused keys -----------------------------------------------------------------------
def _section_type(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    field = model.model_fields.get(key)
    ann = getattr(field, "annotation", None) if field else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def used_keys(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` less its ``unused_keys``."""
    unused = getattr(model, "unused_keys", {})
    return [k for k in model.model_fields if k not in unused]


def _unused_message(model: type[BaseModel], key: str, prefix: str = "", owner: str = "") -> str:
    owner = owner or getattr(model, "algo", "") or model.__name__
    why = getattr(model, "unused_keys", {})[key]
    return f"Config key '{prefix}{key}' is not used by {owner}, so it may not be set: {why}."


def unused_keys_given(model: type[BaseModel], data: dict[str, Any], prefix: str = "", owner: str = "") -> list[str]:
    """One message per unused key in ``data`` (nested section dicts included)."""
    owner = owner or getattr(model, "algo", "")
    out = []
    for key, value in data.items():
        if key in getattr(model, "unused_keys", {}):
            out.append(_unused_message(model, key, prefix, owner))
        elif isinstance(value, dict) and (sub := _section_type(model, key)) is not None:
            out.extend(unused_keys_given(sub, value, f"{prefix}{key}.", owner))
    return out


def _unused_tree(model: type[BaseModel]) -> dict[str, Any]:
    """``model_dump(exclude=...)`` form of the unused keys: ``{key: True, section: {...}}``."""
    out: dict[str, Any] = {k: True for k in getattr(model, "unused_keys", {}) if k in model.model_fields}
    for key in used_keys(model):
        sub = _section_type(model, key)
        if sub is not None and (inner := _unused_tree(sub)):
            out[key] = inner
    return out


def _drop_unused(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if key in getattr(model, "unused_keys", {}):
            continue
        sub = _section_type(model, key)
        out[key] = _drop_unused(sub, value) if sub is not None and isinstance(value, dict) else value
    return out


# ---- error formatting -------------------------------------------------------------------
def _fields_of(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, str]:
    """Walk ``loc`` (minus its last part) through nested sections; return the model and a dotted prefix."""
    prefix: list[str] = []
    for part in loc[:-1]:
        sub = _section_type(model, str(part))
        if sub is None:
            return None, ".".join(prefix)
        model = sub
        prefix.append(str(part))
    return model, ".".join(prefix)


def all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key that may be set, dotted into sections (unused keys left out)."""
    keys = []
    for name in used_keys(model):
        keys.append(prefix + name)
        sub = _section_type(model, name)
        if sub is not None:
            keys.extend(all_keys(sub, prefix + name + "."))
    return keys


def format_validation_error(model: type[BaseModel], err: ValidationError) -> str:
    """One paragraph: each unknown key once (with a close match when there is one), the valid
    keys of each section once, then the other errors."""
    name = model.__name__
    unknown: dict[str, tuple[Any, list[tuple[str, str]]]] = {}  # section prefix -> (its model, [(unknown key, hint)])
    lines = []
    for e in err.errors():
        loc = tuple(e.get("loc", ()))
        dotted = ".".join(str(p) for p in loc)
        if e["type"] in ("extra_forbidden", "no_such_attribute"):  # unknown key at construction / assignment
            sub, prefix = _fields_of(model, loc)
            key = str(loc[-1]) if loc else "?"
            close = difflib.get_close_matches(key, used_keys(sub) if sub else [], n=1, cutoff=0.6)
            anywhere = [k for k in all_keys(model) if k.split(".")[-1] == key]
            hint = ""
            if close:
                hint = f"Did you mean '{(prefix + '.' if prefix else '') + close[0]}'?"
            elif anywhere:
                hint = f"It exists as '{anywhere[0]}'."
            unknown.setdefault(prefix, (sub, []))[1].append((dotted, hint))
        elif e["type"] == "missing":
            lines.append(f"Missing required config key '{dotted}'.")
        else:
            got = e.get("input")
            # A model-level check (empty loc) gets the whole input: never echo that.
            got_s = f" (got {got!r})" if dotted and (not isinstance(got, (dict, list)) or len(repr(got)) < 80) else ""
            msg = e.get("msg", "invalid value").removeprefix("Value error, ")
            lines.append(f"Config key '{dotted}': {msg}{got_s}." if dotted else f"{msg}.")
    for prefix, (sub, keys) in unknown.items():
        where = f"section '{prefix}'" if prefix else name
        valid = ", ".join(used_keys(sub)) if sub else ""
        if len(keys) == 1:
            ((key, hint),) = keys
            text = f"Unknown config key '{key}' in {where}." + (f" {hint}" if hint else "")
        else:
            text = f"Unknown config keys {', '.join(repr(k) for k, _ in keys)} in {where}." + "".join(
                f" '{k}': {hint}" for k, hint in keys if hint
            )
        lines.insert(0, f"{text} Valid keys: {valid}.")
    return f"Invalid {name}: " + " ".join(lines)


__all__ = [
    "AlgorithmConfig",
    "Section",
    "ResourcesConfig",
    "ModelConfig",
    "EvaluationConfig",
    "NormalizeConfig",
    "ConfigError",
    "model_validator",
    "parse_set_overrides",
    "load_yaml",
    "deep_merge",
    "import_path",
]
