"""What a sweep keeps and writes: strict JSON results, streamed run by run.

``radixmeta simulate --out DIR`` writes ``DIR/results.json`` when the sweep
starts (no runs yet) and rewrites it (atomically: a temporary file, then a
rename) after every run, so the file is always one complete, valid document of the runs
finished so far; ``"complete": true`` marks the last write. A sweep that is
stopped keeps what it did, and memory does not grow with the runs: each run's
per-request record is dropped once it is summarised, and only a
:class:`RunRecord` (its summary and its sorted TTFTs, 8 bytes per request) is
kept for the plots.

The JSON is strict (RFC 8259): an undefined number, such as a percentile of a run
in which nothing completed, is ``null``, never ``NaN`` or ``Infinity``, so any
JSON parser reads it. :func:`strict` is the conversion.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from radixmeta.sim.engine import SimRun

__all__ = ["RunRecord", "ResultsFile", "dumps", "strict"]


def strict(value: Any) -> Any:
    """``value`` with every non-finite float as None and numpy values as Python ones.

    Dicts, lists and tuples are copied recursively (tuples become lists, as JSON
    has them); other objects are returned as they are. Complexity: O(size).

    >>> strict({"p50": float("nan"), "cap": float("inf"), "n": [1, 2.5]})
    {'p50': None, 'cap': None, 'n': [1, 2.5]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if isinstance(value, np.ndarray):
        return strict(value.tolist())
    if isinstance(value, np.generic):
        return strict(value.item())
    return value


def dumps(doc: Any, *, indent: int | None = 2) -> str:
    """``doc`` as strict JSON text, keys sorted.

    Raises TypeError on a value JSON cannot hold: nothing is quietly written as a
    string.
    """
    return json.dumps(strict(doc), indent=indent, sort_keys=True, allow_nan=False)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


@dataclass
class RunRecord:
    """The part of a run a report keeps after the sweep has moved on.

    Attributes
    ----------
    summary : dict
        :func:`radixmeta.sim.metrics.summarise`'s summary (scaling filled in later).
    ttft : numpy.ndarray
        The completed requests' times to first token, sorted (float64 seconds).
    run : SimRun or None
        The whole record, kept only when it is needed whole (the run a Chrome
        trace is written from).
    """

    summary: dict[str, Any]
    ttft: npt.NDArray[np.float64]
    run: SimRun | None = None

    @classmethod
    def of(cls, run: SimRun, summary: dict[str, Any], *, keep_run: bool = False) -> RunRecord:
        """The record of ``run``; ``keep_run`` keeps the SimRun itself as well."""
        arrival = np.asarray(run.arrival, dtype=np.float64)
        first = np.asarray(run.first_token, dtype=np.float64)
        done = ~np.isnan(first)
        ttft = np.sort(first[done] - arrival[done])
        return cls(summary, ttft, run if keep_run else None)


@dataclass
class ResultsFile:
    """``results.json``, rewritten whole as each run of a sweep finishes.

    Parameters
    ----------
    path : Path
        The file.
    workload : dict
        The workload's description (``name``, ``requests``, ``prompt_tokens``,
        ``metadata``).
    total : int
        Runs the sweep will make.
    extra : dict
        More top-level keys (``claims`` for ``reproduce a4``).

    The document is ``{"workload": ..., "runs": [...], "runs_total": N,
    "complete": bool, **extra}``, the runs in the sweep's order (a run that is
    still going is absent). Summaries are kept by reference, so what the sweep
    adds to them later (``scaling``, once its one-worker base is in) is in the
    next write; scaling is the sweep's to compute, never this file's, as runs of
    different workloads (``reproduce a4``'s batch and Poisson runs) may share it.
    """

    path: Path
    workload: Mapping[str, Any]
    total: int
    extra: dict[str, Any] = field(default_factory=dict)
    _runs: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Written at once: an unwritable folder or a value JSON cannot hold is an
        # error before the sweep, not after its first run.
        self.write(complete=False)

    def add(self, index: int, summary: dict[str, Any]) -> None:
        """Record run ``index``'s summary and rewrite the file."""
        self._runs[index] = summary
        self.write(complete=False)

    def write(self, *, complete: bool) -> None:
        """Write the document now (``complete`` once every run is in)."""
        runs = [self._runs[i] for i in sorted(self._runs)]
        doc = {
            "workload": self.workload,
            "runs": runs,
            "runs_total": self.total,
            "complete": complete,
            **self.extra,
        }
        _write_atomically(self.path, dumps(doc) + "\n")
