"""Config validation: every bad input is one clear ConfigError / EnvError that names the key."""

from __future__ import annotations

import pytest
import yaml

from shoal.algorithms import get_algorithm_class, get_config_class
from shoal.algorithms.ppo import PPO, PPOConfig
from shoal.config import deep_merge, load_yaml, parse_set_overrides
from shoal.errors import ConfigError, EnvError, ShoalError


def cfg(**kw):
    return PPOConfig(env="CartPole-v1", **kw)


def error(**kw) -> str:
    with pytest.raises(ConfigError) as ei:
        cfg(**kw)
    msg = str(ei.value)
    assert "\n" not in msg  # one paragraph
    assert "Traceback" not in msg
    return msg


def test_defaults_are_valid():
    c = cfg()
    assert c.algo == "ppo"
    assert c.resources.num_workers == 0
    assert c.fragment_length() == 4096 // 8


def test_errors_are_shoal_errors():
    assert issubclass(ConfigError, ShoalError) and issubclass(ConfigError, ValueError)
    assert issubclass(EnvError, ShoalError)


def test_unknown_key_suggests_closest():
    msg = error(lrr=1e-3)
    assert "'lrr'" in msg
    assert "Did you mean 'lr'?" in msg
    assert "Valid keys:" in msg and "train_batch_size" in msg


def test_unknown_key_in_section_suggests_dotted_key():
    msg = error(resources={"num_worker": 2})
    assert "resources.num_worker" in msg
    assert "Did you mean 'resources.num_workers'?" in msg
    assert "num_envs_per_worker" in msg  # lists the section's valid keys


def test_section_key_given_at_top_level():
    msg = error(num_workers=2)
    assert "'num_workers'" in msg
    assert "It exists as 'resources.num_workers'" in msg


def test_unknown_model_key():
    msg = error(model={"hidden": [32]})
    assert "Did you mean 'model.hiddens'?" in msg


def test_wrong_type():
    msg = error(lr="fast")
    assert "'lr'" in msg
    assert "number" in msg
    assert "'fast'" in msg


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(gamma=1.5), ["gamma", "1.5"]),
        (dict(lr=0.0), ["lr", "greater than 0"]),
        (dict(resources={"num_workers": -1}), ["resources.num_workers", "-1"]),
        (dict(model={"activation": "sigmoid"}), ["model.activation", "tanh, relu, elu"]),
        (dict(rollout_fragment_length=0), ["rollout_fragment_length", "positive integer or 'auto'"]),
        (dict(rollout_fragment_length="short"), ["rollout_fragment_length"]),
    ],
)
def test_out_of_range_values(kw, words):
    msg = error(**kw)
    for w in words:
        assert w in msg


def test_minibatch_larger_than_train_batch():
    msg = error(minibatch_size=1024, train_batch_size=512)
    assert "minibatch_size (1024)" in msg and "train_batch_size (512)" in msg
    assert "(got" not in msg  # a model-level check does not echo the whole input
    cfg(minibatch_size=512, train_batch_size=512)  # equal is fine


def test_fragment_times_envs_must_match_explicit_train_batch():
    msg = error(rollout_fragment_length=100, train_batch_size=1000, resources={"num_envs_per_worker": 4})
    assert "train_batch_size (1000)" in msg and "100 x 4" in msg
    # consistent values pass; without an explicit train_batch_size the fragment length is simply used
    c = cfg(rollout_fragment_length=100, train_batch_size=400, minibatch_size=100, resources={"num_envs_per_worker": 4})
    assert c.fragment_length() == 100
    assert cfg(rollout_fragment_length=100, resources={"num_envs_per_worker": 4}).fragment_length() == 100
    # 'auto' derives the fragment from the train batch
    assert cfg(train_batch_size=512, resources={"num_envs_per_worker": 4}).fragment_length() == 128
    assert cfg(train_batch_size=500, resources={"num_envs_per_worker": 8}).fragment_length() == 63


def test_bad_lr_schedule():
    assert "increasing env_steps" in error(lr_schedule=[[100, 1e-3], [0, 1e-4]])
    assert "at least one" in error(lr_schedule=[])
    assert ">= 0" in error(lr_schedule=[[0, -1.0]])
    assert "lr_schedule" in error(lr_schedule="decay")
    assert cfg(lr_schedule=[[0, 1e-3], [1000, 0.0]]).lr_schedule == [(0, 1e-3), (1000, 0.0)]


def test_assignment_is_validated():
    c = cfg()
    with pytest.raises(ConfigError, match="'lr'"):
        c.lr = "fast"
    with pytest.raises(ConfigError, match="'num_workers'.*greater than or equal to 0"):
        c.resources.num_workers = -3
    with pytest.raises(ConfigError, match="Did you mean 'gamma'"):
        c.gama = 0.9
    # cross-field checks run on assignment too, and the message does not echo the whole config
    with pytest.raises(ConfigError) as ei:
        c.minibatch_size = 10**6
    assert "minibatch_size (1000000)" in str(ei.value)
    assert "(got" not in str(ei.value) and len(str(ei.value)) < 300
    assert c.minibatch_size == 256  # a rejected assignment leaves the old value
    c.lr = 0.01
    c.resources.num_envs_per_worker = 2
    assert c.lr == 0.01 and c.resources.num_envs_per_worker == 2


def test_unknown_env_id_raised_by_build():
    c = PPOConfig(env="CartPol-v1")  # construction does not build envs
    with pytest.raises(EnvError) as ei:
        c.build()
    msg = str(ei.value)
    assert "Unknown env 'CartPol-v1'" in msg
    assert "'CartPole-v1'" in msg  # the suggestion


def test_bad_import_path_env():
    with pytest.raises(EnvError, match="Cannot import env"):
        PPOConfig(env="no_such_module_xyz:make").build()


