"""Process targets for the DD-PPO tests (importable, so torch.multiprocessing can spawn them)."""

from __future__ import annotations

import time

import torch

from shoal.learn.distributed import CollectiveError, DistributedLearner, destroy_process_group, init_process_group


def _sum_loss(module, batch, learner):
    # loss = sum(w * x): d loss / d w = x, so each rank's gradient is its own input.
    return (module.weight * batch["x"]).sum(), {}


def reduce_rank(rank: int, world: int, port: int, xs: list, spin: bool, out) -> None:
    """One rank: gradient of sum(w * x_rank) all-reduced; put (rank, grad, weight after an SGD-free Adam step)."""
    torch.set_num_threads(1)
    init_process_group("gloo", ("127.0.0.1", port), rank, world, timeout_s=20)
    module = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[0.5, -0.5]]))
    learner = DistributedLearner(module, _sum_loss, lr=0.1, spin_wait=spin)
    learner.compute_gradients({"x": torch.tensor([xs[rank]])})
    learner.reduce_gradients()
    grad = module.weight.grad.clone()
    learner.apply_gradients()
    out.put((rank, grad.tolist(), module.weight.detach().clone().tolist(), learner.num_allreduces))
    destroy_process_group()


def dying_peer_rank(rank: int, world: int, port: int, spin: bool, out) -> None:
    """Rank 1 joins and exits at once; rank 0's all-reduce must fail fast with CollectiveError."""
    torch.set_num_threads(1)
    init_process_group("gloo", ("127.0.0.1", port), rank, world, timeout_s=10)
    if rank == 1:
        return  # the process ends: its sockets close
    time.sleep(1.0)
    module = torch.nn.Linear(2, 1, bias=False)
    learner = DistributedLearner(module, _sum_loss, lr=0.1, spin_wait=spin)
    learner.compute_gradients({"x": torch.tensor([[1.0, 1.0]])})
    t0 = time.perf_counter()
    try:
        learner.reduce_gradients()
        out.put(("no error", time.perf_counter() - t0))
    except CollectiveError as e:
        out.put(("CollectiveError", time.perf_counter() - t0, str(e)[:200]))
    destroy_process_group()
