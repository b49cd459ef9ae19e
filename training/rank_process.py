"""The entry point of a rank that `training.distributed` starts: `python -m training.rank_process`.

It first has Linux kill it when its launcher dies, before torch loads (seconds, under
load), so that a launcher killed meanwhile takes its ranks with it; then it runs the rank.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have Linux kill this process when `parent` dies; exit now if it is gone already."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before the signal was armed
        raise SystemExit(f"the launcher (pid {parent}) is gone")


if __name__ == "__main__":
    die_with_parent(json.loads(sys.argv[1])["parent"])
    from training import distributed  # torch loads here, once the rank is bound to its launcher

    distributed.main(sys.argv[1:])
