"""The key groups of the losses several algorithms share, composed into their flat configs as
:mod:`shoal.framework.config_groups` describes: V-trace's (IMPALA, APPO, AlphaStar), APPO's
clipped surrogate against a target (APPO, AlphaStar), PPO's (PPO, DD-PPO) and the adaptive KL
penalty (PPO, APPO, AlphaStar), the league's parameter averages and magnet (AlphaStar), with the check that spans two of them."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

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
    """Each learning policy's average, the '<player>@average' policy, and the magnet that pulls
    the policy towards it (AlphaStar). On a game where the latest policy cycles around an
    equilibrium, an average sits nearer its centre. ``average_policy: parameters`` keeps an
    exponential moving average of the policy's parameters (``average_tau``); ``behaviour``
    trains a copy of the policy's network by supervision on its own actions over its latest
    ``average_window`` rows (NFSP's average network over a sliding window). With
    ``magnet_coeff`` the loss adds ``magnet_coeff * KL(pi || average)`` (magnetic mirror descent
    with the average, either kind, as a moving magnet)."""

    average_policy: Optional[Literal["parameters", "behaviour"]] = Field(
        "parameters",
        description="The average each learning policy's learner keeps (the '<player>@average' policy: loadable, "
        "its exploitability reported on OpenSpiel games): parameters (a moving average of the policy's "
        "parameters), behaviour (a network trained on the policy's own recent actions); None: none.",
    )
    average_tau: float = Field(
        0.002,
        gt=0,
        le=1,
        description="average_policy parameters: the average moves this fraction of the way to the policy's "
        "parameters after every update.",
    )
    average_window: int = Field(
        500_000,
        ge=1,
        description="average_policy behaviour: the latest rows of the policy's own play (observation, action "
        "mask, action) the average learns from.",
    )
    average_sgd_steps: int = Field(
        2, ge=1, description="average_policy behaviour: supervised steps on the window after every policy update."
    )
    average_batch_size: int = Field(
        512, ge=1, description="average_policy behaviour: rows per supervised step, drawn from the window."
    )
    average_lr: float = Field(0.001, gt=0, description="average_policy behaviour: Adam's learning rate.")
    magnet_coeff: float = Field(
        0.0,
        ge=0,
        description="Weight of KL(pi || average) in the policy's loss, the average being average_policy's "
        "(parameters or behaviour); 0: no pull.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_average_as_it_was_written(cls, data: Any) -> Any:
        """``average_tau: null`` is how a config said "no average" before ``average_policy``
        (checkpoints of that time carry it): read it as ``average_policy: null``."""
        if isinstance(data, dict) and "average_tau" in data and data["average_tau"] is None:
            data = {k: v for k, v in data.items() if k != "average_tau"}
            data.setdefault("average_policy", None)
        return data


PARAMETER_AVERAGE_KEYS = ("average_tau",)
BEHAVIOUR_AVERAGE_KEYS = ("average_window", "average_sgd_steps", "average_batch_size", "average_lr")


def check_policy_average(cfg) -> None:
    """Each average's keys only with that average; the magnet pulls towards the average kept."""
    kind = cfg.average_policy
    for key in (*PARAMETER_AVERAGE_KEYS, *BEHAVIOUR_AVERAGE_KEYS):
        wanted = "parameters" if key in PARAMETER_AVERAGE_KEYS else "behaviour"
        # a value off its default for the other average (a full dump of a config carries the defaults)
        if kind != wanted and getattr(cfg, key) != PolicyAverageKeys.model_fields[key].default:
            raise ConfigError(
                f"{key} ({getattr(cfg, key)}) sets the {wanted} average, and average_policy is {kind}: "
                f"set average_policy: {wanted}, or leave {key} at its default"
            )
    if kind == "behaviour" and getattr(cfg.model, "use_lstm", False):
        raise ConfigError(
            "average_policy: behaviour trains a feed-forward copy of the policy on single steps, and "
            "model.use_lstm is true: use average_policy: parameters"
        )
    if cfg.magnet_coeff > 0 and kind is None:
        raise ConfigError(
            f"magnet_coeff ({cfg.magnet_coeff}) pulls each policy towards its average, and average_policy is "
            "None: set average_policy (parameters or behaviour), or magnet_coeff: 0"
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
