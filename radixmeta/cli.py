"""The ``radixmeta`` console script (also ``python -m radixmeta``).

- ``radixmeta simulate`` runs the simulator (:mod:`radixmeta.sim`): with no
  arguments, the built-in generated shared-prefix workload on 4 workers under
  every policy, and a comparison table.
- ``radixmeta reproduce a4`` reproduces the SGLang paper's appendix A.4 on MMLU;
  ``radixmeta reproduce traces`` checks ``default`` against every policy on traces.
- ``radixmeta listen`` subscribes to a live fleet's KV-event streams (vLLM,
  SGLang, or radixmeta's own), replays them into a MetaTree and shows a live
  table per worker; ``--json-out`` writes the final state, ``--metrics-port``
  serves it to Prometheus.
- ``radixmeta serve`` runs the OpenAI-compatible gateway (:mod:`radixmeta.gateway`, the
  ``gateway`` extra) in front of vLLM or SGLang engines.
- ``radixmeta demo`` is a short demonstration of RadixCache and MetaTree with
  timings (:mod:`radixmeta.demo`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from rich.live import Live
from rich.table import Table

from radixmeta.errors import InvalidInputError, RadixMetaError
from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint

__all__ = ["main"]

_COLUMNS = (
    ("worker", "worker"),
    ("rank", "dp_rank"),
    ("blocks", "blocks"),
    ("applied", "applied"),
    ("gaps", "gaps"),
    ("replays", "replays"),
    ("resyncs", "resyncs"),
    ("malformed", "malformed"),
    ("lag", "lag_records"),
    ("lag s", "lag_seconds"),
    ("stale", "stale"),
    ("engine bs", "block_size"),  # the engine's block size, when it is not --block-size
)

_log = logging.getLogger("radixmeta.listen")


def _parser() -> argparse.ArgumentParser:
    from radixmeta.sim.commands import add_simulate_arguments, add_traces_arguments

    parser = argparse.ArgumentParser(
        prog="radixmeta",
        description="Prefix trees for LLM serving: simulate routing policies, watch a fleet.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simulate = sub.add_parser(
        "simulate",
        help="simulate a data-parallel fleet behind the router and compare policies",
        description=(
            "Simulate workers (real RadixCaches and EventLogs) behind a real Router on a "
            "workload and print a comparison table. With no arguments: the gsp workload "
            "(generated shared-prefix groups), 4 workers, every policy."
        ),
    )
    add_simulate_arguments(simulate)
    reproduce = sub.add_parser(
        "reproduce",
        help="reproduce a result (a4: SGLang's data-parallel MMLU experiment; traces: "
        "default against every rival on traces)",
    )
    experiments = reproduce.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    a4 = experiments.add_parser(
        "a4",
        help="the SGLang paper's appendix A.4 on MMLU",
        description=(
            "Reproduce the SGLang paper's appendix A.4: MMLU's questions as one batch on 4 "
            "workers; prints each claim beside what the simulator measures."
        ),
    )
    add_simulate_arguments(a4, reproduce=True)
    add_traces_arguments(
        experiments.add_parser(
            "traces",
            help="default against every built-in policy on traces, cell by cell",
            description=(
                "Run the dispatch-quality grid on traces (Mooncake format), synthetic traces "
                "and optionally gsp/mmlu/sharegpt: own times, arrivals spread 1 ms apart and "
                "offered loads; 4, 8, 16 workers; half, one and four times the cost model's "
                "pool; idle and none consistency. Prints default against each rival per cell "
                "and the met/not-met table of the targets (docs/simulator.md)."
            ),
        )
    )
    sub.add_parser(
        "demo",
        help="a short demonstration of RadixCache and MetaTree with timings",
        add_help=False,
    ).add_argument("demo_args", nargs=argparse.REMAINDER)
    listen = sub.add_parser(
        "listen",
        help="watch a fleet's KV-event streams through a MetaTree",
        description=(
            "Subscribe to each worker's KV-event stream (ZeroMQ), replay it into a MetaTree, "
            "and show per worker the blocks held, records applied, gaps, replays, resyncs and "
            "lag. Stops on Ctrl-C or after --exit-after-idle seconds without a message."
        ),
    )
    listen.add_argument(
        "--worker",
        action="append",
        required=True,
        metavar="NAME=ENDPOINT[,replay=ENDPOINT][,snapshot=yes|no]",
        help="a worker's PUB endpoint (rank 0's with --dp-size) and optional replay endpoint; "
        "repeat for every worker. With --codec native a worker with a replay endpoint is asked "
        "for a snapshot when a gap is older than its buffer; snapshot=no never asks it (a "
        "radixmeta publisher older than snapshots), snapshot=yes insists",
    )
    listen.add_argument("--codec", choices=("vllm", "sglang", "native"), required=True)
    listen.add_argument("--block-size", type=int, required=True, help="the engines' block size")
    listen.add_argument(
        "--dp-size", type=int, default=1, help="data-parallel ranks per worker (ports base+rank)"
    )
    listen.add_argument("--topic", default="", help="topic prefix to subscribe to")
    listen.add_argument(
        "--json-out",
        metavar="FILE",
        help="write the final state here on exit, whatever ended it (checked writable at start; "
        "the schema is on the Events page of the docs)",
    )
    listen.add_argument(
        "--exit-after-idle", type=float, metavar="SECONDS", help="stop after this long idle"
    )
    listen.add_argument(
        "--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on 127.0.0.1:N"
    )
    listen.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for --metrics-port (default loopback)"
    )
    listen.add_argument("--replay-timeout", type=float, default=1.0, metavar="SECONDS")
    listen.add_argument(
        "--snapshot-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a snapshot request may take (default: --replay-timeout); past it the "
        "worker is cleared and marked stale",
    )
    listen.add_argument(
        "--probe-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="when the fleet is quiet, ask the replay sockets this often for batches lost at "
        "the tail of a burst (0: never)",
    )
    listen.add_argument(
        "--restart-window",
        type=int,
        default=16,
        metavar="N",
        help="a seq lower than the last applied by more than N is a restarted worker (after "
        "the publisher reconnects, any seq at or below it is)",
    )
    listen.add_argument(
        "--max-pending",
        type=int,
        default=65_536,
        metavar="N",
        help="records one worker may have waiting; past it the worker is repaired or resynced",
    )
    listen.add_argument("--no-table", action="store_true", help="print no live table")
    from radixmeta.gateway.serve import add_serve_arguments

    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible gateway that routes a fleet by its caches",
        description=(
            "Serve /v1/completions and /v1/chat/completions in front of vLLM or SGLang "
            "engines, routing each request with the Router: exactly from the engines' KV "
            "events where they publish them, approximately from its own dispatches elsewhere. "
            "Needs the 'gateway' extra."
        ),
    )
    add_serve_arguments(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console script; returns its exit code (2 for a usage or input error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # the demonstration parses its own options
        from radixmeta import demo

        return demo.main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command in ("simulate", "reproduce"):
            from radixmeta.sim import commands

            if args.command == "simulate":
                return commands.simulate(args)
            if args.experiment == "traces":
                return commands.reproduce_traces(args)
            return commands.reproduce_a4(args)
        if args.command == "serve":
            from radixmeta.gateway.serve import serve

            return serve(args)
        return _listen(args)
    except ImportError as exc:
        if args.command != "serve":
            raise
        print(f"radixmeta serve: {exc}", file=sys.stderr)
        return 2
    except RadixMetaError as exc:
        print(f"radixmeta {args.command}: {exc}", file=sys.stderr)
        return 2


def _rows(state: list[dict[str, Any]], block_size: int) -> Iterator[list[str]]:
    for w in state:
        w = {**w, "blocks": w["tokens"] // block_size}
        yield [_cell(key, w[key]) for _, key in _COLUMNS]


def _cell(key: str, value: Any) -> str:
    if key == "stale":
        return "yes" if value else ""
    if key == "block_size":
        return "" if value is None else f"{value}!"
    return str(value)


def _table(state: list[dict[str, Any]], block_size: int, title: str) -> Table:
    table = Table(title=title)
    for header, _ in _COLUMNS:
        table.add_column(header, justify="left" if header == "worker" else "right")
    for row in _rows(state, block_size):
        table.add_row(*row)
    return table


def _serve_metrics(subscription: FleetSubscription, host: str, port: int) -> Any:
    """Serve the per-worker figures as Prometheus gauges, read fresh at every scrape."""

    class _Collector:
        def collect(self) -> Iterator[Any]:
            state = subscription.worker_state()
            for key in (
                "tokens",
                "applied",
                "gaps",
                "replays",
                "resyncs",
                "malformed",
                "lag_records",
                "lag_seconds",
            ):
                family = GaugeMetricFamily(
                    f"radixmeta_worker_{key}",
                    f"radixmeta listen: {key} per worker",
                    labels=["worker", "dp_rank"],
                )
                for w in state:
                    family.add_metric([w["worker"], str(w["dp_rank"])], float(w[key]))
                yield family

    collector = _Collector()
    REGISTRY.register(collector)
    server, thread = start_http_server(port, addr=host)
    return collector, server, thread


def _listen(args: argparse.Namespace) -> int:
    workers = [WorkerEndpoint.parse(spec, args.dp_size) for spec in args.worker]
    if args.json_out:
        _check_writable(args.json_out)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    metrics = None
    try:
        with FleetSubscription(
            workers,
            codec=args.codec,
            block_size=args.block_size,
            topic=args.topic.encode(),
            replay_timeout=args.replay_timeout,
            snapshot_timeout=args.snapshot_timeout,
            restart_window=args.restart_window,
            max_pending=args.max_pending,
        ) as subscription:
            try:
                if args.metrics_port is not None:
                    metrics = _serve_metrics(subscription, args.metrics_host, args.metrics_port)
                _loop(subscription, args, stop)
            finally:  # whatever ended the loop, the state is written
                if args.json_out:
                    _write_state(subscription, args)
    finally:
        signal.signal(signal.SIGINT, previous)
        if metrics is not None:
            REGISTRY.unregister(metrics[0])
            metrics[1].shutdown()
    return 0


def _check_writable(path: str) -> None:
    """Refuse a --json-out that could not be written, before listening for an hour."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        msg = f"--json-out {path}: cannot write there (a missing or read-only directory?)"
        raise InvalidInputError(msg)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        msg = f"--json-out {path}: the file is not writable"
        raise InvalidInputError(msg)


