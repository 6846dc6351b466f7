"""Learning under action masks: a module seen through the masks its batch's actions were sampled under."""

from __future__ import annotations

import torch

from shoal.models.distributions import masked_logits


class ActionMasked:
    """``module`` with a batch's ``ACTION_MASK`` applied to its action logits (learner side).

    Wrapping the module for one batch lets an unchanged loss learn under the masks the actions
    were sampled with: PPO's, IMPALA's and APPO's loss records call themselves on
    ``ActionMasked(module, batch[Col.ACTION_MASK])`` when the batch has that column (an env or a
    game with action masks).
    """

    def __init__(self, module, mask: torch.Tensor) -> None:
        self.module, self.mask, self.dist_cls = module, mask, module.dist_cls
        self.recurrent = bool(getattr(module, "recurrent", False))
        self.state_size = getattr(module, "state_size", 0)

    def __call__(self, obs: torch.Tensor):
        inputs, values = self.module(obs)
        return masked_logits(inputs, self.mask), values

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.module.value(obs)

    # a recurrent module: the same, over sequences (the mask has one row per batch row)
    def unroll(self, obs: torch.Tensor, state: torch.Tensor, starts, seq_len: int):
        inputs, values, final = self.module.unroll(obs, state, starts, seq_len)
        return masked_logits(inputs, self.mask), values, final

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.module.value_step(obs, state)


__all__ = ["ActionMasked"]