def test_unknown_algorithm():
    with pytest.raises(ConfigError, match="Did you mean 'ppo'"):
        get_config_class("ppp")
    assert get_config_class("PPO") is PPOConfig
    assert get_algorithm_class("ppo") is PPO


def test_parse_set_overrides():
    out = parse_set_overrides([
        "lr=0.001", "resources.num_workers=2", "resources.num_envs_per_worker=4", "model.hiddens=[32, 16]",
        "use_kl_loss=true", "env=CartPole-v1", "vf_clip_param=null", "seed=", "env_config={a: 1}",
    ])
    assert out == {
        "lr": 0.001,
        "resources": {"num_workers": 2, "num_envs_per_worker": 4},
        "model": {"hiddens": [32, 16]},
        "use_kl_loss": True,
        "env": "CartPole-v1",
        "vf_clip_param": None,
        "seed": None,
        "env_config": {"a": 1},
    }
    # a value that is not valid YAML stays a string
    assert parse_set_overrides(["name=[1,"]) == {"name": "[1,"}
    # values applied on top of a config
    c = PPOConfig(**deep_merge({"env": "CartPole-v1"}, parse_set_overrides(["resources.num_workers=0", "lr=1e-3", "model.hiddens=[8]"])))
    assert c.lr == pytest.approx(1e-3) and c.model.hiddens == [8]


@pytest.mark.parametrize("item", ["lr", "=3", " =1", ""])
def test_parse_set_overrides_malformed(item):
    with pytest.raises(ConfigError, match="key=value"):
        parse_set_overrides([item])


def test_parse_set_overrides_value_then_section():
    with pytest.raises(ConfigError, match="'lr' was already given a value"):
        parse_set_overrides(["lr=1", "lr.x=2"])


def test_load_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("env: CartPole-v1\nlr: 0.001\nresources:\n  num_envs_per_worker: 2\n")
    assert load_yaml(p) == {"env": "CartPole-v1", "lr": 0.001, "resources": {"num_envs_per_worker": 2}}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml(empty) == {}


def test_load_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path)  # a directory is not a config file
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping.*list"):
        load_yaml(lst)
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)


def test_to_dict_from_dict_round_trip():
    c = cfg(lr=1e-3, seed=7, lr_schedule=[[0, 1e-3], [100, 1e-4]], model={"hiddens": [32]},
            resources={"num_envs_per_worker": 2}, env_config={"render_mode": None})
    d = c.to_dict()
    assert d["resources"]["num_envs_per_worker"] == 2
    assert d["lr_schedule"] == [[0, 1e-3], [100, 1e-4]]
    again = PPOConfig.from_dict(d)
    assert again == c
    assert again.to_dict() == d
    # through YAML too (what a run directory's config.yaml holds)
    loaded = yaml.safe_load(c.to_yaml())
    assert loaded["algo"] == "ppo"
    assert PPOConfig.from_dict(loaded) == c


def test_from_dict_other_algorithm():
    with pytest.raises(ConfigError, match="for algorithm 'dqn', not 'ppo'"):
        PPOConfig.from_dict({"algo": "dqn", "env": "CartPole-v1"})


def test_copy_with():
    c = cfg(lr=1e-3, resources={"num_envs_per_worker": 2, "num_cpus_per_worker": 0.5})
    c2 = c.copy_with({"resources": {"num_envs_per_worker": 4}, "gamma": 0.9})
    assert c2.resources.num_envs_per_worker == 4
    assert c2.resources.num_cpus_per_worker == 0.5  # nested merge keeps the rest of the section
    assert c2.gamma == 0.9 and c2.lr == 1e-3
    assert c.resources.num_envs_per_worker == 2 and c.gamma == 0.99  # the original is untouched
    with pytest.raises(ConfigError, match="Did you mean 'gamma'"):
        c.copy_with({"gama": 0.9})


def _make_env():
    import gymnasium as gym

    return gym.make("CartPole-v1")


def test_callable_env_to_dict_import_path():
    c = PPOConfig(env=_make_env)
    assert c.to_dict()["env"] == f"{__name__}:_make_env"
    assert c.env_name() == "_make_env"
    assert cfg().env_name() == "CartPole-v1"


def test_round_trip_with_fragment_length_and_derived_train_batch():
    # train_batch_size is not set: the batch is fragment x envs. The saved dict must not turn the
    # unused default into an explicit (and contradicting) train_batch_size.
    c = cfg(rollout_fragment_length=100, resources={"num_envs_per_worker": 4})
    again = PPOConfig.from_dict(c.to_dict())
    assert again == c and again.fragment_length() == 100
    assert PPOConfig.from_dict(yaml.safe_load(c.to_yaml())).fragment_length() == 100
    c2 = c.copy_with({"resources": {"num_envs_per_worker": 2}})
    assert c2.fragment_length() == 100 and c2.resources.num_envs_per_worker == 2
    # an explicit, consistent train_batch_size is kept
    c3 = cfg(rollout_fragment_length=100, train_batch_size=400, minibatch_size=100, resources={"num_envs_per_worker": 4})
    assert c3.to_dict()["train_batch_size"] == 400
    assert PPOConfig.from_dict(c3.to_dict()) == c3


def test_every_example_config_validates():
    """The presets in examples/ stay in step with the configs (the algorithm is the file name's prefix)."""
    from pathlib import Path

    import yaml

    from shoal.algorithms import REGISTRY, get_config_class

    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert len(examples) >= 8
    for path in examples:
        algo = max((a for a in REGISTRY if path.stem.startswith(a + "_")), key=len)
        data = yaml.safe_load(path.read_text())
        data.pop("stop", None)
        data.pop("algo", None)
        get_config_class(algo)(**data)
