"""Per-process settings: torch threads and malloc's retained memory (checked in fresh processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from shoal.config import ResourcesConfig

PAGE_FAULTS = textwrap.dedent("""
    import ctypes, ctypes.util, resource, sys, torch
    from shoal.config import ResourcesConfig
    from shoal.process import configure_process

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 2))
    x = torch.randn(4096, 4)  # 1 MB activations per layer: above malloc's first mmap threshold (128 KB)

    def faults(steps=100):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            net.zero_grad()
            net(x).pow(2).mean().backward()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    # Pin glibc's documented starting thresholds (128 KB): left dynamic, malloc raises its mmap
    # threshold after the first large free by an amount that varies from run to run.
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    faults(5)
    before = faults()
    configure_process(ResourcesConfig(torch_threads=int(sys.argv[1]), retain_freed_memory=sys.argv[2] == "1"))
    faults(20)
    from shoal import process
    print(before, faults(), torch.get_num_threads(), int(process._retained))
""")


def _run(threads: int, retain: bool) -> tuple[int, int, int, bool]:
    """Page faults of 100 steps before and after configure_process, the thread count, whether mallopt was applied."""
    out = subprocess.run(
        [sys.executable, "-c", PAGE_FAULTS, str(threads), "1" if retain else "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1]), int(out[2]), out[3] == "1"


# Page-fault counts are compared as a ratio of two runs of the same 100 steps in one process:
# load on the machine may add faults to both, so no test holds a count against a fixed limit.


def test_retained_memory_removes_the_page_faults_of_every_minibatch():
    before, after, threads, retained = _run(2, retain=True)
    assert before >= 100 * 10, (
        before
    )  # glibc's starting thresholds: freed activations go back to the kernel, then fault back in
    assert after * 5 < before, (
        before,
        after,
    )  # the same 100 steps reuse the retained blocks: a fifth of the faults at most
    assert threads == 2 and retained  # and the thread count was applied


def test_retained_memory_is_on_by_default_and_can_be_switched_off():
    assert ResourcesConfig().retain_freed_memory is True
    _, _, threads, retained = _run(1, retain=False)
    # Switched off, malloc keeps its defaults. Its own dynamic mmap threshold may then cut the faults
    # too, by how much varies from run to run, so the check is that mallopt was left alone.
    assert threads == 1 and not retained
