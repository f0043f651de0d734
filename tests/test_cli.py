"""``radixmeta listen`` against a live publisher: the console script as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _ports import free_port_block

from radixmeta import EventLog, RadixCache
from radixmeta.errors import InvalidInputError
from radixmeta.publishing import LogPublisher
from radixmeta.subscription import WorkerEndpoint
from radixmeta.transport import ZmqPublisher
from radixmeta.wire import BlockRemoved, BlockStored, EventBatch, vllm

# A child interpreter importing radixmeta (pure Python under RADIXMETA_IMPLEMENTATION=python)
# can take tens of seconds to subscribe on a loaded two-core machine: a bound, not a timing claim.
CHILD_START = 60.0


def _stop(proc: subprocess.Popen[str]) -> None:
    """Kill the listener if it still runs and close its pipes, whatever the test's outcome."""
    if proc.poll() is None:
        proc.kill()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    proc.wait(10)

pytestmark = pytest.mark.timeout(180)  # above CHILD_START plus a listener run


def _stored(hashes: list[int], tokens: list[int], parent: int | None = None) -> BlockStored:
    return BlockStored(
        np.array(hashes, np.uint64), parent, np.array(tokens, np.uint32), 2, medium="GPU"
    )


def test_listen_follows_a_vllm_worker(tmp_path: Path) -> None:
    base = free_port_block(3)
    out = tmp_path / "state.json"
    with ZmqPublisher(
        f"tcp://127.0.0.1:{base}", replay_endpoint=f"tcp://127.0.0.1:{base + 1}", bind=True
    ) as pub:
        batches = [
            EventBatch(1.0, [_stored([0xA, 0xB], [1, 2, 3, 4])], 0),
            EventBatch(2.0, [_stored([0xC], [5, 6], parent=0xB)], 0),
            EventBatch(3.0, [BlockRemoved(np.array([0xC], np.uint64), medium="GPU")], 0),
        ]
        # Published before the listener starts: it joins late and replays them.
        for batch in batches:
            pub.publish(vllm.encode_batch(batch, version="0.33"))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixmeta.cli",
                "listen",
                "--worker",
                f"w0=tcp://127.0.0.1:{base},replay=tcp://127.0.0.1:{base + 1}",
                "--codec",
                "vllm",
                "--block-size",
                "2",
                "--exit-after-idle",
                "2",
                "--json-out",
                str(out),
                "--metrics-port",
                str(base + 2),
                "--no-table",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + CHILD_START
            metrics = ""
            while time.monotonic() < deadline and "radixmeta_worker_applied" not in metrics:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{base + 2}/metrics") as r:
                        metrics = r.read().decode()
                except OSError:
                    time.sleep(0.1)
            pub.wait_subscribers(1, timeout=CHILD_START)
            pub.publish(
                vllm.encode_batch(
                    EventBatch(4.0, [_stored([0xD], [7, 8], parent=0xB)], 0), version="0.33"
                )
            )
            _, err = proc.communicate(timeout=30)
        finally:
            _stop(proc)
    assert proc.returncode == 0, err
    assert 'radixmeta_worker_applied{dp_rank="0",worker="w0"}' in metrics
    state = json.loads(out.read_text())
    (w0,) = state["workers"]
    assert (w0["worker"], w0["applied"], w0["tokens"]) == ("w0", 4, 6)  # [1 2 3 4] and [7 8]
    assert w0["replays"] >= 1  # the three batches before it joined


