"""Real parts for the gateway tests: stand-in engines as processes, the gateway under uvicorn.

:class:`Standin` launches ``python -m radixmeta.gateway.standin`` on free 127.0.0.1 ports
(HTTP, KV-event PUB, replay) and waits for its ``/health``; :class:`ServedGateway` serves a
:class:`~radixmeta.gateway.Gateway` with uvicorn in a thread of this process (so a test
reads its router directly). Both stop within a bound when their ``with`` ends.
"""

from __future__ import annotations

import os
import signal
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
START_TIMEOUT = 20.0  # a loaded 2-core machine starts a Python server in 1-3 s


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


class Standin:
    """One stand-in engine process on 127.0.0.1, with KV events unless ``events=False``."""

    def __init__(self, *, events: bool = True, page_size: int = 4, **options: Any) -> None:
        base = free_port_block(3)
        self.port = base
        self.url = f"http://127.0.0.1:{base}"
        self.events = f"tcp://127.0.0.1:{base + 1}" if events else None
        self.replay = f"tcp://127.0.0.1:{base + 2}" if events else None
        self.page_size = page_size
        args = [sys.executable, "-m", "radixmeta.gateway.standin", "--port", str(base)]
        args += ["--page-size", str(page_size)]
        if events:
            args += ["--events", self.events, "--replay", self.replay]
        options.setdefault("time_scale", 0.0)
        options.setdefault("token_interval", 0.0)
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
        self.process = subprocess.Popen(args, env=env, cwd=ROOT)
        try:
            wait_for(self._healthy, START_TIMEOUT, 0.05)
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            msg = f"stand-in engine exited with {self.process.returncode}"
            raise AssertionError(msg)
        try:
            return httpx.get(self.url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def spec(self, **fields: Any) -> WorkerSpec:
        """Its WorkerSpec for the gateway (with its events, when it has them)."""
        return WorkerSpec(self.url, events=self.events, replay=self.replay, **fields)

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


class ServedGateway:
    """A Gateway served by uvicorn on a free 127.0.0.1 port, in a thread of this process."""

    def __init__(self, config: GatewayConfig, **gateway_options: Any) -> None:
        self.gateway = Gateway(config, **gateway_options)
        self.router = self.gateway.fleet.router
        self.port = free_port_block(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.gateway.app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=3,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="gateway-under-test")
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
