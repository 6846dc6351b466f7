"""Compressed replay columns (lz4 blocks of uint8 observation rows) and the memory check made
before a ring is allocated. Frames are synthetic (a constant background with a moving
block), so no Atari emulator is needed."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from shoal import checkpoint as ckpt
from shoal import process
from shoal.algorithms.apex import ApeXConfig
from shoal.algorithms.dqn import DQNConfig, make_replay, replay_kwargs
from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.replay import PrioritizedReplayBuffer, ReplayBuffer, ReplayShard, storage, warmup

STACK = (4, 84, 84)  # 28,224 bytes a row


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    warmup()


def frames(ids, shape=STACK) -> np.ndarray:
    """One stack per id: a grey background, a bright 8x6 block whose row and brightness follow
    the id (frame f of the stack shows it one row further), flattened unless ``shape`` is kept."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.full((len(ids),) + STACK, 87, dtype=np.uint8)
    for j, i in enumerate(ids.tolist()):
        for f in range(4):
            top = (i + f) % 76
            out[j, f, top : top + 8, 30:36] = 100 + i % 150
    return out.reshape((len(ids),) + shape) if shape == STACK else out.reshape(len(ids), -1)


def transitions(ids, shape=(28_224,)) -> Batch:
    """Transitions whose every column encodes its id (obs: frames(id), next_obs: frames(id + 1))."""
    ids = np.asarray(ids, dtype=np.int64)
    return Batch(
        {
            Col.OBS: frames(ids, shape),
            Col.ACTIONS: ids % 6,
            Col.REWARDS: ids.astype(np.float32),
            Col.NEXT_OBS: frames(ids + 1, shape),
            Col.TERMINATEDS: ids % 7 == 0,
        }
    )


def assert_rows_match_their_ids(batch: Batch, shape=(28_224,)) -> None:
    ids = batch[Col.REWARDS].astype(np.int64)
    for col, off in ((Col.OBS, 0), (Col.NEXT_OBS, 1)):
        assert batch[col].dtype == np.uint8 and batch[col].shape == (len(ids),) + shape
        assert batch[col].flags.writeable
        np.testing.assert_array_equal(batch[col], frames(ids + off, shape))  # bit for bit


# ---- round trips --------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(28_224,), STACK], ids=["flat", "stacked"])
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_uint8_stacks_come_back_bit_for_bit_across_ring_wraps(prioritized, shape):
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    buf = cls(50, seed=0, compression="auto")
    assert buf.add(transitions(range(30), shape)).tolist() == list(range(30))
    slots = buf.add(transitions(range(30, 75), shape))  # ids 30..74: wraps, overwriting ids 0..24
    assert slots.tolist() == list(range(30, 50)) + list(range(25))
    assert buf.compressed_columns == [Col.OBS, Col.NEXT_OBS]
    assert buf.columns[Col.OBS] == (shape, np.dtype(np.uint8)) == buf.columns[Col.NEXT_OBS]
    assert buf.columns[Col.REWARDS] == ((), np.dtype(np.float32))
    assert len(buf) == 50 and buf.added == 75
    b = buf.sample(400)
    assert_rows_match_their_ids(b, shape)
    np.testing.assert_array_equal(b[Col.ROW_IDS], b[Col.REWARDS].astype(np.int64))  # ids are the add order
    assert set(b[Col.ROW_IDS].tolist()) <= set(range(25, 75))
    buf.add(transitions(range(75, 200), shape))  # longer than the ring: keeps ids 150..199
    b = buf.sample(200)
    assert_rows_match_their_ids(b, shape)
    assert b[Col.ROW_IDS].min() >= 150
    # the blocks are much smaller than the rows they hold
    assert buf.nbytes < 50 * 2 * 28_224 / 10


