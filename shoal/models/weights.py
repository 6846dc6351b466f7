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
    """Load a dict of numpy arrays (or tensors) into ``module``, on whatever device it sits.

    When the names and shapes are exactly the module's parameters and buffers, each is copied in
    place (an in-process actor loads weights every env step: ~4x cheaper than ``load_state_dict``);
    anything else goes through ``load_state_dict`` and its errors."""
    targets = dict(module.named_parameters())
    targets.update(module.named_buffers())
    if targets.keys() == weights.keys() and all(tuple(targets[k].shape) == np.shape(v) for k, v in weights.items()):
        with torch.no_grad():
            for k, v in weights.items():
                t = targets[k]
                if t.device.type == "cpu" and isinstance(v, np.ndarray):  # arrays from Ray's store are read-only
                    np.copyto(t.detach().numpy(), v, casting="unsafe")
                else:
                    t.copy_(torch.as_tensor(np.array(v)) if isinstance(v, np.ndarray) else v)
        return
    state = {k: torch.as_tensor(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
    module.load_state_dict(state)
