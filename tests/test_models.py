"""The model catalog: the conv torso for image-like observations (board games)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.config import ModelConfig
from shoal.models import build_actor_critic, build_q_network, preprocess_obs
from shoal.models.catalog import ConvTorso

BOARD = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)  # connect four's observation
ACTIONS = gym.spaces.Discrete(7)


def test_conv_torso_sees_the_board_in_its_image_shape():
    torso = ConvTorso(BOARD, [[1, 4, 1]], "relu")
    assert torso.out_dim == 1 * 3 * 4  # 6x7 with a 4x4 kernel, no padding -> 3x4
    conv = torso.net[0]
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        conv.weight[0, 0] = torch.eye(4)  # channel 0 (the player's own stones), the main diagonal
    board = np.zeros((1, 6, 7, 2), np.float32)
    for i in range(4):  # four in a diagonal from row 1, column 2
        board[0, 1 + i, 2 + i, 0] = 1.0
    board[0, 0, 0, 1] = 1.0  # an opponent stone the kernel ignores
    out = torso(torch.from_numpy(preprocess_obs(BOARD, board))).reshape(3, 4)
    # Only the window whose top-left corner is (1, 2) holds the whole diagonal.
    expected = torch.zeros(3, 4)
    expected[1, 2] = 4.0
    expected[0, 1] = 3.0  # the windows one step up-left and down-right hold three of them on their diagonals
    expected[2, 3] = 3.0
    assert torch.equal(out, expected)


@pytest.mark.parametrize("share", [False, True])
def test_actor_critic_with_conv_torso(share):
    cfg = ModelConfig(conv_filters=[[16, 4, 1], [8, 2, 1]], hiddens=[32], activation="relu", vf_share_layers=share)
    m = build_actor_critic(BOARD, ACTIONS, cfg)
    obs = torch.from_numpy(preprocess_obs(BOARD, np.random.default_rng(0).integers(0, 2, (5, 6, 7, 2))))
    logits, v = m(obs)
    assert logits.shape == (5, 7) and v.shape == (5,)
    assert torch.allclose(m.value(obs), v)
    assert (m.vf_conv is None) == share
    # Gradients reach the conv layers of both heads.
    (logits.sum() + v.sum()).backward()
    assert m.pi_conv.net[0].weight.grad.abs().sum() > 0
    if not share:
        assert m.vf_conv.net[0].weight.grad.abs().sum() > 0


def test_q_network_with_conv_torso():
    q = build_q_network(BOARD, ACTIONS, ModelConfig(conv_filters=[[8, 3, 1]], hiddens=[16]), dueling=True)
    assert q(torch.zeros(3, 84)).shape == (3, 7)


def test_conv_filters_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"conv_filters\[1\].*three positive integers"):
        ModelConfig(conv_filters=[[8, 3, 1], [8, 3]])
    with pytest.raises(ValueError, match=r"image-like Box observation of shape \(H, W, C\)"):
        build_actor_critic(gym.spaces.Box(-1, 1, (4,)), ACTIONS, ModelConfig(conv_filters=[[8, 3, 1]]))
    with pytest.raises(ValueError, match="8x8 kernel does not fit the 6x7"):
        build_actor_critic(BOARD, ACTIONS, ModelConfig(conv_filters=[[8, 8, 1]]))


def test_mlp_only_models_are_unchanged_without_conv_filters():
    m = build_actor_critic(BOARD, ACTIONS, ModelConfig(hiddens=[8]))
    assert m.pi_conv is None and m.vf_conv is None
    assert m.pi[0].in_features == 84
