"""radixmeta as Ray Serve's request router: :class:`RadixMetaRequestRouter`.

Name it in a deployment's ``request_router_config`` (Ray Serve >= 2.47)::

    from ray.serve.config import RequestRouterConfig

    RequestRouterConfig(
        request_router_class="radixmeta.integrations.ray.router:RadixMetaRequestRouter",
        request_router_kwargs={"mode": "approximate", "page_size": 16},
    )

:class:`StandinReplica` is a replica with a real RadixCache and no model, to try
routers on a laptop. See ``docs/ray.md``. This package needs the ``ray`` extra
(``pip install 'radixmeta[ray]'``); ``import radixmeta`` never imports Ray.
"""

from __future__ import annotations

try:
    import ray.serve.request_router  # noqa: F401  (Ray Serve >= 2.47)
except ImportError as exc:  # pragma: no cover - exercised in a process without Ray
    msg = (
        "radixmeta.integrations.ray needs Ray Serve >= 2.47 (the 'ray' extra): "
        "pip install 'radixmeta[ray]'"
    )
    raise ImportError(msg) from exc

from radixmeta.integrations.ray.prompts import body_of, prompt_of_request
from radixmeta.integrations.ray.router import (
    CAPACITY_STAT,
    EVENTS_STAT,
    QUEUE_STAT,
    RadixMetaRequestRouter,
)
from radixmeta.integrations.ray.standin import StandinReplica

__all__ = [
    "CAPACITY_STAT",
    "EVENTS_STAT",
    "QUEUE_STAT",
    "RadixMetaRequestRouter",
    "StandinReplica",
    "body_of",
    "prompt_of_request",
]
