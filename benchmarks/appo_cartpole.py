"""APPO on CartPole-v1: wall seconds and env steps to a mean return of 450, throughput, learner idle time.

The same measurement as ``benchmarks/impala_cartpole.py`` (see its docstring for the output),
run on ``examples/appo_cartpole.yaml``:

    python benchmarks/appo_cartpole.py [--seeds 3] [--config examples/appo_cartpole.yaml] [--max-seconds 120]

The last stdout line is one JSON object with ``"benchmark": "appo_cartpole"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from impala_cartpole import main  # noqa: E402

if __name__ == "__main__":
    main("appo")
