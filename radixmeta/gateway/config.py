"""The gateway's settings and its engines, as ``radixmeta serve`` and its file give them.

An engine is ``URL[,name=NAME,events=ENDPOINT,replay=ENDPOINT,dp-size=N,codec=C,capacity=T]``
on the command line (``--worker``, repeated), or one entry of a YAML or JSON file with the
same fields. An engine with ``events`` is routed exactly, from its KV events; one without is
routed approximately, from the gateway's own dispatches (bounded by ``capacity`` tokens).

This module needs no optional dependency (PyYAML only to read a ``.yaml`` file), so the
console script reports a bad engine before it imports the server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from radixmeta.errors import InvalidInputError

__all__ = ["CODECS", "DEFAULT_CAPACITY", "GatewayConfig", "WorkerSpec", "load_workers"]

CODECS = ("vllm", "sglang", "native")
# Tokens the gateway models an event-less engine as caching: a vLLM engine on one
# 80 GB GPU with an 8B model holds about this many (radixmeta.policies.costs).
DEFAULT_CAPACITY = 400_000
_SPEC = "URL[,name=NAME,events=ENDPOINT,replay=ENDPOINT,dp-size=N,codec=vllm|sglang|native]"
_KEYS = {"name", "events", "replay", "dp-size", "dp_size", "codec", "capacity", "url"}


def _positive(name: str, value: object, where: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if number < 1 or isinstance(value, bool):
        msg = f"{where}: {name} must be a positive integer, got {value!r}"
        raise InvalidInputError(msg)
    return number


@dataclass(frozen=True)
class WorkerSpec:
    """One engine behind the gateway.

    Attributes
    ----------
    url : str
        The engine's HTTP base URL (``http://host:port``), without a trailing slash.
    name : str
        Its worker name in the router (default: the URL); event records name the worker
        by it, and ``x-radixmeta-worker`` shows it.
    events : str or None
        Its KV-event PUB endpoint (rank 0's), e.g. ``tcp://10.0.0.1:5557``: routed exactly.
    replay : str or None
        Its replay ROUTER endpoint (rank 0's), for gaps.
    dp_size : int
        Data-parallel ranks behind the URL (event ports are base + rank).
    codec : {"vllm", "sglang", "native"}
        How its events are encoded.
    capacity : int or None
        Tokens it caches; the bound of the router's model of an event-less engine
        (default :data:`DEFAULT_CAPACITY`).
    """

    url: str
    name: str = ""
    events: str | None = None
    replay: str | None = None
    dp_size: int = 1
    codec: str = "vllm"
    capacity: int | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            msg = f"an engine URL is http(s)://host:port, got {self.url!r}"
            raise InvalidInputError(msg)
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if not self.name:
            object.__setattr__(self, "name", self.url)
        if self.codec not in CODECS:
            msg = f"engine {self.url}: codec must be one of {', '.join(CODECS)}, got {self.codec!r}"
            raise InvalidInputError(msg)
        _positive("dp-size", self.dp_size, f"engine {self.url}")
        if self.capacity is not None:
            _positive("capacity", self.capacity, f"engine {self.url}")
        if self.replay is not None and self.events is None:
            msg = f"engine {self.url}: a replay endpoint needs an events endpoint"
            raise InvalidInputError(msg)

    @property
    def exact(self) -> bool:
        """Whether the engine is routed from its KV events."""
        return self.events is not None

    @classmethod
    def parse(cls, spec: str) -> WorkerSpec:
        """Parse one ``--worker`` value."""
        url, *options = [part.strip() for part in spec.split(",")]
        fields: dict[str, str] = {"url": url}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or not value or key not in _KEYS - {"url"}:
                msg = f"unknown engine option {option!r} in {spec!r}; an engine is {_SPEC}"
                raise InvalidInputError(msg)
            fields[key] = value
        return cls.from_mapping(fields, where=f"--worker {spec!r}")

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any], *, where: str = "engine") -> WorkerSpec:
        """One engine from a mapping of the same fields (a file entry, a ``POST /workers``)."""
        if not isinstance(entry, Mapping):
            msg = f"{where}: an engine is a mapping with a 'url', got {type(entry).__name__}"
            raise InvalidInputError(msg)
        unknown = set(entry) - _KEYS
        if unknown or "url" not in entry:
            msg = f"{where}: an engine needs 'url' and only {sorted(_KEYS)}, got {sorted(entry)}"
            raise InvalidInputError(msg)
        if not isinstance(entry["url"], str):
            msg = f"{where}: url must be a string, got {entry['url']!r}"
            raise InvalidInputError(msg)
        dp = entry.get("dp-size", entry.get("dp_size", 1))
        capacity = entry.get("capacity")
        for key in ("name", "events", "replay", "codec"):
            value = entry.get(key)
            if value is not None and not isinstance(value, str):
                msg = f"{where}: {key} must be a string, got {value!r}"
                raise InvalidInputError(msg)
        return cls(
            url=entry["url"],
            name=entry.get("name") or "",
            events=entry.get("events"),
            replay=entry.get("replay"),
            dp_size=_positive("dp-size", dp, where),
            codec=entry.get("codec") or "vllm",
            capacity=None if capacity is None else _positive("capacity", capacity, where),
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields as ``GET /workers`` shows them."""
        return {
            "url": self.url,
            "name": self.name,
            "events": self.events,
            "replay": self.replay,
            "dp_size": self.dp_size,
            "codec": self.codec,
            "capacity": self.capacity,
            "mode": "exact" if self.exact else "approximate",
        }


def load_workers(path: str | Path) -> list[WorkerSpec]:
    """The engines of a YAML (``.yaml``/``.yml``) or JSON file.

    The file is a list of engines, or a mapping with a ``workers`` list; each engine a
    mapping of :class:`WorkerSpec`'s fields (``dp-size`` or ``dp_size``).
    """
    path = Path(path)
    text = path.read_text()
    data: Any
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - pyyaml is in the gateway extra
            msg = "reading a YAML engine file needs PyYAML: pip install 'radixmeta[gateway]'"
            raise ImportError(msg) from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            msg = f"{path}: not valid YAML ({exc})"
            raise InvalidInputError(msg) from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = f"{path}: not valid JSON ({exc})"
            raise InvalidInputError(msg) from exc
    if isinstance(data, Mapping):
        data = data.get("workers")
    if not isinstance(data, list):
        msg = f"{path}: expected a list of engines, or a mapping with a 'workers' list"
        raise InvalidInputError(msg)
    return [WorkerSpec.from_mapping(e, where=f"{path} entry {i}") for i, e in enumerate(data)]


@dataclass
class GatewayConfig:
    """Everything ``radixmeta serve`` is told; the app reads it once, at start.

    Attributes
    ----------
    workers : list of WorkerSpec
        The engines at start (more can be added through ``POST /workers``).
    page_size : int
        The engines' KV block size (vLLM ``--block-size``, SGLang ``--page-size``).
    policy : str
        A built-in policy name (``radixmeta.policies.create``).
    tokenizer : str or None
        A ``tokenizer.json`` path, a directory holding one, or a model name in the
        local Hugging Face cache; ``None`` routes on UTF-8 bytes (approximate).
    api_key, admin_key : str or None
        Bearer keys of the data plane and of ``/workers``.
    load_interval : float
        Seconds between scrapes of the engines' ``/metrics`` (0: never).
    health_interval : float
        Seconds between health checks of each engine (0: never).
    request_timeout : float
        Seconds an upstream request may wait for its first byte, and between bytes.
    connect_timeout : float
        Seconds to open a connection to an engine.
    failures_to_open : int
        Consecutive failures that take an engine down (the circuit breaker's K).
    open_seconds, max_open_seconds : float
        The first half-open retry comes after ``open_seconds``; each failed retry doubles
        the wait, up to ``max_open_seconds``.
    expire_after : float
        Requests in flight longer than this are released (a lost finish).
    log_requests : bool
        One structured log line per request, at info level.
    """

    workers: list[WorkerSpec] = field(default_factory=list)
    page_size: int = 16
    policy: str = "default"
    tokenizer: str | None = None
    api_key: str | None = None
    admin_key: str | None = None
    load_interval: float = 1.0
    health_interval: float = 2.0
    request_timeout: float = 600.0
    connect_timeout: float = 2.0
    failures_to_open: int = 3
    open_seconds: float = 1.0
    max_open_seconds: float = 30.0
    expire_after: float = 3600.0
    log_requests: bool = False

    def __post_init__(self) -> None:
        _positive("page_size", self.page_size, "gateway")
        _positive("failures_to_open", self.failures_to_open, "gateway")
        for name in ("load_interval", "health_interval"):
            if getattr(self, name) < 0:
                msg = f"gateway: {name} must be >= 0 seconds, got {getattr(self, name)}"
                raise InvalidInputError(msg)
        for name in ("request_timeout", "connect_timeout", "open_seconds", "expire_after"):
            if not getattr(self, name) > 0:
                msg = f"gateway: {name} must be > 0 seconds, got {getattr(self, name)}"
                raise InvalidInputError(msg)
        if self.max_open_seconds < self.open_seconds:
            msg = "gateway: max_open_seconds must be >= open_seconds"
            raise InvalidInputError(msg)
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            msg = f"gateway: two engines share a name: {sorted(names)}"
            raise InvalidInputError(msg)

    @staticmethod
    def workers_from(specs: Sequence[str], files: Sequence[str]) -> list[WorkerSpec]:
        """The engines of ``--worker`` values and ``--workers-file`` files, in order."""
        out = [WorkerSpec.parse(s) for s in specs]
        for path in files:
            out.extend(load_workers(path))
        return out