def test_compressed_and_plain_buffers_sample_the_same_rows_and_priorities():
    """Same seed, same adds and updates: the compressed buffer draws and returns exactly what the plain one does."""
    rng = np.random.default_rng(0)
    bufs = [PrioritizedReplayBuffer(64, alpha=0.7, seed=3, compression=c) for c in ("auto", "none")]
    dropped = 0
    for start in range(0, 160, 40):
        p = rng.random(40) * 3
        for buf in bufs:
            buf.add(transitions(range(start, start + 40)), priorities=p)
        samples = [buf.sample(32) for buf in bufs]
        for col in samples[0].keys():
            np.testing.assert_array_equal(samples[0][col], samples[1][col])
        assert_rows_match_their_ids(samples[0])
        new = rng.random(32) * 5
        stale = [buf.add(transitions(range(1000 + start, 1000 + start + 8))) for buf in bufs]  # overwrite some slots
        np.testing.assert_array_equal(*stale)
        counts = [buf.update_priorities(s[Col.INDICES], new, s[Col.ROW_IDS]) for buf, s in zip(bufs, samples)]
        assert counts[0] == counts[1]
        dropped += 32 - counts[0]
    assert [b.compressed_columns for b in bufs] == [[Col.OBS, Col.NEXT_OBS], []]
    assert dropped > 0  # priorities of slots overwritten since the sample were dropped, by both
    np.testing.assert_array_equal(bufs[0].priorities(), bufs[1].priorities())


def test_state_round_trip_through_a_weights_only_checkpoint(tmp_path):
    shard = ReplayShard(40, prioritized=True, alpha=0.6, beta=0.4, seed=7, compression="auto")
    shard.add(transitions(range(30)), priorities=np.linspace(0.1, 3.0, 30))
    shard.add(transitions(range(30, 55)), priorities=np.linspace(3.0, 0.1, 25))  # wraps
    b = shard.sample(16)
    shard.update_priorities(b[Col.INDICES], np.linspace(0.5, 2.0, 16), b[Col.ROW_IDS])
    state = shard.get_state()
    obs = state["buffer"]["columns"][Col.OBS]
    assert obs["codec"] == "lz4" and obs["row_shape"] == [28_224] and obs["dtype"] == "uint8"
    assert obs["data"].dtype == torch.uint8 and obs["offsets"].dtype == torch.int64
    assert len(obs["offsets"]) == 41 and int(obs["offsets"][-1]) == len(obs["data"]) < 40 * 28_224 / 10
    path = ckpt.save_checkpoint(tmp_path / "ckpt", {"replay": [state]}, {"algo": "test"})
    raw = torch.load(path / ckpt.STATE_FILE, weights_only=True)  # plain tensors, numbers, strings, lists, dicts
    assert raw["replay"][0]["buffer"]["columns"][Col.OBS]["data"].dtype == torch.uint8
    loaded, _ = ckpt.load_checkpoint(path)
    saved_stats = shard.stats()

    for compression in ("auto", "none"):  # restored as this buffer stores columns, either way
        restored = ReplayShard(40, prioritized=True, alpha=0.6, beta=0.4, seed=1, compression=compression)
        restored.set_state(loaded["replay"][0])
        assert restored.buffer.compressed_columns == ([Col.OBS, Col.NEXT_OBS] if compression == "auto" else [])
        assert restored.buffer.columns == shard.buffer.columns and restored.stats() == saved_stats
        np.testing.assert_array_equal(restored.buffer.priorities(), shard.buffer.priorities())
        restored.buffer._rng.bit_generator.state = shard.buffer._rng.bit_generator.state
        a, c = shard.sample(64), restored.sample(64)
        for col in a.keys():
            np.testing.assert_array_equal(a[col], c[col])
        assert_rows_match_their_ids(c)
        assert restored.add(transitions([99])) == 1 and restored.buffer.sample(1)[Col.OBS].dtype == np.uint8
    # a state saved plain is compressed when restored into a compressing buffer
    plain = ReplayBuffer(10, seed=0)
    plain.add(transitions(range(12)))
    packed = ReplayBuffer(10, seed=0, compression="auto")
    packed.set_state(plain.get_state())
    assert packed.compressed_columns == [Col.OBS, Col.NEXT_OBS]
    a, c = packed.sample(30), plain.sample(30)  # the same rng state: the same draws
    assert_rows_match_their_ids(a)
    np.testing.assert_array_equal(a[Col.OBS], c[Col.OBS])


