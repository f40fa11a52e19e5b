"""Who computes each stage: ``registry`` (an implementation, a registry, ``--impl`` parsing), ``builtin``
(mxkernels', torchao's and torch.compile's, registered as a third party's are), ``default`` (the process-wide
registry with the installed entry points) and ``check`` / ``check_inputs`` (each implementation against the stage's
oracle on adversarial inputs)."""
