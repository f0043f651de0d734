"""PNG plots of a sweep, one file per thing drawn, each named by what it shows.

Needs matplotlib (``pip install 'radixmeta[plots]'``); without it
:func:`write_plots` writes nothing and returns an empty list. The files, where
``{cell}`` is the run's cell as :func:`cell_slug` writes it (``8w_1m_idle``,
``4w_inf_none_load0.8``):

``ttft_cdf_{cell}.png``
    per cell, the TTFT distribution of every policy that ran in it;
``hit_rate_by_capacity_{workers}w_{consistency}[_load{L}].png``
    per fleet with two or more capacities, each policy's hit rate against the
    capacity per worker, unbounded (``inf``) drawn as the last point (hollow,
    joined by a dotted segment), and H*;
``throughput_by_workers_{capacity}_{consistency}[_load{L}].png``
    per capacity with two or more worker counts, each policy's requests per
    second against the fleet size (the one-worker run is every policy's base);
``load_per_worker_{policy}_{cell}.png``
    per run whose whole record was kept (the one ``--trace-out`` writes), each
    worker's waiting and running requests over simulated time.

A ``tag`` (``reproduce a4`` uses one per part of its experiment) goes first in
every name and title, so two calls on different workloads never overwrite each
other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from radixmeta.sim.report import cell_key, cell_label, format_capacity
from radixmeta.sim.results import RunRecord

__all__ = ["cell_slug", "figures", "write_plots"]


def cell_slug(summary: Mapping[str, Any]) -> str:
    """The run's cell for a file name: ``8w_1m_idle``, with ``_load0.8`` where set."""
    workers, capacity, consistency, load = cell_key(summary)
    return _with_load(f"{workers}w_{format_capacity(capacity)}_{consistency}", load)


def _with_load(slug: str, load: Any) -> str:
    return slug if load is None else f"{slug}_load{load:g}"


def _where_load(load: Any) -> str:
    return "" if load is None else f", load {load:g}"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # an extra: imported only when plotting

    return Figure(figsize=(width, height))


def _legend(ax: Any) -> None:
    # Outside the axes, one entry a line: nine policies never cover a curve.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def _ttft_cdf(members: Sequence[RunRecord], lead: str) -> Any:
    drawn = [r for r in members if r.ttft.size]
    if not drawn:
        return None
    fig = _figure(7, 4)
    ax = fig.subplots()
    for r in drawn:
        fraction = np.arange(1, r.ttft.size + 1) / r.ttft.size
        ax.step(r.ttft, fraction, where="post", label=r.summary["policy"])
    low = min(float(r.ttft[0]) for r in drawn)
    high = max(float(r.ttft[-1]) for r in drawn)
    if low > 0 and high / low > 100:
        ax.set_xscale("log")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_title(f"{lead}TTFT CDF, {cell_label(members[0].summary)}")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def _hit_rate_by_capacity(
    runs: Sequence[Mapping[str, Any]], optimal: float | None, lead: str
) -> Any:
    from matplotlib.ticker import PercentFormatter

    capacities = sorted({s["capacity"] for s in runs}, key=lambda c: (c is None, c or 0))
    if len(capacities) < 2:
        return None
    finite = [c for c in capacities if c is not None]
    unbounded_x = max(finite) * 4  # one step right of the largest, on a log axis
    fig = _figure(7, 4)
    ax = fig.subplots()
    for policy in dict.fromkeys(s["policy"] for s in runs):
        mine = [s for s in runs if s["policy"] == policy]
        pts = sorted((s["capacity"], s["hit_rate"]) for s in mine if s["capacity"] is not None)
        top = [s["hit_rate"] for s in mine if s["capacity"] is None]
        style: dict[str, Any] = {"label": policy}
        if pts:
            (line,) = ax.plot([c for c, _ in pts], [h for _, h in pts], marker="o", **style)
            style = {"color": line.get_color()}
        if top:  # unbounded: a hollow marker at "inf", a dotted segment up to it
            if pts:
                ax.plot([pts[-1][0], unbounded_x], [pts[-1][1], top[0]], ":", **style)
            ax.plot([unbounded_x], top, marker="o", fillstyle="none", linestyle="", **style)
    if optimal:
        ax.axhline(optimal, color="grey", linestyle="--", label="H*")
    ax.set_xscale("log")
    ax.set_xticks(
        [c if c is not None else unbounded_x for c in capacities],
        [format_capacity(c) for c in capacities],
    )
    ax.minorticks_off()
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("KV capacity per worker (tokens; inf: unbounded)")
    ax.set_ylabel("hit rate")
    workers, _, consistency, load = cell_key(runs[0])
    where = f"{workers} worker{'s' if workers != 1 else ''}, {consistency}{_where_load(load)}"
    ax.set_title(f"{lead}hit rate by capacity, {where}")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def _throughput_by_workers(runs: Sequence[Mapping[str, Any]], lead: str) -> Any:
    counts = sorted({s["workers_count"] for s in runs})
    if len(counts) < 2:
        return None
    base = next((s for s in runs if s["workers_count"] == 1), None)
    fig = _figure(7, 4)
    ax = fig.subplots()
    for policy in dict.fromkeys(s["policy"] for s in runs if s["workers_count"] > 1):
        mine = [s for s in runs if s["policy"] == policy and s["workers_count"] > 1]
        pts = sorted((s["workers_count"], s["throughput_rps"]) for s in mine)
        if base is not None:  # one worker routes alike under every policy: a shared base
            pts.insert(0, (1, base["throughput_rps"]))
        ax.plot([w for w, _ in pts], [t for _, t in pts], marker="o", label=policy)
    ax.set_xticks(counts, [str(c) for c in counts])
    ax.set_xlabel("workers")
    ax.set_ylabel("completed requests / s")
    _, capacity, consistency, load = cell_key(runs[0])
    room = (
        "unbounded caches" if capacity is None else f"{format_capacity(capacity)} tokens a worker"
    )
    ax.set_title(f"{lead}throughput by fleet size, {room}, {consistency}{_where_load(load)}")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def _load_per_worker(record: RunRecord, lead: str) -> Any:
    run = record.run
    if run is None or not run.load:
        return None
    fig = _figure(8, 4)
    ax = fig.subplots()
    for i, name in enumerate(run.worker_names):
        pts = [(t, waiting + running) for t, w, waiting, running in run.load if w == i]
        ax.step([t for t, _ in pts], [v for _, v in pts], where="post", label=name)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests waiting or running")
    policy = record.summary["policy"]
    ax.set_title(f"{lead}load per worker, {policy}, {cell_label(record.summary)}")
    _legend(ax)
    return fig


