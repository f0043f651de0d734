"""Chained page hashes that name a worker's pages in block-form event records.

Two schemes, both chained (a page's hash depends on every page before it, so
equal pages at different depths are different blocks):

* ``"chain"``, the default: FNV-1a over each page's token words, seeded by the
  previous page's hash and finished with splitmix64. Cheap (the native core
  computes it, ``event_ring.hpp``); it names pages for routers fed by
  radixmeta. This module is its reference implementation.
* ``"sglang"``: SGLang's scheme (0.5.6 and later): page ``i``'s digest is
  SHA-256 of the previous page's digest followed by the page's tokens as
  little-endian uint32; the event hash is the digest's first 8 bytes, read
  big-endian (SGLang publishes them signed; radixmeta keeps every hash as its
  unsigned 64-bit two's complement). A router outside radixmeta that hashes
  request tokens the SGLang way computes the same.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

_MASK = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FNV_PRIME = 0x100000001B3


def chain_hashes(tokens: npt.NDArray[np.uint32], page_size: int) -> npt.NDArray[np.uint64]:
    """The default scheme's hash of each whole page of ``tokens`` (from the root)."""
    out = np.empty(len(tokens) // page_size, dtype=np.uint64)
    h = _GOLDEN
    words = tokens.tolist()
    for p in range(len(out)):
        x = h
        for t in words[p * page_size : (p + 1) * page_size]:
            x = ((x ^ t) * _FNV_PRIME) & _MASK
        x = (x + _GOLDEN) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        h = x ^ (x >> 31)
        out[p] = h
    return out


def sglang_hashes(tokens: npt.NDArray[np.uint32], page_size: int) -> npt.NDArray[np.uint64]:
    """SGLang's hash of each whole page of ``tokens`` (from the root), as uint64."""
    pages = len(tokens) // page_size
    data = np.ascontiguousarray(tokens[: pages * page_size], dtype="<u4").tobytes()
    out = np.empty(pages, dtype=np.uint64)
    digest = b""
    step = page_size * 4
    for p in range(pages):
        digest = hashlib.sha256(digest + data[p * step : (p + 1) * step]).digest()
        out[p] = int.from_bytes(digest[:8], "big")
    return out


SCHEMES = {"chain": chain_hashes, "sglang": sglang_hashes}
