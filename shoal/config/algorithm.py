"""The :class:`AlgorithmConfig` base: the fields every algorithm shares, its validation, the
hooks subclasses override and the API (``build``, ``to_dict``, ``to_yaml``, ``copy_with``,
``from_dict``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Optional, Union

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from shoal.config.fields import EnvSpec, LRSchedule, env_spec_name, env_spec_to_str
from shoal.config.keys import _drop_unused, _unused_tree, format_validation_error
from shoal.config.loggers import LoggingConfig
from shoal.config.overrides import deep_merge
from shoal.config.sections import (
    EnvPreprocessingConfig,
    EvaluationConfig,
    ModelConfig,
    NormalizeConfig,
    ResourcesConfig,
    Section,
)
from shoal.errors import ConfigError
from shoal.files import redact_secrets
from shoal.seeding import MAX_SEED

if TYPE_CHECKING:
    from shoal.framework.base import Algorithm


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
    """The :class:`~shoal.framework.base.Algorithm` subclass that ``build()`` makes. An algorithm
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
