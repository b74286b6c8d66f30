"""torchrun as `slidedp train --nproc N` runs it: the same program, without the Python traceback torchrun ends
with when a rank fails or a signal stops it.

The launcher (slidedp.commands.train.launch_ranks) reports a failed rank itself, in one line with the rank's
own exit code and reason where the rank recorded one (the exit file); torchrun's ChildFailedError traceback
on top of that would bury that line; so would the SignalException traceback torchrun ends with when the launcher
forwards a Ctrl-C or a kill to it. Everything else, including its exit code (1 for a failed rank), is
torchrun's.

    python -m slidedp.commands.rank_launcher <torchrun arguments>
"""

from __future__ import annotations

import sys


def main() -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun()  # reads sys.argv[1:], as `torchrun` does
    except ChildFailedError:
        return 1
    except SignalException as exc:  # Ctrl-C or a kill forwarded by the launcher, which reports it in one line
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
