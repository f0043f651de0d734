"""``radixmeta serve``: its options, and running the gateway under uvicorn.

The options are defined without importing the gateway's optional dependencies, so
``radixmeta --help`` stays light; :func:`serve` imports them, and names the extra when one
is missing.
"""

from __future__ import annotations

import argparse
import logging
import os

from radixmeta.gateway.config import GatewayConfig

__all__ = ["add_serve_arguments", "config_from_args", "serve"]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` subcommand's options."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="URL[,events=EP,replay=EP,dp-size=N,codec=C,name=N,capacity=T]",
        help="an engine; repeat for each. With events= (its KV-event PUB endpoint) it is "
        "routed exactly from its events; without, approximately from the gateway's own "
        "dispatches (capacity= tokens bound that model)",
    )
    parser.add_argument(
        "--workers-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a YAML or JSON file of engines (a list, or {workers: [...]}) with the same fields",
    )
    parser.add_argument(
        "--page-size", type=int, default=16, help="the engines' KV block size (vLLM default 16)"
    )
    parser.add_argument("--policy", default="default", help="a built-in routing policy")
    parser.add_argument(
        "--tokenizer",
        metavar="PATH_OR_NAME",
        help="the engines' Hugging Face tokenizer (tokenizer.json, its directory, or a model "
        "in the local HF cache); without it the gateway routes on UTF-8 bytes (approximate)",
    )
    parser.add_argument(
        "--api-key", help="bearer key of the data plane (default: $RADIXMETA_API_KEY)"
    )
    parser.add_argument(
        "--admin-key",
        help="bearer key of /workers (default: $RADIXMETA_ADMIN_KEY, else the API key)",
    )
    parser.add_argument("--load-interval", type=float, default=1.0, metavar="SECONDS",
                        help="scrape each engine's /metrics for load this often (0: never)")
    parser.add_argument("--health-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="wait this long for an engine's first byte, and between bytes")
    parser.add_argument("--connect-timeout", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--failures-to-open", type=int, default=3, metavar="K",
                        help="consecutive failures that take an engine down")
    parser.add_argument("--log-requests", action="store_true",
                        help="one JSON log line per request, at info level")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug"))


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The :class:`GatewayConfig` of parsed ``serve`` options (bad engines raise here)."""
    return GatewayConfig(
        workers=GatewayConfig.workers_from(args.worker, args.workers_file),
        page_size=args.page_size,
        policy=args.policy,
        tokenizer=args.tokenizer,
        api_key=args.api_key or os.environ.get("RADIXMETA_API_KEY") or None,
        admin_key=args.admin_key or os.environ.get("RADIXMETA_ADMIN_KEY") or None,
        load_interval=args.load_interval,
        health_interval=args.health_interval,
        request_timeout=args.request_timeout,
        connect_timeout=args.connect_timeout,
        failures_to_open=args.failures_to_open,
        log_requests=args.log_requests,
    )


def serve(args: argparse.Namespace) -> int:
    """Run the gateway until SIGINT or SIGTERM; returns the exit code."""
    from radixmeta.gateway import require

    config = config_from_args(args)
    require()
    import uvicorn

    from radixmeta.gateway.app import Gateway

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    gateway = Gateway(config)
    logging.getLogger("radixmeta.gateway").info(
        "radixmeta serve on http://%s:%d: %d engines (%d with KV events), tokenizer %s",
        args.host, args.port, len(config.workers), sum(w.exact for w in config.workers),
        gateway.tokenizer.name,
    )
    uvicorn.run(
        gateway.app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        # Clients and load balancers keep connections open between requests; uvicorn's
        # default of 5 s would close them under their feet.
        timeout_keep_alive=65,
    )
    return 0
