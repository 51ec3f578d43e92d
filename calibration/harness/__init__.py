"""Real DeepSpeed training runs: the validation model, the torchrun entry point, and the runner
that executes candidates in subprocesses and records what they measured."""
