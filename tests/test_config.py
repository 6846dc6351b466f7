"""Config validation: every bad input is one clear ConfigError / EnvError that names the key."""

from __future__ import annotations

import pytest
import yaml
from helpers import invoke

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
    out = parse_set_overrides(
        [
            "lr=0.001",
            "resources.num_workers=2",
            "resources.num_envs_per_worker=4",
            "model.hiddens=[32, 16]",
            "use_kl_loss=true",
            "env=CartPole-v1",
            "vf_clip_param=null",
            "seed=",
            "env_config={a: 1}",
        ]
    )
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
    c = PPOConfig(
        **deep_merge(
            {"env": "CartPole-v1"}, parse_set_overrides(["resources.num_workers=0", "lr=1e-3", "model.hiddens=[8]"])
        )
    )
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
    with pytest.raises(ConfigError, match="is a directory"):
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
    c = cfg(
        lr=1e-3,
        seed=7,
        lr_schedule=[[0, 1e-3], [100, 1e-4]],
        model={"hiddens": [32]},
        resources={"num_envs_per_worker": 2},
        env_config={"render_mode": None},
    )
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


def test_config_yaml_leaves_out_ataris_preprocessing_for_another_env_and_round_trips():
    from shoal.algorithms.dqn import DQNConfig

    for c in (cfg(), DQNConfig(env="CartPole-v1", lr=1e-3)):
        loaded = yaml.safe_load(c.to_yaml())
        assert "env_preprocessing" not in loaded and type(c).from_dict(loaded) == c
    pong = PPOConfig(env="ALE/Pong-v5", env_preprocessing={"frame_stack": 2})
    loaded = yaml.safe_load(pong.to_yaml())
    assert loaded["env_preprocessing"]["frame_stack"] == 2 and PPOConfig.from_dict(loaded) == pong
    assert "env_preprocessing" in yaml.safe_load(PPOConfig(env="ALE/Pong-v5").to_yaml())  # an Atari game: all of it


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


def test_copy_with_takes_keyword_overrides_validated_like_the_constructor():
    c = cfg(lr=1e-3, resources={"num_envs_per_worker": 2, "num_cpus_per_worker": 0.5})
    c2 = c.copy_with(lr=1e-4, resources={"num_envs_per_worker": 4})
    assert c2.lr == 1e-4 and c2.resources.num_envs_per_worker == 4 and c2.resources.num_cpus_per_worker == 0.5
    assert c.lr == 1e-3  # the original is untouched
    c3 = c.copy_with({"gamma": 0.9, "lr": 0.5}, lr=0.01)  # a dict and keywords: the keywords last
    assert (c3.gamma, c3.lr) == (0.9, 0.01)
    with pytest.raises(ConfigError, match="'lr'.*fast"):
        c.copy_with(lr="fast")
    with pytest.raises(ConfigError, match="Did you mean 'gamma'"):
        c.copy_with(gama=0.9)


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
    c3 = cfg(
        rollout_fragment_length=100, train_batch_size=400, minibatch_size=100, resources={"num_envs_per_worker": 4}
    )
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
        data = yaml.safe_load(path.read_text())
        if "search" in data:  # a `shoal tune` file: the algorithm is its `algo` key
            from shoal.app.tune_spec import TuneSpec

            TuneSpec.parse(data)
            continue
        algo = max((a for a in REGISTRY if path.stem.startswith(a + "_")), key=len)
        data.pop("stop", None)
        data.pop("algo", None)
        get_config_class(algo)(**data)


# ---- inherited keys an algorithm does not use ----------------------------------------------
# Every declared unused key, by algorithm (dotted into sections). An accepted key must have an
# effect: these are the inherited ones that have none in that algorithm.
ACTOR_CRITIC_MLP_UNUSED = {  # SAC's and Ape-X TD3's own actor and critic MLPs; no normalize on replay
    "model.vf_share_layers",
    "model.init_log_std",
    "model.conv_filters",
    "model.torso",
    "model.frame_layout",
    "model.custom",
    "model.custom_kwargs",
    "normalize",
}
UNUSED = {
    "ppo": set(),
    "dqn": {"model.vf_share_layers", "model.init_log_std"},
    "apex": {
        "exploration_initial_eps",
        "exploration_final_eps",
        "exploration_timesteps",
        "model.vf_share_layers",
        "model.init_log_std",
        "normalize",
    },
    "impala": set(),
    "appo": set(),
    "ddppo": {"train_batch_size", "use_kl_loss", "kl_coeff", "kl_target", "resources.num_gpus", "normalize"},
    "sac": ACTOR_CRITIC_MLP_UNUSED,
    "apex_td3": ACTOR_CRITIC_MLP_UNUSED,
    "alpha_star": {
        "num_learner_devices",
        "fake_devices",
        "num_multi_gpu_tower_stacks",
        "num_data_load_threads",
        "learner_queue_size",
        "learner_queue_timeout",
        "minibatch_buffer_size",
        "evaluation.evaluation_num_workers",
        "env_preprocessing",
        "normalize",
    },
}
ENVS = {"alpha_star": "pettingzoo.classic:tictactoe_v3"}


