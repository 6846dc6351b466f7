"""A league policy's learner group outside Ray: one replica (:class:`LeagueGroupLearner`) per
spawned process in a gloo group, each pulling its part from a replay of its own (importable, so
torch.multiprocessing can spawn it)."""

from __future__ import annotations


def league_rank(rank: int, world: int, port: int, cfg, spaces, cases: list, out) -> None:
    """For each case ``(start weights, parts)``: a fresh replica from the weights, ``parts[rank]`` in
    its replay (None: nothing), one round; put ``(rank, [(env_steps, weights or None, replica's weights)])``."""
    import torch

    from shoal.algorithms.alpha_star_group import LeagueGroupLearner
    from shoal.learn.distributed import destroy_process_group, init_process_group
    from shoal.replay import BatchReplay

    torch.set_num_threads(1)
    init_process_group("gloo", ("127.0.0.1", port), rank, world, timeout_s=60)  # one group for every case
    got = []
    try:
        for weights, parts in cases:
            replay = BatchReplay(capacity=4)
            if parts[rank] is not None:
                replay.add_batch("main", parts[rank])
            member = LeagueGroupLearner("main", replay, cfg, rank, *spaces)
            member.set_state({"weights": weights})
            member.rank, member.world_size = rank, world  # in the group above (join_group would form a new one)
            member.add([], 0)
            report = member.report()
            assert report["error"] is None, report["error"]
            (r,) = report["results"]
            got.append((r.env_steps, r.weights, member.get_weights()))
    finally:
        out.put((rank, got))
        destroy_process_group()
