"""Every public import path of the flat layout still works, and names the same objects.

The events modules moved into ``radixmeta.events`` (one package); the old top-level
modules re-export them. The lists below are what each old path exported before the
move: a name dropped from a re-export, or a re-export that made a copy instead of
naming the package's object, fails here.
"""

from __future__ import annotations

import importlib

import pytest

# old path -> (where the code lives now, the names it exported before the move)
MOVED = {
    "radixmeta.replay": (
        "radixmeta.events.replay",
        ["LogSource", "ReplaySource", "ReplayStats", "Replayer", "WorkerLag", "batch_mark"],
    ),
    "radixmeta.ingest": (
        "radixmeta.events.ingest",
        [
            "DEFAULT_TIERS",
            "BatchConverter",
            "ConversionCounts",
            "engine_batch",
            "extras_tag",
            "namespace_of",
        ],
    ),
    "radixmeta.publishing": ("radixmeta.events.publishing", ["LogPublisher"]),
    "radixmeta.subscription": (
        "radixmeta.events.subscription",
        ["CODECS", "FleetSubscription", "WorkerEndpoint"],
    ),
    "radixmeta.log": ("radixmeta.events.log", ["EventLog"]),
}

# What ``radixmeta.events`` exported when it was one module, and where each name lives.
EVENTS = {
    "Cleared": "radixmeta._records",
    "EventLog": "radixmeta.events.log",
    "LogSource": "radixmeta.events.replay",
    "LogTruncatedError": "radixmeta.errors",
    "Namespace": "radixmeta._records",
    "Record": "radixmeta._records",
    "Removed": "radixmeta._records",
    "ReplaySource": "radixmeta.events.replay",
    "ReplayStats": "radixmeta.events.replay",
    "Replayer": "radixmeta.events.replay",
    "Stored": "radixmeta._records",
    "WorkerLag": "radixmeta.events.replay",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_events_path_names_the_same_objects(old: str) -> None:
    new, names = MOVED[old]
    before, after = importlib.import_module(old), importlib.import_module(new)
    # Every name it had is still there (a later addition is no break).
    assert set(names) <= set(before.__all__)
    assert set(names) <= set(after.__all__)
    for name in names:
        assert getattr(before, name) is getattr(after, name), name


def test_the_events_package_exports_what_the_events_module_did() -> None:
    events = importlib.import_module("radixmeta.events")
    assert set(EVENTS) <= set(events.__all__)
    for name, home in EVENTS.items():
        assert getattr(events, name) is getattr(importlib.import_module(home), name), name


def test_the_top_level_names_are_the_packages_objects() -> None:
    import radixmeta
    from radixmeta.events import EventLog

    assert radixmeta.EventLog is EventLog


def test_the_router_package_exports_what_router_py_did() -> None:
    import radixmeta
    import radixmeta.router
    from radixmeta.router.decision import Decision
    from radixmeta.router.registry import WorkerLoad
    from radixmeta.router.router import Router

    assert sorted(radixmeta.router.__all__) == ["Decision", "Router", "WorkerLoad"]
    assert radixmeta.router.Router is Router is radixmeta.Router
    assert radixmeta.router.Decision is Decision is radixmeta.Decision
    assert radixmeta.router.WorkerLoad is WorkerLoad is radixmeta.WorkerLoad
