"""Config sections: the :class:`Section` base (strict keys, validated on assignment,
``unused_keys`` refused) and the sections every algorithm has: ``resources``, ``model``,
``env_preprocessing``, ``normalize`` and ``evaluation``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shoal.config.keys import _unused_message, format_validation_error, unused_keys_given
from shoal.errors import ConfigError


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
