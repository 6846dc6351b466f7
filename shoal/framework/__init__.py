"""The framework every algorithm stands on: the :class:`~shoal.framework.base.Algorithm` base class
and what it delegates to (env checks, checkpoints, config changes, evaluation, prediction), the
policies a run trains (:class:`~shoal.framework.policies.PolicySet`), where they learn (the
runners), how weights reach the actors, rollout-group construction, and the asynchronous pipeline
and learner group of IMPALA and APPO. No module here imports an algorithm; the algorithms, in
``shoal.algorithms``, import from here. Import the modules themselves: this package imports none."""