def default_config(algo: str):
    return get_config_class(algo)(env=ENVS.get(algo, "CartPole-v1"))


def declared_unused(model, prefix: str = "") -> set[str]:
    from shoal.config import used_keys

    out = {prefix + k for k in model.unused_keys}
    for name in used_keys(model):
        ann = model.model_fields[name].annotation
        if isinstance(ann, type) and hasattr(ann, "unused_keys"):
            out |= declared_unused(ann, f"{prefix}{name}.")
    return out


def nested(dotted: str, value) -> dict:
    head, _, rest = dotted.partition(".")
    return {head: nested(rest, value) if rest else value}


def test_declared_unused_keys_per_algorithm():
    from shoal.algorithms import REGISTRY

    assert set(REGISTRY) == set(UNUSED)
    for algo, keys in UNUSED.items():
        assert declared_unused(get_config_class(algo)) == keys, algo


@pytest.mark.parametrize("algo, key", sorted((a, k) for a, keys in UNUSED.items() for k in keys))
def test_an_unused_key_is_refused_naming_the_key_the_algorithm_and_why(algo, key):
    cls = get_config_class(algo)
    c = default_config(algo)
    *path, leaf = key.split(".")
    owner = c
    for part in path:
        owner = getattr(owner, part)
    # even its default value is refused; a key the class lacks (a sibling's) takes the sibling's default
    sibling = default_config("appo" if algo == "alpha_star" else "ppo")
    value = getattr(owner, leaf) if leaf in type(owner).model_fields else getattr(sibling, leaf)
    reason = type(owner).unused_keys[leaf]
    with pytest.raises(ConfigError) as info:
        cls(env=ENVS.get(algo, "CartPole-v1"), **nested(key, value))
    msg = str(info.value)
    assert "\n" not in msg and f"'{key}'" in msg and f"not used by {algo}" in msg and reason in msg, msg
    with pytest.raises(ConfigError, match=f"'{leaf}' is not used"):  # assignment, on the config or its section
        setattr(owner, leaf, value)
    section = c.to_dict()
    for part in path:
        section = section[part]
    assert leaf not in section


@pytest.mark.parametrize("algo", sorted(UNUSED))
def test_unused_keys_are_not_written_nor_listed_as_valid(algo):
    from shoal.config import all_keys

    cls = get_config_class(algo)
    c = default_config(algo)
    saved = yaml.safe_load(c.to_yaml())  # what config.yaml and checkpoints hold
    written = {".".join(p) for p in _paths(saved)}
    assert UNUSED[algo] <= set(declared_unused(cls))
    assert not UNUSED[algo] & set(all_keys(cls)) and not UNUSED[algo] & written
    # every other key is written, less Atari's preprocessing for CartPole (it holds its defaults)
    assert {k for k in all_keys(cls) if not k.startswith("env_preprocessing")} <= written | {"algo"}
    assert cls.from_dict(saved) == c  # the saved config round-trips
    with pytest.raises(ConfigError) as info:
        cls(env=ENVS.get(algo, "CartPole-v1"), no_such_key=1)
    valid = str(info.value).split("Valid keys: ")[1]
    assert not {k for k in UNUSED[algo] if "." not in k} & set(valid.rstrip(".").split(", "))


def _paths(d: dict, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict) and k != "env_config":
            yield from _paths(v, prefix + (k,))


def test_unused_keys_from_set_and_yaml_are_user_errors(tmp_path):

    out = tmp_path / "runs"
    r = invoke("train", "apex", "--env", "CartPole-v1", "-q", "--out", str(out), "--set", "exploration_timesteps=5000")
    assert r.exit_code == 2 and "exploration_timesteps" in r.output and "not used by apex" in r.output, r.output
    path = tmp_path / "ddppo.yaml"
    path.write_text("algo: ddppo\nenv: CartPole-v1\nkl_coeff: 0.3\n")
    r = invoke("train", "ddppo", "-c", str(path), "-q", "--out", str(out))
    assert r.exit_code == 2 and "'kl_coeff' is not used by ddppo" in r.output, r.output
    assert not out.exists()  # nothing started


