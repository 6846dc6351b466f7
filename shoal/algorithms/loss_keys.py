"""The key groups of the losses several algorithms share, composed into their flat configs as
:mod:`shoal.framework.config_groups` describes: V-trace's (IMPALA, APPO, AlphaStar), APPO's
clipped surrogate against a target (APPO, AlphaStar), PPO's (PPO, DD-PPO) and the adaptive KL
penalty (PPO, APPO, AlphaStar), the league's parameter averages and magnet (AlphaStar), with the check that spans two of them."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from shoal.config import EntropySchedule, Section
from shoal.errors import ConfigError


class VTraceKeys(Section):
    """V-trace and the actor-critic loss weights (IMPALA, APPO, AlphaStar)."""

    vtrace_clip_rho_threshold: Optional[float] = Field(
        1.0, gt=0, description="V-trace rho-bar; None disables the clip."
    )
    vtrace_clip_pg_rho_threshold: Optional[float] = Field(
        1.0, gt=0, description="V-trace pg-rho-bar; None disables the clip."
    )
    vtrace_lambda: float = Field(
        1.0, gt=0, le=1, description="V-trace's lambda: scales the traces c_t (1: the paper's main form)."
    )
    vf_loss_coeff: float = Field(0.5, ge=0, description="Weight of the value loss.")
    entropy_coeff: float = Field(0.01, ge=0, description="Weight of the entropy bonus.")
    entropy_coeff_schedule: EntropySchedule = None
    normalize_advantages: bool = Field(
        False, description="Standardize the V-trace advantages over each learner batch's valid steps (as PPO does)."
    )


class ClipTargetKeys(Section):
    """APPO's clipped surrogate against a target network (APPO, AlphaStar)."""

    clip_param: float = Field(0.4, gt=0, description="Clip of the ratio pi / pi_target in the surrogate.")
    target_update_frequency: int = Field(4, ge=1, description="Learner updates between target-network refreshes.")


class PolicyAverageKeys(Section):
    """Each learning policy's parameter average and the magnet that pulls the policy towards it
    (AlphaStar). The average is an exponential moving average of the policy's own parameters:
    on a game where the latest policy cycles around an equilibrium, the average sits nearer its
    centre. With ``magnet_coeff`` the loss adds ``magnet_coeff * KL(pi || average)`` (magnetic
    mirror descent with the average as a moving magnet)."""

    average_tau: Optional[float] = Field(
        0.002,
        gt=0,
        le=1,
        description="Each learning policy's learner keeps an exponential moving average of its parameters, moved "
        "this fraction of the way to them after every update (the '<player>@average' policy: loadable, its "
        "exploitability reported on OpenSpiel games); None: no average.",
    )
    magnet_coeff: float = Field(
        0.0, ge=0, description="Weight of KL(pi || average) in the policy's loss (needs average_tau); 0: no pull."
    )


def check_policy_average(cfg) -> None:
    """The magnet pulls towards the average: it needs one."""
    if cfg.magnet_coeff > 0 and cfg.average_tau is None:
        raise ConfigError(
            f"magnet_coeff ({cfg.magnet_coeff}) pulls each policy towards its parameter average, and "
            "average_tau is None (no average kept): set average_tau (e.g. 0.002) or magnet_coeff: 0"
        )


class PPOLossKeys(Section):
    """PPO's surrogate, value loss and SGD schedule (PPO, DD-PPO)."""

    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda.")
    minibatch_size: int = Field(256, ge=1, description="Rows per SGD minibatch.")
    num_sgd_iter: int = Field(10, ge=1, description="Epochs over each train batch.")
    clip_param: float = Field(0.2, gt=0, description="PPO ratio clip epsilon.")
    vf_clip_param: Optional[float] = Field(
        None, gt=0, description="PPO2-style value clipping around the old value; None disables."
    )
    vf_loss_coeff: float = Field(0.5, ge=0, description="Weight of the value loss.")
    entropy_coeff: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    entropy_coeff_schedule: EntropySchedule = None
    normalize_advantages: bool = Field(True, description="Standardize advantages per minibatch.")


class KLPenaltyKeys(Section):
    """An adaptive KL penalty (PPO, APPO, AlphaStar)."""

    use_kl_loss: bool = Field(False, description="Add kl_coeff * KL(old || new), the coefficient adapted to kl_target.")
    kl_coeff: float = Field(1.0, ge=0, description="Initial KL coefficient (adapted towards kl_target).")
    kl_target: float = Field(0.01, gt=0, description="The KL the coefficient is adapted towards.")


# ---- a check that spans groups: each config calls it from its own validator ------------------
def check_kl_against_target(cfg) -> None:
    """A KL penalty against a target network needs the target to lag the policy."""
    if cfg.use_kl_loss and cfg.target_update_frequency < 2:
        raise ValueError(
            "use_kl_loss penalizes KL(target || policy), but target_update_frequency is 1: the target is "
            "refreshed after every update, so the KL the loss sees is always 0 and the penalty does "
            "nothing. Set target_update_frequency to 2 or more, or use_kl_loss to false"
        )