def test_listen_refuses_a_bad_worker_spec() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixmeta.cli",
            "listen",
            "--worker",
            "nameless",
            "--codec",
            "vllm",
            "--block-size",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert (
        "a worker is NAME=ENDPOINT[,replay=ENDPOINT][,snapshot=yes|no], got 'nameless'"
        in proc.stderr
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("w=tcp://h:1", WorkerEndpoint("w", "tcp://h:1")),
        ("w=tcp://h:1,replay=tcp://h:2", WorkerEndpoint("w", "tcp://h:1", "tcp://h:2")),
        ("w=tcp://h:1,replay=tcp://h:2,snapshot=yes",
         WorkerEndpoint("w", "tcp://h:1", "tcp://h:2", snapshot=True)),
        ("w=tcp://h:1,snapshot=no,replay=tcp://h:2",
         WorkerEndpoint("w", "tcp://h:1", "tcp://h:2", snapshot=False)),
    ],
)
def test_worker_specs(spec: str, expected: WorkerEndpoint) -> None:
    assert WorkerEndpoint.parse(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("w=tcp://h:1,snapshot=maybe", "unknown worker option 'snapshot=maybe'"),
        ("w=tcp://h:1,snapshot", "unknown worker option 'snapshot'"),
        ("w=tcp://h:1,replay=", "unknown worker option 'replay='"),
        ("w=tcp://h:1,snapshot=yes", "snapshots are asked on the replay endpoint"),
    ],
)
def test_bad_worker_specs(spec: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        WorkerEndpoint.parse(spec)


def test_listen_rebuilds_a_native_worker_from_its_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "state.json"
    cache = RadixCache(2, event_log=EventLog(worker="w0"))
    with LogPublisher(
        cache, "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", buffer_steps=2
    ) as lp:
        for k in range(6):  # before the listener starts, and more than the buffer holds
            cache.insert([1, 2, k, k])
            lp.flush()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixmeta.cli",
                "listen",
                "--worker",
                f"w0={lp.publisher.endpoint},replay={lp.publisher.replay_endpoint}",
                "--codec",
                "native",
                "--block-size",
                "2",
                "--exit-after-idle",
                "1",
                "--snapshot-timeout",
                "5",
                "--json-out",
                str(out),
                "--no-table",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert lp.publisher.wait_subscribers(1, timeout=CHILD_START)
            cache.insert([7, 7, 7, 7])
            lp.flush()
            _, err = proc.communicate(timeout=30)
        finally:
            _stop(proc)
    assert proc.returncode == 0, err
    state = json.loads(out.read_text())
    (w0,) = state["workers"]
    assert (w0["tokens"], w0["resyncs"], w0["stale"]) == (cache.total_size, 1, False)
    assert state["snapshot_failures"] == 0 and state["transport"]["snapshots_requested"] == 1


def test_listen_shows_its_table_and_stops_when_idle() -> None:
    base = free_port_block(2)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixmeta.cli",
            "listen",
            "--worker",
            f"quiet=tcp://127.0.0.1:{base},replay=tcp://127.0.0.1:{base + 1}",
            "--codec",
            "sglang",
            "--block-size",
            "16",
            "--exit-after-idle",
            "0.5",
            "--probe-interval",
            "0.2",
            "--replay-timeout",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "COLUMNS": "160"},  # rich sizes the table to the terminal
    )
    assert proc.returncode == 0, proc.stderr
    assert "radixmeta listen: 1 streams, codec sglang" in proc.stdout
    assert "quiet" in proc.stdout and "applied" in proc.stdout


def test_listen_survives_bad_batches_and_always_writes_its_state(tmp_path: Path) -> None:
    """A depth bomb, garbage and a wrong block size: counted, shown, warned once; the
    listener goes on, exits 0 without a traceback and writes --json-out."""
    base = free_port_block(2)
    out = tmp_path / "state.json"
    with ZmqPublisher(f"tcp://127.0.0.1:{base}", bind=True) as pub:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "radixmeta.cli", "listen",
                "--worker", f"w0=tcp://127.0.0.1:{base}",
                "--codec", "vllm", "--block-size", "2", "--restart-window", "4",
                "--exit-after-idle", "1.5", "--json-out", str(out), "--no-table",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert pub.wait_subscribers(1, timeout=CHILD_START)
            pub.publish(vllm.encode_batch(EventBatch(1.0, [_stored([0xA], [1, 2])], 0)))
            pub.publish(b"\x91" * 1000 + b"\xc0")
            pub.publish(b"\xff\xfe not msgpack")
            four = BlockStored(np.array([0xB], np.uint64), None, np.arange(4, dtype=np.uint32),
                               4, medium="GPU")
            for ts in (4.0, 5.0):
                pub.publish(vllm.encode_batch(EventBatch(ts, [four], 0)))
            _, err = proc.communicate(timeout=30)
        finally:
            _stop(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert err.count("stores blocks of 4 tokens, but the router's block size is 2") == 1
    (w0,) = json.loads(out.read_text())["workers"]
    assert w0["intake"]["decode_errors"] == 2 and w0["intake"]["batches"] == 5
    assert (w0["block_size"], w0["skipped"]["wrong_block_size"]) == (4, 2)
    assert w0["last_error"] is not None


def test_listen_checks_its_json_out_before_it_listens(tmp_path: Path, capsys: Any) -> None:
    from radixmeta.cli import main

    started = time.monotonic()
    code = main(["listen", "--worker", "w0=tcp://127.0.0.1:1", "--codec", "vllm",
                 "--block-size", "2", "--json-out", str(tmp_path / "missing" / "state.json")])
    assert code == 2 and "cannot write there" in capsys.readouterr().err
    assert time.monotonic() - started < 5  # refused at once, not after listening