def test_a_checkpoint_saved_with_keys_now_unused_still_loads(tmp_path):
    """A config written before keys were declared unused (they never had an effect) is read without them."""
    import json

    from shoal.algorithms.dqn import DQNConfig
    from shoal.framework.base import Algorithm

    c = DQNConfig(
        env="CartPole-v1",
        seed=0,
        learning_starts=0,
        train_batch_size=8,
        rollout_fragment_length=4,
        model={"hiddens": [8]},
        resources={"num_envs_per_worker": 2},
    )
    algo = c.build()
    try:
        algo.train()
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    meta = json.loads((path / "meta.json").read_text())
    assert "vf_share_layers" not in meta["config"]["model"]
    meta["config"]["model"].update(vf_share_layers=False, init_log_std=0.0)  # as earlier versions wrote it
    (path / "meta.json").write_text(json.dumps(meta))
    again = Algorithm.from_checkpoint(path)
    try:
        assert again.config == c and again.iteration == 1
    finally:
        again.stop()
    with pytest.raises(ConfigError, match="init_log_std"):  # an override is the user's input: refused
        Algorithm.from_checkpoint(path, overrides={"model": {"init_log_std": 0.5}})


# ---- the key reference ------------------------------------------------------------------------
def test_every_config_key_has_a_description():
    from shoal.algorithms import REGISTRY, get_config_class
    from shoal.config_reference import key_reference

    missing = [
        f"{algo}: {key}" for algo in REGISTRY for key, _, _, desc in key_reference(get_config_class(algo)) if not desc
    ]
    assert not missing, missing


@pytest.mark.parametrize("algo", ["ppo", "dqn", "apex", "impala", "appo", "ddppo", "alpha_star"])
def test_shoal_config_yaml_is_a_complete_config_that_validates(algo, tmp_path):
    import yaml

    from shoal.algorithms import get_config_class
    from shoal.config_reference import key_reference

    r = invoke("config", algo, "--yaml")
    assert r.exit_code == 0, r.output
    data = yaml.safe_load(r.output)
    assert data.pop("algo") == algo
    config = get_config_class(algo)(**data)  # what `shoal train ALGO -c` would load
    top = {key for key, *_ in key_reference(get_config_class(algo)) if "." not in key}
    assert set(data) == top and config.gamma == get_config_class(algo).model_fields["gamma"].default
    assert r.output.count("\n# ") > 20  # a description above the keys
    table = invoke("config", algo)
    assert table.exit_code == 0 and "(section)" in table.output
    assert ("(required)" in table.output) == (algo != "alpha_star")  # alpha_star's env has a default


@pytest.mark.parametrize("algo", ["ppo", "dqn", "apex", "impala", "appo", "ddppo", "alpha_star"])
def test_shoal_config_table_shows_every_description_whole(algo):
    """Off a terminal each key is one line, and a description's [brackets] are text, not rich markup."""
    from shoal.algorithms import get_config_class
    from shoal.config_reference import key_reference

    r = invoke("config", algo)
    assert r.exit_code == 0, r.output
    lines = {line.split()[0]: line for line in r.output.splitlines() if line.strip()}
    for key, type_name, default, desc in key_reference(get_config_class(algo)):
        line = lines[key]
        assert desc in line and type_name in line and default in line, (key, line)
    assert "[[env_steps, lr], ...]" in lines["lr_schedule"] and "pip install -e '.[wandb]'" in lines["logging.writers"]


def test_shoal_config_and_algos_off_a_terminal_end_each_row_with_its_text():
    """rich padded every row to the longest description (~500 columns for sac)."""
    for argv in (["config", "sac"], ["algos"]):
        r = invoke(*argv)
        assert r.exit_code == 0, r.output
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert all(line == line.rstrip() for line in lines), argv
    env_config = next(line for line in invoke("config", "sac").output.splitlines() if line.split()[0] == "env_config")
    assert env_config.endswith("Keyword arguments for the env constructor.") and len(env_config) < 200


def test_shoal_config_names_an_unknown_algorithm():

    r = invoke("config", "ppo2")
    assert r.exit_code == 2 and "ppo" in r.output


def test_dir_of_shoal_lists_the_public_names_loaded_on_first_use():
    import shoal

    names = dir(shoal)
    assert {"PPOConfig", "DQNConfig", "train", "load", "Stop", "AlgorithmConfig", "ConfigError"} <= set(names)
    assert set(shoal.__all__) <= set(names) and names == sorted(names)