# ---- which columns are compressed --------------------------------------------------------
def test_auto_compresses_large_uint8_observations_only():
    atari = {
        Col.OBS: ((28_224,), np.uint8),
        Col.NEXT_OBS: ((28_224,), np.uint8),
        Col.ACTIONS: ((), np.int64),
        Col.REWARDS: ((), np.float32),
    }
    cartpole = {Col.OBS: ((4,), np.float32), Col.NEXT_OBS: ((4,), np.float32), Col.ACTIONS: ((), np.int64)}
    small = {Col.OBS: ((16,), np.uint8), Col.NEXT_OBS: ((16,), np.uint8)}
    big_not_obs = {Col.ACTION_MASK: ((4096,), np.uint8), Col.OBS: ((4,), np.float32)}
    assert storage.compressed_names(atari, "auto") == [Col.OBS, Col.NEXT_OBS]
    assert storage.compressed_names(cartpole, "auto") == []
    assert storage.compressed_names(small, "auto") == []
    assert storage.compressed_names(big_not_obs, "auto") == []
    assert storage.compressed_names({Col.OBS: ((32, 32), np.uint8)}, "auto") == [Col.OBS]  # 1 KiB: compressed
    assert storage.compressed_names({Col.OBS: ((1023,), np.uint8)}, "auto") == []
    assert storage.compressed_names(small, "lz4") == [Col.OBS, Col.NEXT_OBS]  # lz4: any uint8 observation
    assert storage.compressed_names(atari, "none") == []
    with pytest.raises(ConfigError, match=r"lz4 compresses uint8 observation columns.*obs float32 \(4,\)"):
        storage.compressed_names(cartpole, "lz4")

    buf = ReplayBuffer(100, compression="auto")  # a float32 CartPole batch stays plain
    buf.add(Batch({Col.OBS: np.ones((5, 4), np.float32), Col.ACTIONS: np.zeros(5, np.int64)}))
    assert buf.compressed_columns == [] and buf.columns[Col.OBS] == ((4,), np.dtype(np.float32))
    lz4 = ReplayBuffer(100, compression="lz4")
    with pytest.raises(ConfigError, match="set replay_compression to auto or none"):
        lz4.add(Batch({Col.OBS: np.ones((5, 4), np.float32), Col.ACTIONS: np.zeros(5, np.int64)}))
    assert len(lz4) == 0 and lz4.columns == {} and lz4.added == 0


def test_a_compressed_column_casts_like_a_plain_uint8_one():
    bufs = [ReplayBuffer(8, seed=0, compression=c) for c in ("lz4", "none")]
    for buf in bufs:
        buf.add(Batch({Col.OBS: np.arange(4, dtype=np.uint8).reshape(2, 2), Col.REWARDS: np.zeros(2)}))
        buf.add(Batch({Col.OBS: np.array([[1, 300], [7, 9]], dtype=np.uint16), Col.REWARDS: np.zeros(2)}))
        with pytest.raises(ValueError, match="dtype"):
            buf.add(Batch({Col.OBS: np.zeros((1, 2), np.float32), Col.REWARDS: np.zeros(1)}))
    assert bufs[0].compressed_columns == [Col.OBS]
    np.testing.assert_array_equal(bufs[0].sample(20)[Col.OBS], bufs[1].sample(20)[Col.OBS])


def test_bad_compression_values_are_clear_errors():
    for bad in ("zstd", "LZ4", None, True):
        with pytest.raises(ConfigError, match="replay_compression must be one of auto, lz4, none"):
            ReplayBuffer(10, compression=bad)
    with pytest.raises(ConfigError, match=r"replay_compression.*'auto', 'lz4' or 'none'"):
        DQNConfig(env="CartPole-v1", replay_compression="zstd")
    with pytest.raises(ConfigError, match="replay_compression"):
        ApeXConfig(env="CartPole-v1", replay_compression="gzip")
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="memory_share"):
            ReplayBuffer(10, memory_share=bad)


