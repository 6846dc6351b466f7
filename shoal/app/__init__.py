"""What a user drives: the command line, the training loop with its run directory, Ray Tune,
evaluation, ONNX export and loading a policy for inference.

Everything here builds on the library below it (``shoal.algorithms``, ``shoal.framework``,
``shoal.learn``, ``shoal.rollout``, ...) and nothing below imports it. The public names are
re-exported by ``shoal`` itself (``shoal.train``, ``shoal.load_policy``, ``shoal.export_policy``).
"""
