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

from pydantic import model_validator as model_validator

from shoal.config.algorithm import AlgorithmConfig as AlgorithmConfig
from shoal.config.fields import GENERIC_FACTORY_NAMES as GENERIC_FACTORY_NAMES
from shoal.config.fields import EntropySchedule as EntropySchedule
from shoal.config.fields import EnvSpec as EnvSpec
from shoal.config.fields import LRSchedule as LRSchedule
from shoal.config.fields import env_spec_name as env_spec_name
from shoal.config.fields import env_spec_to_str as env_spec_to_str
from shoal.config.keys import _section_type as _section_type
from shoal.config.keys import all_keys as all_keys
from shoal.config.keys import format_validation_error as format_validation_error
from shoal.config.keys import unused_keys_given as unused_keys_given
from shoal.config.keys import used_keys as used_keys
from shoal.config.loggers import LOGGER_EXTRAS as LOGGER_EXTRAS
from shoal.config.loggers import LoggingConfig as LoggingConfig
from shoal.config.loggers import MlflowConfig as MlflowConfig
from shoal.config.loggers import WandbConfig as WandbConfig
from shoal.config.loggers import WriterName as WriterName
from shoal.config.overrides import deep_merge as deep_merge
from shoal.config.overrides import load_yaml as load_yaml
from shoal.config.overrides import parse_set_overrides as parse_set_overrides
from shoal.config.overrides import yaml_problem as yaml_problem
from shoal.config.sections import EnvPreprocessingConfig as EnvPreprocessingConfig
from shoal.config.sections import EvaluationConfig as EvaluationConfig
from shoal.config.sections import ModelConfig as ModelConfig
from shoal.config.sections import NormalizeConfig as NormalizeConfig
from shoal.config.sections import ResourcesConfig as ResourcesConfig
from shoal.config.sections import Section as Section
from shoal.errors import ConfigError as ConfigError
from shoal.imports import import_path as import_path

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