def _write_state(subscription: FleetSubscription, args: argparse.Namespace) -> None:
    state = {
        "codec": args.codec,
        "block_size": args.block_size,
        "decode_errors": subscription.decode_errors,
        "snapshot_failures": subscription.snapshot_failures,
        "workers": subscription.worker_state(),
        "transport": dataclasses.asdict(subscription.subscriber.stats),
    }
    with open(args.json_out, "w") as f:
        json.dump(state, f, indent=2, default=str)


def _loop(subscription: FleetSubscription, args: argparse.Namespace, stop: threading.Event) -> None:
    title = f"radixmeta listen: {len(subscription.sources)} streams, codec {args.codec}"
    last_message = last_probe = time.monotonic()
    live = None
    if not args.no_table:
        live = Live(
            _table(subscription.worker_state(), args.block_size, title), refresh_per_second=4
        )
        live.start()
    try:
        while not stop.is_set():
            now = time.monotonic()
            try:
                # Bounded steps: a poll takes at most 4,096 batches, probes and repairs run
                # in the background, and a replay turn lasts 50 ms at most.
                if subscription.poll(timeout=0.1, max_messages=4096):
                    last_message = now
                elif args.probe_interval > 0 and now - last_probe >= args.probe_interval:
                    subscription.probe()  # a quiet fleet: look for losses at the tail
                    last_probe = now
                subscription.replayer.replay(max_seconds=0.05)
                if live is not None:
                    live.update(_table(subscription.worker_state(), args.block_size, title))
            except Exception:  # a bug must not end the listener: logged, and it goes on
                _log.exception("a turn of radixmeta listen failed")
                time.sleep(0.1)
            idle = time.monotonic() - last_message
            if args.exit_after_idle is not None and idle >= args.exit_after_idle:
                break
        # What is still pending, and what the repairs in flight bring, within a bound.
        deadline = time.monotonic() + 3 * args.replay_timeout + 1.0
        while subscription.replayer.asking and time.monotonic() < deadline:
            subscription.replayer.replay(max_seconds=0.05)
            time.sleep(0.01)
        subscription.replayer.replay(max_seconds=0.5)
    finally:
        if live is not None:
            live.update(_table(subscription.worker_state(), args.block_size, title))
            live.stop()


if __name__ == "__main__":
    raise SystemExit(main())