def figures(records: Sequence[RunRecord], tag: str = "") -> Iterator[tuple[str, Any]]:
    """Every plot the records support, as ``(file stem, matplotlib Figure)`` pairs.

    Figures are made without pyplot (no global state, no backend switched, nothing
    to close). Needs matplotlib; see the module docstring for what is drawn and
    how it is named.
    """
    prefix = f"{tag}_" if tag else ""
    lead = f"{tag}: " if tag else ""
    summaries = [r.summary for r in records]
    optimal = next((s["optimal_hit_rate"] for s in summaries if s.get("optimal_hit_rate")), None)

    cells: dict[tuple[Any, ...], list[RunRecord]] = {}
    for r in records:
        cells.setdefault(cell_key(r.summary), []).append(r)
    for members in cells.values():
        fig = _ttft_cdf(members, lead)
        if fig is not None:
            yield f"{prefix}ttft_cdf_{cell_slug(members[0].summary)}", fig

    fleets: dict[str, list[Mapping[str, Any]]] = {}
    for s in summaries:
        workers, _, consistency, load = cell_key(s)
        fleets.setdefault(_with_load(f"{workers}w_{consistency}", load), []).append(s)
    for slug, runs in fleets.items():
        fig = _hit_rate_by_capacity(runs, optimal, lead)
        if fig is not None:
            yield f"{prefix}hit_rate_by_capacity_{slug}", fig

    by_capacity: dict[str, list[Mapping[str, Any]]] = {}
    for s in summaries:
        _, capacity, consistency, load = cell_key(s)
        slug = _with_load(f"{format_capacity(capacity)}_{consistency}", load)
        by_capacity.setdefault(slug, []).append(s)
    for slug, runs in by_capacity.items():
        fig = _throughput_by_workers(runs, lead)
        if fig is not None:
            yield f"{prefix}throughput_by_workers_{slug}", fig

    for r in records:
        fig = _load_per_worker(r, lead)
        if fig is not None:
            yield f"{prefix}load_per_worker_{r.summary['policy']}_{cell_slug(r.summary)}", fig


def write_plots(out: Path, records: Sequence[RunRecord], tag: str = "") -> list[Path]:
    """Write every plot the records support under ``out``; returns the files written.

    Parameters
    ----------
    out : Path
        The folder (created if needed).
    records : sequence of RunRecord
        The runs, at most one per (policy, cell).
    tag : str
        Put first in every file name and title (letters, digits, ``_.-``).

    Returns
    -------
    list of Path
        The PNG files, none without matplotlib.

    Complexity: O(total completed requests) for the CDFs, O(runs) for the rest.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stem, fig in figures(records, tag):
        path = out / f"{stem}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        written.append(path)
    return written
