"""One exception type for everything a user can get wrong.

The CLI turns :class:`SlideDPError` into a single line on stderr and exit code 2; anything else is a bug
and keeps its traceback.
"""


class SlideDPError(Exception):
    """Bad user input: unknown preset, malformed file, infeasible policy, impossible budget."""

    exit_code = 2


class TrainingStopped(SlideDPError):
    """A run stopped on purpose (a non-finite gradient with --on-nonfinite stop)."""

    exit_code = 3


class OutOfGpuMemory(SlideDPError):
    """A run's plan did not fit the GPU after all (the memory model's estimate was low): one line naming the
    predicted peak and the budget, and an exit code of its own, so a driver can plan again for less."""

    exit_code = 4


class Interrupted(KeyboardInterrupt):
    """A one-process run stopped by a signal (``signum``: SIGINT or SIGTERM). Raised by the trainer between steps
    after the first signal, where the run's state and logs are consistent, or at once on a second signal; a
    KeyboardInterrupt, so that every cleanup that Ctrl-C runs runs for it too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def first_few(labels: list[str], shown: int = 3) -> str:
    """What a one-line message is about, as the first ``shown`` and a count of the rest: one line however many."""
    return ", ".join(labels[:shown]) + (f" and {len(labels) - shown} more" if len(labels) > shown else "")
