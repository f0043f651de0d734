"""What a long-running bench's memory is made of: RSS, glibc's heap, and Python's objects.

RSS alone cannot tell a leak from the allocators keeping what was freed. Two of them
hold this process's memory:

* glibc's malloc (the C++ core's nodes, libzmq's queues, Python's objects of more than
  512 bytes): ``mallinfo2`` splits it into what is in use (``in_use``: chunks handed
  out, small and mmap'd) and what is free but kept (``free_kept``: chunks freed into
  an arena's free lists and not given back); ``malloc_trim(0)`` gives the free pages
  back, so RSS before and after a trim shows how much of it was only kept;
* Python's own allocator (every object of up to 512 bytes), which maps 1 MiB arenas
  and gives one back only once every object in it is freed: ``py_arenas`` is what it
  maps, ``py_blocks`` what its live objects take (``sys._debugmallocstats``). A
  backlog of small objects freed in a scattered order leaves arenas mapped, partly
  empty, until later objects fill them again.

``tracemalloc`` says which Python lines hold the memory that grew.

On a system without glibc every figure is None and a trim does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import resource
import sys
import tempfile
import tracemalloc
from typing import Any

__all__ = ["Tracer", "heap_kib", "python_kib", "rss_kib", "trim"]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost",
    )]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None


_LIBC = _libc()


def rss_kib() -> int:
    """This process's resident set size, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def heap_kib() -> dict[str, int | None]:
    """glibc's heap over every arena: ``in_use``, ``free_kept`` and ``mmapped`` KiB.

    ``in_use`` counts what malloc handed out and was not freed (``mmapped`` included);
    ``free_kept`` what was freed and is still held in the arenas' free lists.
    """
    if _LIBC is None:
        return {"in_use": None, "free_kept": None, "mmapped": None}
    info = _LIBC.mallinfo2()
    return {
        "in_use": (info.uordblks + info.hblkhd) // 1024,
        "free_kept": info.fordblks // 1024,
        "mmapped": info.hblkhd // 1024,
    }


def python_kib() -> dict[str, int | None]:
    """Python's allocator: KiB of arenas it maps (``py_arenas``) and its live blocks take.

    Parsed from ``sys._debugmallocstats()`` (CPython's, written to the C stderr, which is
    sent to a file for the call); None where it is missing or says neither.
    """
    debug = getattr(sys, "_debugmallocstats", None)
    if debug is None:
        return {"py_arenas": None, "py_blocks": None}
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as out:
        try:
            os.dup2(out.fileno(), 2)
            debug()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    arenas = re.search(r"arenas \* \d+ bytes/arena\s*=\s*([\d,]+)", text)
    blocks = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    return {
        "py_arenas": None if arenas is None else int(arenas[1].replace(",", "")) // 1024,
        "py_blocks": None if blocks is None else int(blocks[1].replace(",", "")) // 1024,
    }


def trim() -> bool:
    """Give the heap's free pages back to the system (``malloc_trim(0)``); False without glibc."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


class Tracer:
    """tracemalloc from ``start`` on: Python's traced KiB, and the lines that grew most.

    Tracing costs time and memory of its own (``overhead_kib``, part of RSS): a bench
    that traces reports its RSS with that overhead taken out.
    """

    def __init__(self, frames: int = 1) -> None:
        self.frames = frames
        self._first: tracemalloc.Snapshot | None = None

    def start(self) -> None:
        tracemalloc.start(self.frames)
        self._first = self._snapshot()

    @staticmethod
    def _snapshot() -> tracemalloc.Snapshot:
        return tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )

    @property
    def running(self) -> bool:
        return tracemalloc.is_tracing()

    def traced_kib(self) -> int:
        return tracemalloc.get_traced_memory()[0] // 1024

    def overhead_kib(self) -> int:
        return tracemalloc.get_tracemalloc_memory() // 1024

    def growth(self, top: int = 8) -> list[dict[str, Any]]:
        """The lines whose traced memory grew most since ``start``, largest first."""
        assert self._first is not None, "start() first"
        stats = self._snapshot().compare_to(self._first, "lineno")
        out = []
        for stat in stats[:top]:
            frame = stat.traceback[0]
            out.append({
                "where": f"{'/'.join(frame.filename.split('/')[-2:])}:{frame.lineno}",
                "kib": round(stat.size_diff / 1024, 1),
                "blocks": stat.count_diff,
            })
        return out

    def stop(self) -> None:
        tracemalloc.stop()
