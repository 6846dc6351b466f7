"""Weights as plain numpy dicts: what travels between learners, rollout actors and checkpoints.

Both sides use these (the learner to publish, a policy to load), so they live with the models
rather than on either side.
"""

from __future__ import annotations

import numpy as np
import torch


def weights_to_numpy(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A host copy of ``module``'s state dict (parameters and buffers) as numpy arrays."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_numpy_weights(module: torch.nn.Module, weights: dict) -> None:
    """Load a dict of numpy arrays (or tensors) into ``module``, on whatever device it sits."""
    state = {k: torch.as_tensor(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
    module.load_state_dict(state)
