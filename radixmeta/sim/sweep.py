"""Running one workload over a grid of fleets, in this process or in several.

A sweep is the product of worker counts, policies, capacities and
consistencies; each cell is one :class:`~radixmeta.sim.engine.Simulation`. Cells
are independent and deterministic, so ``jobs > 1`` runs them in worker
processes and returns exactly what one process would, in the same order.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Any

from radixmeta.errors import InvalidInputError
from radixmeta.sim.engine import SimConfig, SimRun, Simulation
from radixmeta.sim.metrics import scaling, summarise

__all__ = ["grid", "run_cells"]


def grid(
    base: SimConfig,
    *,
    workers: Sequence[int],
    policies: Sequence[str],
    capacities: Sequence[int | None],
    consistencies: Sequence[str],
) -> list[SimConfig]:
    """Every combination, policies varying fastest; one-worker cells run once per capacity.

    With one worker every policy and every consistency route alike, so a sweep
    that includes one worker gets a single one-worker cell per capacity (the
    base of the scaling figures), with the first policy and consistency listed.
    """
    if not workers or not policies or not capacities or not consistencies:
        msg = "a sweep needs at least one worker count, policy, capacity and consistency"
        raise InvalidInputError(msg)
    cells: list[SimConfig] = []
    for w, cap, cons, pol in itertools.product(workers, capacities, consistencies, policies):
        if w == 1 and (pol != policies[0] or cons != consistencies[0]):
            continue
        cells.append(replace(base, workers=w, policy=pol, capacity=cap, consistency=cons))
    return cells


# Set in each worker process by _init: the workload's arrays, sent once per process.
_SHARED: dict[str, Any] = {}


def _init(tokens: Any, arrivals: Any, outputs: Any) -> None:
    _SHARED.update(tokens=tokens, arrivals=arrivals, outputs=outputs)


def _run_cell(config: SimConfig) -> SimRun:
    return Simulation(_SHARED["tokens"], _SHARED["arrivals"], _SHARED["outputs"], config).run()


def run_cells(
    tokens: Sequence[Any],
    arrivals: Sequence[float],
    outputs: Sequence[int],
    cells: Sequence[SimConfig],
    *,
    optimal: float | None = None,
    jobs: int = 1,
    on_cell: Callable[[int, dict[str, Any]], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_run: Callable[[int, SimRun, dict[str, Any]], None] | None = None,
    keep_runs: bool = True,
) -> tuple[list[dict[str, Any]], list[SimRun]]:
    """Run every cell; returns the summaries (with scaling filled in) and the runs.

    Parameters
    ----------
    tokens, arrivals, outputs : sequence
        The workload, as :class:`~radixmeta.sim.engine.Simulation` takes it.
    cells : sequence of SimConfig
        What to run, in order.
    optimal : float, optional
        The workload's H*, copied into every summary.
    jobs : int, default 1
        Processes; 0 means one per CPU.
    on_cell : callable, optional
        ``on_cell(i, summary)`` as each cell finishes (in completion order).
    on_progress : callable, optional
        ``on_progress(k)``: ``k`` more requests finished (in-process runs only).
    on_run : callable, optional
        ``on_run(i, run, summary)`` as each cell finishes, before ``on_cell``: the
        one moment the whole :class:`~radixmeta.sim.engine.SimRun` is at hand when
        ``keep_runs`` is false.
    keep_runs : bool, default True
        Return every SimRun (per-request lists, and spans where traced). False
        returns no runs and frees each as soon as it is summarised, so a long
        sweep's memory is one run's plus the summaries (and whatever ``on_run``
        keeps).
    """
    if jobs == 0:
        jobs = os.cpu_count() or 1
    if jobs < 0:
        msg = f"jobs must be >= 0, got {jobs}"
        raise InvalidInputError(msg)
    runs: list[SimRun | None] = [None] * len(cells)
    summaries: list[dict[str, Any] | None] = [None] * len(cells)

    def finish(i: int, run: SimRun) -> None:
        summary = summarise(run, optimal)
        summaries[i] = summary
        if keep_runs:
            runs[i] = run
        if on_run is not None:
            on_run(i, run, summary)
        if on_cell is not None:
            on_cell(i, summary)

    if jobs == 1 or len(cells) == 1:
        for i, cell in enumerate(cells):
            finish(i, Simulation(tokens, arrivals, outputs, cell).run(on_progress))
    else:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(cells)),
            initializer=_init,
            initargs=(list(tokens), list(arrivals), list(outputs)),
        ) as pool:
            futures = {pool.submit(_run_cell, cell): i for i, cell in enumerate(cells)}
            for future in as_completed(futures):
                finish(futures[future], future.result())
    done = [s for s in summaries if s is not None]
    scaling(done)
    return done, [r for r in runs if r is not None]
