"""The chaos bench for 60 s (bench/chaos.py): 8 publisher processes killed with SIGKILL and
restarted, garbled, paused, live batches dropped on the way, two slow replay sockets and one
dead one, while 4 threads dispatch and finish.

At the end the event thread is alive, every native worker's view equals its cache (rebuilt
from a snapshot when needed), a vLLM-format worker's view equals its cache or is flagged
stale, no holds or load are left, and live memory (glibc's heap in use plus Python's live
blocks) grew by at most 5 % after the warm-up; RSS, which also counts what the allocators
keep after a burst, is reported (see bench/chaos.py).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.processes,
    # The chaos run tests the event path (threads, sockets, processes), not the tree
    # implementation: the reference stage of .ci/run would spend another 60 s on the same
    # transport code, on trees the state-machine tests already compare with the native ones.
    pytest.mark.skipif(
        os.environ.get("RADIXMETA_IMPLEMENTATION", "").strip().lower() == "python",
        reason="the chaos run tests the event path, not the tree implementation "
        "(RADIXMETA_IMPLEMENTATION=python)",
    ),
]

BENCH = Path(__file__).parent.parent / "bench"


def test_sixty_seconds_of_chaos_leave_the_router_following_its_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Imported by name, so that the spawned children (which get this sys.path) find it too.
    monkeypatch.syspath_prepend(str(BENCH))
    chaos = importlib.import_module("chaos")
    result = chaos.run(seconds=60.0, kill_every=5.0, workers=8, seed=18)
    assert result["thread"]["alive"] and result["thread"]["state"] != "dead"
    # A kill every 5 s after the last restart, over the 50 s after the warm-up; a restart
    # (a spawned interpreter importing radixmeta) takes 1-3 s on a loaded 2-core machine,
    # where the reference stage saw 6 kills in a run.
    assert result["kills"] >= 5
    # The chaos happened: batches were lost on every link, and requests went through
    # both slow replay links.
    assert all(row["dropped"] > 0 for row in result["rows"]), result["rows"]
    slow = [row for row in result["rows"] if row["slow_replay"]]
    assert len(slow) == 2 and all(row["slowed"] > 0 for row in slow), slow
    for row in result["rows"]:
        assert row["equal"] or (row["codec"] == "vllm" and row["stale"]), row
        if row["codec"] == "native":
            assert row["equal"], row
    assert (result["in_flight"], result["holds"], result["load"]) == (0, 0, 0)
    # What a leak would grow: live memory, glibc's heap in use plus Python's blocks (RSS
    # also counts what the allocators keep after a backlog drained: see bench/chaos.py).
    start, end = result["live_kib"]
    if start is None:  # no glibc figures: RSS after a trim, at the baseline and the end
        start, end = result["held_kib"]
    assert end <= start * 1.05, (result["live_kib"], result["held_kib"], result["memory"])
    assert result["ok"]
