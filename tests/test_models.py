"""The model catalog: the conv torso for image-like observations (board games) and the pixel
torsos for Atari frames (nature_cnn, impala_cnn)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algorithms.ppo import PPOConfig
from shoal.config import ModelConfig
from shoal.errors import ConfigError
from shoal.models import build_actor_critic, build_q_network, preprocess_obs
from shoal.models.catalog import ConvTorso, ImpalaCNN, NatureCNN, frame_layout, resolve_torso

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


# ---- pixel torsos: nature_cnn, impala_cnn, frame layouts, uint8 frames ------------------------

FRAMES_CF = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # ale-py / FrameStackObservation: channel-first
FRAMES_CL = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
PIXEL_ACTIONS = gym.spaces.Discrete(6)


def frames(n: int, seed: int = 0) -> np.ndarray:
    """``n`` channel-first uint8 frame stacks, (n, 4, 84, 84)."""
    return np.random.default_rng(seed).integers(0, 256, (n, 4, 84, 84), dtype=np.uint8)


def rows(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x).reshape(len(x), -1))


def pixel_model(kind: str, torso: str, space: gym.Space, seed: int = 0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(torso=torso, hiddens=[], activation="relu", **kw)
    if kind == "q":
        return build_q_network(space, PIXEL_ACTIONS, cfg, dueling=True)
    return build_actor_critic(space, PIXEL_ACTIONS, cfg)


def outputs(model, obs: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(obs)
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("kind", ["ac", "q"])
@pytest.mark.parametrize("torso, features", [("nature_cnn", 512), ("impala_cnn", 256)])
@pytest.mark.parametrize("space", [FRAMES_CF, FRAMES_CL], ids=["channels_first", "channels_last"])
def test_pixel_torsos_give_standard_heads_on_their_features(kind, torso, features, space):
    m = pixel_model(kind, torso, space, vf_share_layers=True) if kind == "ac" else pixel_model(kind, torso, space)
    x = frames(2) if space is FRAMES_CF else frames(2).transpose(0, 2, 3, 1)
    out = outputs(m, rows(x))
    if kind == "ac":
        assert out[0].shape == (2, 6) and out[1].shape == (2,)
        assert m.pi_head[0].in_features == features  # hiddens [] : the heads sit on the torso's features
    else:
        assert out[0].shape == (2, 6)
        assert m.adv_head[0].in_features == features and m.v_head[0].in_features == features
    torso_module = m.pi_conv if kind == "ac" else m.conv
    assert torso_module.layout == ("channels_first" if space is FRAMES_CF else "channels_last")
    assert (torso_module.in_channels, torso_module.height, torso_module.width) == (4, 84, 84)


@pytest.mark.parametrize("kind", ["ac", "q"])
@pytest.mark.parametrize("torso", ["nature_cnn", "impala_cnn"])
def test_both_layouts_compute_the_same_numbers_on_transposed_frames(kind, torso):
    cf, cl = pixel_model(kind, torso, FRAMES_CF), pixel_model(kind, torso, FRAMES_CL, seed=1)
    cl.load_state_dict(cf.state_dict())  # the same weights: the layout is not in the parameters
    x = frames(3)
    for a, b in zip(outputs(cf, rows(x)), outputs(cl, rows(x.transpose(0, 2, 3, 1)))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("torso", ["nature_cnn", "impala_cnn"])
def test_uint8_frames_are_scaled_like_float_frames_over_255(torso):
    m = pixel_model("ac", torso, FRAMES_CF)
    unit = pixel_model("ac", torso, gym.spaces.Box(0.0, 1.0, (4, 84, 84), np.float32), seed=1)
    unit.load_state_dict(m.state_dict())
    x = frames(2)
    as_bytes = outputs(m, rows(x))
    # Float rows of the uint8 space mean the same numbers; a [0, 1] float space takes them unscaled.
    for a, b, c in zip(as_bytes, outputs(m, rows(x.astype(np.float32))), outputs(unit, rows(x / np.float32(255)))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_float_frames_are_not_scaled():
    t = NatureCNN(gym.spaces.Box(0.0, 1.0, (4, 84, 84), np.float32))
    x = torch.rand(2, 4 * 84 * 84)
    assert t.scale == 1.0 and torch.equal(t.images(x), x.reshape(2, 4, 84, 84))
    assert torch.equal(t.images(rows(frames(1))), torch.from_numpy(frames(1)).float())  # uint8 rows only cast


def test_mlp_takes_uint8_rows_as_floats_unscaled():
    ram = gym.spaces.Box(0, 255, (128,), np.uint8)  # a vector observation, e.g. Atari RAM
    m = build_actor_critic(ram, PIXEL_ACTIONS, ModelConfig(hiddens=[16]))
    q = build_q_network(ram, PIXEL_ACTIONS, ModelConfig(hiddens=[16]))
    assert m.torso == "mlp" and m.pi_conv is None and q.conv is None
    x = np.random.default_rng(0).integers(0, 256, (3, 128), dtype=np.uint8)
    for model in (m, q):
        for a, b in zip(outputs(model, torch.from_numpy(x)), outputs(model, torch.from_numpy(x.astype(np.float32)))):
            assert torch.equal(a, b)
    assert torch.equal(m.value(torch.from_numpy(x)), m.value(torch.from_numpy(x.astype(np.float32))))


def test_nature_cnn_is_the_papers_network():
    t = NatureCNN(FRAMES_CF)
    assert [tuple(c.weight.shape) for c in t.convs] == [(32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3)]
    assert [c.stride for c in t.convs] == [(4, 4), (2, 2), (1, 1)]
    assert (t.fc.in_features, t.fc.out_features) == (64 * 7 * 7, 512)


def test_impala_cnn_has_15_conv_layers():
    t = ImpalaCNN(FRAMES_CF)
    convs = [mod for mod in t.modules() if isinstance(mod, torch.nn.Conv2d)]
    assert len(convs) == 15
    assert [c.out_channels for c in convs] == [16] * 5 + [32] * 10
    assert all(c.kernel_size == (3, 3) for c in convs)
    assert (t.fc.in_features, t.fc.out_features) == (32 * 11 * 11, 256)  # 84 -> 42 -> 21 -> 11


def first_conv(torso: torch.nn.Module) -> torch.nn.Conv2d:
    return next(mod for mod in torso.modules() if isinstance(mod, torch.nn.Conv2d))


@pytest.mark.parametrize("torso", ["nature_cnn", "impala_cnn"])
@pytest.mark.parametrize("share", [False, True])
def test_pixel_actor_critic_keeps_one_torso_per_network_unless_shared(torso, share):
    m = pixel_model("ac", torso, FRAMES_CF, vf_share_layers=share)
    assert (m.vf_conv is None) == share
    obs = rows(frames(2))
    logits, v = m(obs)
    assert torch.allclose(m.value(obs), v)
    (logits.sum() + v.sum()).backward()
    assert first_conv(m.pi_conv).weight.grad.abs().sum() > 0
    if not share:
        assert first_conv(m.vf_conv).weight.grad.abs().sum() > 0
        assert first_conv(m.vf_conv).weight.data_ptr() != first_conv(m.pi_conv).weight.data_ptr()


def test_hiddens_apply_after_a_cnn_torso():
    m = build_actor_critic(FRAMES_CF, PIXEL_ACTIONS, ModelConfig(torso="nature_cnn", hiddens=[32]))
    assert m.pi[0].in_features == 512 and m.pi[0].out_features == 32


@pytest.mark.parametrize(
    "space, conv_filters, expected",
    [
        (FRAMES_CF, [], "nature_cnn"),
        (FRAMES_CL, [], "nature_cnn"),
        (FRAMES_CF, [[16, 8, 4]], "conv"),
        (BOARD, [[16, 4, 1]], "conv"),
        (BOARD, [], "mlp"),  # int8 planes: not frames
        (gym.spaces.Box(0.0, 1.0, (4, 84, 84), np.float32), [], "mlp"),  # float images keep their MLP
        (gym.spaces.Box(0, 255, (128,), np.uint8), [], "mlp"),  # a uint8 vector
        (gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), [], "mlp"),  # too small for the Nature network
        (gym.spaces.Discrete(5), [], "mlp"),
    ],
)
def test_auto_torso_resolution(space, conv_filters, expected):
    assert resolve_torso(space, "auto", conv_filters) == expected
    assert build_actor_critic(space, ACTIONS, ModelConfig(conv_filters=conv_filters)).torso == expected


def test_frame_layout_detection():
    assert frame_layout((4, 84, 84)) == "channels_first"
    assert frame_layout((84, 84, 4)) == "channels_last"
    assert frame_layout((6, 7, 2)) == "channels_last"  # connect four: what ConvTorso always assumed
    assert frame_layout((1, 64, 48)) == "channels_first"
    assert frame_layout((4, 4, 4), "channels_last") == "channels_last"


@pytest.mark.parametrize("shape", [(4, 4, 4), (84, 84, 84), (3, 84, 3)])
def test_ambiguous_frame_layout_asks_for_model_frame_layout(shape):
    space = gym.spaces.Box(0, 255, shape, np.uint8)
    with pytest.raises(
        ConfigError,
        match=rf"shape \({shape[0]}, {shape[1]}, {shape[2]}\).*model\.frame_layout: "
        r"channels_first .* channels_last",
    ):
        build_actor_critic(space, ACTIONS, ModelConfig(torso="impala_cnn"))
    m = build_actor_critic(space, ACTIONS, ModelConfig(torso="impala_cnn", frame_layout="channels_last", hiddens=[]))
    assert m.pi_conv.in_channels == shape[2]
    assert m(rows(np.zeros((1, *shape), np.uint8)))[0].shape == (1, 7)


def test_conv_filters_with_another_torso_names_both_keys():
    for torso in ("nature_cnn", "impala_cnn", "mlp"):
        with pytest.raises(ValueError, match=rf"model\.conv_filters is set, but model\.torso is '{torso}'"):
            ModelConfig(conv_filters=[[8, 3, 1]], torso=torso)
        with pytest.raises(ConfigError, match=rf"model\.conv_filters is set, but model\.torso is '{torso}'"):
            PPOConfig(env="CartPole-v1", model={"conv_filters": [[8, 3, 1]], "torso": torso})
        with pytest.raises(ConfigError, match=r"model\.conv_filters.*model\.torso"):
            resolve_torso(FRAMES_CF, torso, [[8, 3, 1]])
    cfg = ModelConfig(torso="nature_cnn")
    with pytest.raises(ConfigError, match="model.conv_filters is set"):
        cfg.conv_filters = [[8, 3, 1]]
    assert cfg.conv_filters == []  # the refused assignment is undone
    with pytest.raises(ConfigError, match=r"torso 'conv' needs its layers in model\.conv_filters"):
        build_actor_critic(FRAMES_CF, ACTIONS, ModelConfig(torso="conv"))


def test_cnn_torsos_refuse_what_they_cannot_see():
    with pytest.raises(ConfigError, match=r"nature_cnn needs an image-like Box observation"):
        build_actor_critic(gym.spaces.Box(0, 255, (128,), np.uint8), ACTIONS, ModelConfig(torso="nature_cnn"))
    with pytest.raises(ConfigError, match=r"8x8 kernel does not fit the 7x7 .* at least 36x36"):
        build_q_network(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), ACTIONS, ModelConfig(torso="nature_cnn"))


def test_conv_torso_follows_the_frame_layout():
    cl = ConvTorso(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), [[8, 8, 4]], "relu")
    cf = ConvTorso(FRAMES_CF, [[8, 8, 4]], "relu")
    cf.load_state_dict(cl.state_dict())
    x = frames(2)
    torch.testing.assert_close(cf(rows(x)), cl(rows(x.transpose(0, 2, 3, 1))), rtol=1e-5, atol=1e-6)
    assert cf(rows(x)).abs().max() < 10  # uint8 frames reach the convolutions in [0, 1]


def test_a_conv_covering_the_whole_map_is_the_same_matmul_forward_and_backward():
    """The 42x42 presets' last layer, [256, 9, 1] on a 9x9 map, runs as one matmul: the same
    outputs and gradients as conv2d; a kernel smaller than its map still runs as a convolution."""
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (4, 42, 42), np.uint8)
    torso = ConvTorso(space, [[8, 4, 2], [16, 4, 2], [32, 9, 1]], "relu", "channels_first")
    obs = torch.randint(0, 256, (5, 4, 42, 42), dtype=torch.uint8)

    def reference(net):
        x = obs.float() / 255.0
        for layer in net:
            x = layer(x)  # nn.Conv2d.forward: conv2d for every layer
        return x.flatten(1)

    out, ref = torso(obs), reference(torso.net)
    assert out.shape == ref.shape == (5, 32)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), list(torso.parameters()))
    ref_grads = torch.autograd.grad(ref.square().sum(), list(torso.parameters()))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    # an input larger than the kernel: a real convolution, 2x2 outputs per channel
    wide = ConvTorso(gym.spaces.Box(0, 255, (4, 46, 46), np.uint8), [[8, 4, 2], [16, 4, 2], [32, 9, 1]], "relu")
    assert wide(torch.zeros(1, 4, 46, 46, dtype=torch.uint8)).shape == (1, 32 * 2 * 2)
