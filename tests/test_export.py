"""`shoal export` / shoal.export_policy: TorchScript and ONNX files that give the in-process policy's outputs."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import invoke

import shoal
from shoal import ApeXTD3Config, DQNConfig, PPOConfig, SACConfig
from shoal.app.export import export_policy, sidecar_path
from shoal.batch import Col
from shoal.models.catalog import preprocess_obs
from shoal.rollout.policies import STATE_OUT
from shoal.spaces import stack_obs

SMALL_CNN = {"torso": "conv", "conv_filters": [[8, 3, 2]], "hiddens": [32], "activation": "relu"}
LSTM = {"use_lstm": True, "lstm_cell_size": 8, "hiddens": [16]}
CASES = {  # name -> (config class, config): MLP, Q network, CNN on uint8 frames, LSTM, Box actions, Discrete obs, custom
    "ppo_mlp": (PPOConfig, {"env": "CartPole-v1"}),
    "dqn": (DQNConfig, {"env": "CartPole-v1"}),
    "ppo_cnn": (PPOConfig, {"env": "shoal.envs.pixel_catch:PixelCatch", "model": SMALL_CNN}),
    "ppo_lstm": (PPOConfig, {"env": "shoal/StatelessCartPole-v1", "model": LSTM}),
    "ppo_box": (PPOConfig, {"env": "Pendulum-v1", "model": {"init_log_std": -0.5}}),
    "ppo_discrete_obs": (PPOConfig, {"env": "FrozenLake-v1"}),
    "dqn_custom": (
        DQNConfig,
        {"env": "CartPole-v1", "model": {"custom": "custom_models:SmallQ"}},
    ),  # a model.custom class
    "sac": (SACConfig, {"env": "Pendulum-v1", "model": {"hiddens": [32]}}),  # a squashed Gaussian actor
    "ppo_multi_discrete": (PPOConfig, {"env": "space_envs:MultiSignal"}),  # per-component argmax + start
    "ppo_multi_binary": (PPOConfig, {"env": "space_envs:BitSignal"}),
    "apex_td3": (ApeXTD3Config, {"env": "Pendulum-v1", "model": {"hiddens": [32]}, "replay_capacity": 1000}),
    "ppo_dict": (PPOConfig, {"env": "space_envs:DictSignal"}),  # a float row of the entries
    "dqn_image_dict": (DQNConfig, {"env": "space_envs:PixelPair", "model": SMALL_CNN}),  # a packed uint8 row
}
FORMATS = ("torchscript", "onnx")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One checkpoint per case; PPO on CartPole trained for 2 iterations, the others as built."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, (cls, cfg) in CASES.items():
        algo = cls(seed=0, train_batch_size=256, **({"minibatch_size": 128} if cls is PPOConfig else {}), **cfg).build()
        try:
            if name == "ppo_mlp":
                for _ in range(2):
                    algo.train()
            out[name] = algo.save(root / name)
        finally:
            algo.stop()
    return out


def random_obs(space, n: int, seed: int = 0):
    space.seed(seed)
    return stack_obs([space.sample() for _ in range(n)])


def exported_input(space, obs):
    """What the exported model takes: the observations themselves, or a Dict's or Tuple's rows."""
    return preprocess_obs(space, obs) if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)) else obs


def reference(algo, obs: np.ndarray, state=None) -> dict[str, np.ndarray]:
    """The in-process policy's greedy action and extras for a batch, through the rollout code's path."""
    space = algo.env_info.observation_space
    policy = algo.policy_cls(space, algo.env_info.action_space, algo.config, algo.config.seed)
    policy.set_weights(algo.get_weights())
    with torch.inference_mode():
        rows = preprocess_obs(space, obs)
        actions, extras = policy.act(rows, False, state) if policy.recurrent else policy.act(rows, explore=False)
    return {"action": policy.to_env_actions(actions), **extras}


def run_exported(path, fmt: str, *inputs: np.ndarray) -> list[np.ndarray]:
    if fmt == "torchscript":
        model = torch.jit.load(str(path))
        with torch.no_grad():
            return [t.numpy() for t in model(*(torch.as_tensor(x) for x in inputs))]
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))


def check_outputs(outs: list[np.ndarray], ref: dict[str, np.ndarray], q_network: bool) -> None:
    if Col.ACTION_DIST_INPUTS not in ref and not q_network:  # SAC's actor records no extras
        return
    if q_network:
        np.testing.assert_allclose(outs[1], ref[Col.Q_VALUES], atol=1e-5, rtol=1e-5)
    else:
        np.testing.assert_allclose(outs[1], ref[Col.ACTION_DIST_INPUTS], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(outs[2], ref[Col.VF_PREDS], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "case",
    [
        "ppo_mlp",
        "dqn",
        "ppo_cnn",
        "ppo_box",
        "ppo_discrete_obs",
        "dqn_custom",
        "sac",
        "ppo_multi_discrete",
        "ppo_multi_binary",
        "apex_td3",
        "ppo_dict",
        "dqn_image_dict",
    ],
)
def test_exported_model_matches_the_in_process_policy(checkpoints, tmp_path, case, fmt):
    path = checkpoints[case]
    out = export_policy(path, fmt, tmp_path / f"policy.{fmt}")
    algo = shoal.load(path)
    obs = random_obs(algo.env_info.observation_space, 7)  # not the batch size the export traced with
    ref = reference(algo, obs)
    outs = run_exported(out, fmt, exported_input(algo.env_info.observation_space, obs))
    check_outputs(outs, ref, q_network=case.startswith("dqn"))
    with shoal.load_policy(path) as policy:
        greedy, _ = policy.predict(obs)
    if case in ("ppo_box", "sac", "apex_td3"):
        np.testing.assert_allclose(outs[0], greedy, atol=1e-5)
        assert np.all(np.abs(outs[0]) <= 2.0)  # clipped (PPO) or squashed (SAC, TD3) into Pendulum's bounds
    else:
        assert np.array_equal(outs[0], greedy)
    if case == "sac":  # the pre-squash mean and log std, as the actor computes them
        mu, log_std = algo.learner.module.actor(torch.from_numpy(obs))
        np.testing.assert_allclose(outs[1], torch.cat([mu, log_std], -1).detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(outs[0], 2.0 * np.tanh(mu.detach().numpy()), atol=1e-5)
    algo.stop()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_recurrent_policy_exports_obs_and_state_to_outputs_and_state(checkpoints, tmp_path, fmt):
    path = checkpoints["ppo_lstm"]
    out = export_policy(path, fmt, tmp_path / f"lstm.{fmt}")
    meta = json.loads(sidecar_path(out).read_text())
    assert meta["inputs"] == ["obs", "state"] and meta["outputs"][-1] == "state_out" and meta["state_size"] == 32
    algo = shoal.load(path)
    policy = shoal.load_policy(path)
    state = np.zeros((5, 32), np.float32)
    predicted_state = None
    for step in range(3):  # the state carries over steps exactly as predict's does
        obs = random_obs(algo.env_info.observation_space, 5, seed=step)
        ref = reference(algo, obs, state)
        outs = run_exported(out, fmt, obs, state)
        action, next_state = outs[0], outs[3]
        greedy, predicted_state = policy.predict(obs, predicted_state)
        check_outputs(outs, ref, q_network=False)
        np.testing.assert_allclose(next_state, ref[STATE_OUT], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(next_state, predicted_state, atol=1e-5, rtol=1e-5)
        assert np.array_equal(action, greedy)
        state = next_state
    policy.close()
    algo.stop()


def test_sidecar_and_cli(checkpoints, tmp_path):
    path = checkpoints["ppo_cnn"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = invoke("export", str(path), "--format", "onnx", "--out", str(tmp_path / "catch.onnx"))
    assert r.exit_code == 0, r.output
    assert "torch.onnx" not in r.output and r.output.strip().count("\n") <= 2, r.output  # no exporter chatter
    assert not [w for w in caught if "onnx" in str(w.filename) or "_dynamo" in str(w.filename)], caught
    meta = json.loads((tmp_path / "catch.onnx.json").read_text())
    assert (
        meta["format"] == "onnx" and meta["inputs"] == ["obs"] and meta["outputs"] == ["action", "dist_inputs", "value"]
    )
    assert meta["observation"] == {**meta["observation"], "shape": [1, 10, 10], "dtype": "uint8"}
    assert meta["action_space"] == {"type": "Discrete", "n": 3, "start": 0}
    r = invoke("export", str(checkpoints["dqn"]))  # default: torchscript next to the checkpoint
    assert r.exit_code == 0 and (checkpoints["dqn"] / "policy.pt").is_file()
    meta = json.loads((checkpoints["dqn"] / "policy.pt.json").read_text())
    assert meta["outputs"] == ["action", "q_values"] and meta["observation"]["dtype"] == "float32"
    out = export_policy(checkpoints["dqn_image_dict"], "torchscript", tmp_path / "pair.pt")
    obs = json.loads(sidecar_path(out).read_text())["observation"]
    assert obs["shape"] == [64 + 4] and obs["dtype"] == "uint8"  # the 8x8 frame's bytes, then flip as float32 bytes
    assert obs["row_layout"] == [
        {"entry": "['frame']", "encoding": "image", "offset": 0, "width": 64},
        {"entry": "['flip']", "encoding": "float32", "offset": 64, "width": 4},
    ]


def test_export_errors_exit_2(checkpoints, tmp_path):
    r = invoke("export", str(checkpoints["ppo_mlp"]), "--format", "tflite")
    assert r.exit_code == 2 and "torchscript, onnx" in " ".join(r.output.split())
    r = invoke("export", str(tmp_path / "nope"))
    assert r.exit_code == 2 and "does not exist" in r.output
    algo = PPOConfig(env="pettingzoo.classic:tictactoe_v3", seed=0, multi_agent={"policies": {"main": None}}).build()
    game = algo.save(tmp_path / "game")
    algo.stop()
    r = invoke("export", str(game))
    assert r.exit_code == 2 and "single-agent" in r.output and "Traceback" not in r.output


def test_onnx_export_logs_nothing_on_stderr(checkpoints, tmp_path):
    """torch's exporter logs (not warns) that torchvision's operators are skipped when torchvision is
    absent; a user's terminal gets the one result line, nothing of the exporter."""
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal",
            "export",
            str(checkpoints["ppo_mlp"]),
            "--format",
            "onnx",
            "--out",
            str(tmp_path / "p.onnx"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "torchvision" not in out.stderr and "torch.onnx" not in out.stderr, out.stderr
    assert "Wrote" in out.stdout + out.stderr
