"""On PYTHONPATH of a start the harness samples (Variant.stack_samples): every Python process of it, and the
engine process it forks, print all their threads' stacks to stderr on SIGUSR1 (harness.StackSampler)."""

import faulthandler
import signal

faulthandler.register(signal.SIGUSR1, all_threads=True)
