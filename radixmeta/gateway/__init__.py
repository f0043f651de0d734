"""``radixmeta serve``: an OpenAI-compatible gateway that routes a fleet with the Router.

An ASGI app (Starlette, served by uvicorn) in front of vLLM or SGLang engines: each
request is tokenized, dispatched by :class:`~radixmeta.Router` on the engines' real
caches (from their KV events) or on the gateway's own model of them, and relayed to the
engine chosen. See the Gateway page of the documentation.

The app needs the ``gateway`` extra (``pip install 'radixmeta[gateway]'``); its settings
(:class:`GatewayConfig`, :class:`WorkerSpec`) do not, so ``Gateway`` and ``create_app``
are imported on first use, with a message naming the extra when it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixmeta.gateway.config import GatewayConfig, WorkerSpec, load_workers

if TYPE_CHECKING:
    from radixmeta.gateway.app import Gateway, create_app

__all__ = ["Gateway", "GatewayConfig", "WorkerSpec", "create_app", "load_workers", "require"]

_EXTRA = ("aiohttp", "starlette", "uvicorn", "anyio")


def require() -> None:
    """Raise ImportError naming the ``gateway`` extra when one of its packages is missing."""
    import importlib.util

    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        msg = (
            f"the radixmeta gateway needs the 'gateway' extra ({', '.join(missing)} missing): "
            "pip install 'radixmeta[gateway]'"
        )
        raise ImportError(msg)


def __getattr__(name: str) -> Any:
    if name in ("Gateway", "create_app"):
        require()
        from radixmeta.gateway import app

        return getattr(app, name)
    msg = f"module 'radixmeta.gateway' has no attribute {name!r}"
    raise AttributeError(msg)