def test_missing_lz4_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lz4", None)  # import lz4.block now raises ImportError
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[atari\]' in the shoal checkout"):
        ReplayBuffer(10, compression="lz4")
    buf = ReplayBuffer(10, compression="auto")
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[atari\]' in the shoal checkout"):
        buf.add(transitions([0, 1]))
    assert buf.columns == {} and len(buf) == 0
    cartpole = ReplayBuffer(10, compression="auto")  # nothing to compress: lz4 is not needed
    cartpole.add(Batch({Col.OBS: np.ones((2, 4), np.float32)}))
    plain = ReplayBuffer(10, compression="none")
    plain.add(transitions([0, 1]))
    assert plain.compressed_columns == []


# ---- memory check ------------------------------------------------------------------------
def fake_memory(monkeypatch, gb: float | None) -> None:
    monkeypatch.setattr(process, "available_memory_bytes", lambda: None if gb is None else int(gb * 1e9))


def test_a_ring_that_does_not_fit_is_refused_before_anything_is_allocated(monkeypatch):
    fake_memory(monkeypatch, 8.0)

    def no_allocation(*args, **kwargs):
        raise AssertionError("a column was allocated before the memory check")

    monkeypatch.setattr(storage.PlainColumn, "__init__", no_allocation)
    monkeypatch.setattr(storage.Lz4Column, "__init__", no_allocation)
    buf = PrioritizedReplayBuffer(1_000_000, compression="none")
    with pytest.raises(ConfigError) as info:
        buf.add(transitions(range(16)), priorities=np.ones(16))
    msg = str(info.value)
    # 1M rows of two 28,224-byte stacks and 13 bytes of other columns
    assert "replay_capacity" in msg and "1,000,000 rows" in msg and "8.0 GB is available" in msg
    assert "56.5 GB (56,461 bytes per row)" in msg
    assert "lower replay_capacity, or set replay_compression to auto or lz4" in msg and "Nothing was allocated" in msg
    assert len(buf) == 0 and buf.added == 0 and buf.columns == {}
    np.testing.assert_array_equal(buf.priorities(), [])


def test_compression_makes_a_million_stacks_fit(monkeypatch):
    fake_memory(monkeypatch, 8.0)
    buf = ReplayBuffer(1_000_000, compression="auto")
    buf.add(transitions(range(64)))  # checked against the compressed size of these rows, times 2
    assert len(buf) == 64 and buf.compressed_columns == [Col.OBS, Col.NEXT_OBS]
    mean = np.mean([len(b) for b in buf._columns[Col.OBS].blocks[:64]])
    needed = storage.estimate_bytes(
        1_000_000,
        {k: v for k, v in buf.columns.items()},
        {k: buf._columns[k].blocks[:64] for k in buf.compressed_columns},
    )
    assert needed == pytest.approx(1_000_000 * (2 * (2 * mean + storage.ROW_OVERHEAD_BYTES) + 8 + 4 + 1), rel=0.01)
    assert needed < 1e9
    fake_memory(monkeypatch, 0.2)  # compressed and still too large: only a smaller capacity helps
    with pytest.raises(ConfigError, match=r"To fit, lower replay_capacity\. ") as info:
        ReplayBuffer(1_000_000, compression="auto").add(transitions(range(64)))
    assert "replay_compression" not in str(info.value)


def test_each_shard_plans_for_its_share_and_refuses_once(monkeypatch):
    fake_memory(monkeypatch, 4.0)
    rows = transitions(range(8))
    ReplayShard(50_000, compression="none", memory_share=1.0).add(rows)  # 2.8 GB of 4.0
    shard = ReplayShard(50_000, compression="none", memory_share=0.5)  # 2.8 GB of 2.0
    with pytest.raises(ConfigError, match=r"2\.0 GB is available to it \(50% of the 4\.0 GB available"):
        shard.add(rows, np.ones(8))
    # rollout actors add without waiting: later adds store nothing, sample requests get the error
    assert shard.add(rows) == 0 and len(shard) == 0 and shard.stats()["added"] == 0
    answer = shard.sample(4)
    assert isinstance(answer, ConfigError) and "replay_capacity" in str(answer)


