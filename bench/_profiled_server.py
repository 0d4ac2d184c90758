"""``python bench/_profiled_server.py OUT.prof server ARGS...``: ``joch server`` under cProfile, every
thread profiled (the request handlers run on worker threads, which plain ``cProfile.run`` misses);
the threads' statistics are merged into OUT.prof when the server stops (SIGTERM stops it gracefully).
Used by ``bench/governance_bench.py --profile``."""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
import time
from typing import Any

PROFILES: list[cProfile.Profile] = []


def _start_profile(frame: Any, event: str, arg: Any) -> None:
    """``threading.setprofile`` hook: the first event of a new thread gives it a profiler of its own
    (enabling it replaces this hook for that thread)."""
    profile = cProfile.Profile(time.thread_time)
    PROFILES.append(profile)
    profile.enable()


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["joch", *sys.argv[2:]]
    threading.setprofile(_start_profile)
    from joch.cli.main import main as joch_main

    profile = cProfile.Profile(time.thread_time)
    PROFILES.append(profile)
    profile.enable()
    try:
        joch_main()
    except SystemExit:
        pass
    finally:
        profile.disable()
        stats: Any = None
        for each in PROFILES:
            try:
                stats = pstats.Stats(each) if stats is None else stats.add(each)
            except TypeError:  # a profile that never saw a call
                continue
        if stats is not None:
            stats.dump_stats(out)


if __name__ == "__main__":
    main()
