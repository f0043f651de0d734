"""Real parts for the gateway tests: stand-in engines as processes, the gateway under uvicorn.

:class:`Standin` launches ``python -m radixmeta.gateway.standin`` on free 127.0.0.1 ports
(HTTP, KV-event PUB, replay) and waits for its ``/health``; :class:`StandinPool` shares
them between a module's tests; :class:`ServedGateway` serves a
:class:`~radixmeta.gateway.Gateway` with uvicorn in a thread of this process (so a test
reads its router directly). Both stop within a bound when their ``with`` ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from _ports import free_port_block

from radixmeta.gateway import Gateway, GatewayConfig, WorkerSpec

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0  # 1-3 s here; over 20 s once, at load average 14 on the 2 cores


def wait_for(condition: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            msg = f"condition not met within {timeout} s"
            raise AssertionError(msg)
        time.sleep(interval)


class _ExitedAtStart(AssertionError):
    """A stand-in process ended before it answered /health (most often: a port was taken)."""


class Standin:
    """One stand-in engine process on 127.0.0.1, with KV events unless ``events=False``."""

    def __init__(self, *, events: bool = True, page_size: int = 4, **options: Any) -> None:
        options.setdefault("time_scale", 0.0)
        options.setdefault("token_interval", 0.0)
        self.page_size = page_size
        # Free when probed is not free when bound: the machine is shared, and ZeroMQ's and
        # the clients' ephemeral ports fall in the same range. A stand-in that could not
        # bind exits at once; it is started again on other ports.
        for attempt in range(3):
            self._start(events, page_size, options)
            try:
                wait_for(self._healthy, START_TIMEOUT, 0.05)
                return
            except _ExitedAtStart:
                self.stop()
                if attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise

    def _start(self, events: bool, page_size: int, options: dict[str, Any]) -> None:
        base = free_port_block(3)
        self.port = base
        self.url = f"http://127.0.0.1:{base}"
        self.events = f"tcp://127.0.0.1:{base + 1}" if events else None
        self.replay = f"tcp://127.0.0.1:{base + 2}" if events else None
        args = [sys.executable, "-m", "radixmeta.gateway.standin", "--port", str(base)]
        args += ["--page-size", str(page_size)]
        if self.events and self.replay:
            args += ["--events", self.events, "--replay", self.replay]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
        self.process = subprocess.Popen(args, env=env, cwd=ROOT)

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            msg = f"stand-in engine exited with {self.process.returncode}"
            raise _ExitedAtStart(msg)
        try:
            return httpx.get(self.url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def spec(self, *, exact: bool = True, **fields: Any) -> WorkerSpec:
        """Its WorkerSpec for the gateway: with its events, unless ``exact=False`` (then
        the gateway is not told of them and routes it approximately, as one without)."""
        if not exact:
            return WorkerSpec(self.url, **fields)
        return WorkerSpec(self.url, events=self.events, replay=self.replay, **fields)

    def reset(self) -> None:
        """As freshly started: an empty cache (its clearing published), no faults."""
        self.control(reset=True)

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/standin/stats", timeout=5.0).json()  # type: ignore[no-any-return]

    def control(self, **settings: Any) -> None:
        httpx.post(self.url + "/standin/control", json=settings, timeout=5.0).raise_for_status()

    def kill(self) -> None:
        """SIGKILL: the engine dies at once, mid-anything."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self) -> Standin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StandinPool:
    """Stand-in engines shared by one module's tests (a process start costs 1-2 s here).

    :meth:`take` hands out an idle one (reset as new) or starts one; :meth:`give_back`
    returns it, or drops it when the test killed it. Every process stops at :meth:`close`.
    """

    def __init__(self) -> None:
        self._idle: list[Standin] = []
        self._all: list[Standin] = []

    def take(self) -> Standin:
        while self._idle:
            standin = self._idle.pop()
            if standin.process.poll() is None:
                standin.reset()
                return standin
        standin = Standin()
        self._all.append(standin)
        return standin

    def give_back(self, standin: Standin) -> None:
        if standin.process.poll() is None:
            self._idle.append(standin)

    def close(self) -> None:
        for standin in self._all:
            standin.stop()

    def __enter__(self) -> StandinPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServedGateway:
    """A Gateway served by uvicorn on a free 127.0.0.1 port, in a thread of this process."""

    def __init__(self, config: GatewayConfig, **gateway_options: Any) -> None:
        self.gateway = Gateway(config, **gateway_options)
        self.router = self.gateway.fleet.router
        # Bound here and handed to uvicorn: no other process can take the port meanwhile.
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.gateway.app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=3,
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="gateway-under-test"
        )
        self.thread.start()
        try:
            wait_for(lambda: self.server.started or not self.thread.is_alive(), START_TIMEOUT)
            if not self.server.started:
                msg = "the gateway did not start"
                raise AssertionError(msg)
        except BaseException:
            self.stop()
            raise

    def engine(self, standin: Standin) -> Any:
        return self.gateway.fleet.find(standin.url)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.socket.close()
        assert not self.thread.is_alive(), "the gateway's server thread did not stop"

    def __enter__(self) -> ServedGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config(*specs: WorkerSpec, **options: Any) -> GatewayConfig:
    """A GatewayConfig for tests: page 4, quick health checks and breaker."""
    options.setdefault("page_size", 4)
    options.setdefault("health_interval", 0.2)
    options.setdefault("load_interval", 0.2)
    options.setdefault("open_seconds", 0.2)
    options.setdefault("max_open_seconds", 1.0)
    options.setdefault("request_timeout", 10.0)
    return GatewayConfig(list(specs), **options)