def test_no_check_where_available_memory_is_unknown(monkeypatch):
    fake_memory(monkeypatch, None)
    buf = ReplayBuffer(10**9)  # 10^9 float32 rows: np.zeros reserves lazily, nothing is touched
    buf.add(Batch({Col.REWARDS: np.ones(4, np.float32)}))
    assert len(buf) == 4


def test_available_memory_reads_meminfo():
    avail = process.available_memory_bytes()
    if sys.platform.startswith("linux"):
        assert isinstance(avail, int) and avail > 0
    else:
        assert avail is None


# ---- wiring into DQN and Ape-X -----------------------------------------------------------
def test_dqn_config_reaches_the_replay_shard():
    assert DQNConfig(env="CartPole-v1").replay_compression == "auto"
    for mode in ("auto", "lz4", "none"):
        shard = make_replay(DQNConfig(env="CartPole-v1", replay_compression=mode), 100, seed=0)
        assert shard.buffer.compression == mode and shard.buffer.memory_share == 1.0
    shard = make_replay(DQNConfig(env="CartPole-v1", replay_compression="none"), 100, seed=0)
    shard.add(transitions(range(4)))
    assert shard.buffer.compressed_columns == []
    shard = make_replay(DQNConfig(env="CartPole-v1", replay_compression="auto"), 100, seed=0)
    shard.add(transitions(range(4)))
    assert shard.buffer.compressed_columns == [Col.OBS, Col.NEXT_OBS]


def test_a_replay_shard_retains_freed_memory_without_importing_torch():
    """Ape-X shards are processes of their own: they apply resources.retain_freed_memory (a
    sample of 512 Pong rows fills two fresh 14 MB arrays) and still start without torch."""
    import subprocess

    code = (
        "import sys; from shoal.replay import ReplayShard; from shoal import process; "
        "ReplayShard(10, retain_freed_memory=sys.argv[1] == '1'); print(process._retained, 'torch' in sys.modules)"
    )
    for flag, retained in (("1", "True"), ("0", "False")):
        out = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, check=True).stdout
        assert out.split() == [retained, "False"]
    cfg = DQNConfig(env="CartPole-v1", resources={"retain_freed_memory": False})
    assert replay_kwargs(cfg, 0, 4)["retain_freed_memory"] is False
    assert replay_kwargs(DQNConfig(env="CartPole-v1"), 0, 4)["memory_share"] == 0.25


def apex_in_process(**kw):
    return ApeXConfig(
        env="CartPole-v1",
        seed=0,
        min_time_s_per_iteration=0.0,
        learning_starts=64,
        train_batch_size=16,
        rollout_fragment_length=8,
        model={"hiddens": [16]},
        resources={"num_workers": 0, "num_envs_per_worker": 2, "num_replay_shards": 2},
        **kw,
    ).build()


def test_apex_shards_get_the_compression_and_an_equal_share_of_memory():
    algo = apex_in_process(replay_compression="lz4")
    try:
        shards = algo.shards.start().actors
        assert [(s.buffer.compression, s.buffer.memory_share) for s in shards.values()] == [("lz4", 0.5)] * 2
        # lz4 asks for compressed uint8 observations; CartPole's are float32: a config error at the first add
        with pytest.raises(ConfigError, match="lz4 compresses uint8 observation columns"):
            for _ in range(10):
                algo.train()
    finally:
        algo.stop()


def test_apex_driver_raises_a_refusal_that_a_shard_answers_a_sample_request_with():
    """On Ray, rollout actors add without waiting, so the driver learns of a refused first add
    from the shard's answer to its next sample request (stood in for here in-process)."""
    algo = apex_in_process()
    try:
        for shard in algo.shards.start().actors.values():
            shard.refused = ConfigError("replay_capacity is too large for this machine's memory (test)")
        with pytest.raises(ConfigError, match=r"too large for this machine's memory \(test\)"):
            for _ in range(50):
                algo.train()
        assert sum(s["added"] for s in algo.shards.foreach("stats")) == 0
    finally:
        algo.stop()
