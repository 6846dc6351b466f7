"""Learning under action masks: a module seen through the masks its batch's actions were sampled under."""

from __future__ import annotations

import torch

from shoal.models.distributions import masked_logits


class ActionMasked:
    """``module`` with a batch's ``ACTION_MASK`` applied to its action logits (learner side).

    Wrapping the module for one batch lets an unchanged single-agent loss (e.g.
    ``shoal.algorithms.impala.impala_loss``) learn under the masks the actions were sampled
    with: ``impala_loss(ActionMasked(module, batch[Col.ACTION_MASK]), batch, ...)``.
    """

    def __init__(self, module, mask: torch.Tensor) -> None:
        self.module, self.mask, self.dist_cls = module, mask, module.dist_cls

    def __call__(self, obs: torch.Tensor):
        inputs, values = self.module(obs)
        return masked_logits(inputs, self.mask), values

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.module.value(obs)


__all__ = ["ActionMasked"]
