"""SGLang's KV-event block hashes (0.5.22 and 0.5.23), from radixmeta's event records.

This module needs neither SGLang nor torch: it is plain ``hashlib`` over the
facts of SGLang's published format (see ``docs/sglang.md``), so a test can
check it without the engine installed.

How SGLang names a published block, for a page of a radix-tree path:

* **The chain.** Page ``i``'s digest is SHA-256 of the previous page's digest
  followed by the page's words, each a little-endian ``uint32``. The first page
  of a path has no previous digest, except in a salted namespace, whose chain
  starts from SHA-256 of ``b"sglang-cache-salt-v1\\0"`` and the salt.
* **EAGLE bigram keys.** A page of bigrams hashes the pairs ``(t[j], t[j+1])``
  as two words each.
* **The event hash** is the digest's first 8 bytes, read as a signed big-endian
  integer.
* **Namespacing.** In the default format, only a LoRA namespace that SGLang's
  name table knows is namespaced (a salt already changed the chain); in the
  ``dynamo`` format, every namespace is. A namespaced hash is the first 8 bytes
  (signed, big-endian) of SHA-256 of a seed and the event hash as 8 signed
  big-endian bytes; the seed is SHA-256 of ``b"sglang-kv-event-namespace-v1"``
  followed, for the extra key and then the salt, by ``b"\\x00"`` when absent or
  ``b"\\x01"``, the UTF-8 length as 8 little-endian bytes and the UTF-8 bytes.

radixmeta keeps every hash as an unsigned 64-bit value (the two's complement of
the signed one); :func:`signed` converts back for the wire.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from radixmeta import _hashing
from radixmeta._hashing import sglang_hashes

__all__ = ["EventHasher", "Namespace", "event_hashes", "namespace_seed", "salt_seed", "signed"]

_SALT_TAG = b"sglang-cache-salt-v1\0"
_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
_U64 = 2**64


class Namespace(NamedTuple):
    """The radixmeta namespace of one SGLang cache namespace.

    SGLang keeps ``(extra_key, cache_salt)`` pairs apart (the extra key carries
    the LoRA id the scheduler appends). ``first`` is set for an EAGLE bigram
    key only: its first raw token. A bigram key of ``n + 1`` raw tokens names
    ``n`` bigrams; two of them share ``k`` bigrams exactly when they share their
    first ``k + 1`` raw tokens, so the tree stores the raw tokens after the first
    under a namespace that includes the first. Position ``i`` of that key is
    bigram ``i``, and its slot is the bigram's, as SGLang pairs them.

    The default namespace (no extra key, no salt, no bigram) is ``None``, not an
    instance, so the common case costs no tuple.
    """

    extra_key: str | None
    cache_salt: str | None
    first: int | None = None


def signed(h: int) -> int:
    """An unsigned 64-bit hash as SGLang publishes it: signed."""
    return h - _U64 if h >= 2**63 else h


def salt_seed(cache_salt: str) -> bytes:
    """The digest a salted namespace's chain starts from."""
    return hashlib.sha256(_SALT_TAG + cache_salt.encode("utf-8")).digest()


def namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The seed that namespaces published hashes, or None when both parts are absent."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(_NAMESPACE_TAG)
    for part in (extra_key, cache_salt):
        if part is None:
            digest.update(b"\x00")
        else:
            raw = part.encode("utf-8")
            digest.update(b"\x01" + len(raw).to_bytes(8, "little") + raw)
    return digest.digest()


def _chain(words: bytes, pages: int, step: int, prior: bytes) -> list[int]:
    """Signed event hashes of ``pages`` pages of ``step`` bytes each, chained from ``prior``."""
    out = []
    digest = prior
    for p in range(pages):
        digest = hashlib.sha256(digest + words[p * step : (p + 1) * step]).digest()
        out.append(int.from_bytes(digest[:8], "big", signed=True))
    return out


def event_hashes(
    path: npt.NDArray[np.uint32],
    page_size: int,
    namespace: Namespace | None,
    *,
    dynamo: bool = False,
    lora_name: Callable[[str | None], str | None] | None = None,
) -> npt.NDArray[np.uint64]:
    """The published hash of every whole page of ``path``, as unsigned 64-bit values.

    ``path`` is the radixmeta path of a node (from its namespace's root);
    ``namespace`` the radixmeta namespace it lives in. ``lora_name`` maps an
    extra key to the adapter name SGLang knows for it (its event name table);
    in the default format only such a namespace is namespaced.

    Complexity: one SHA-256 per page of the path, plus one per page when the
    hashes are namespaced.
    """
    if namespace is None:
        return sglang_hashes(path, page_size)
    pages = len(path) // page_size
    tokens = np.ascontiguousarray(path[: pages * page_size], dtype="<u4")
    if namespace.first is None:
        words, step = tokens.tobytes(), page_size * 4
    else:
        # Bigram j is (raw[j], raw[j + 1]) with raw = [first, *path]: two words each.
        raw = np.concatenate((np.array([namespace.first], dtype="<u4"), tokens))
        pairs = np.empty((pages * page_size, 2), dtype="<u4")
        pairs[:, 0] = raw[:-1]
        pairs[:, 1] = raw[1:]
        words, step = pairs.tobytes(), page_size * 8
    salt = namespace.cache_salt
    hashes = _chain(words, pages, step, b"" if salt is None else salt_seed(salt))
    extra = namespace.extra_key
    if dynamo:
        seed = namespace_seed(extra, salt)
    else:
        known = lora_name is not None and lora_name(extra) is not None
        seed = namespace_seed(extra if known else None, None)
    if seed is not None:
        hashes = [
            int.from_bytes(
                hashlib.sha256(seed + h.to_bytes(8, "big", signed=True)).digest()[:8],
                "big",
                signed=True,
            )
            for h in hashes
        ]
    return np.array(hashes, dtype=np.int64).view(np.uint64)


def _native_chain() -> Callable[[npt.NDArray[np.uint32], int], npt.NDArray[np.uint64]]:
    """radixmeta's default page chain, computed in C++ where the native core is in use."""
    import radixmeta

    if radixmeta.implementation == "native":
        from radixmeta._core import native_chain_hashes

        return native_chain_hashes
    return _hashing.chain_hashes


class EventHasher:
    """:func:`event_hashes` with each page's SHA-256 computed once while it is remembered.

    A log record's path is mostly pages already hashed for an earlier record (a
    new leaf below a cached prefix, a removal of a stored node). SGLang's own
    trees keep each node's digests; radixmeta's nodes carry no such data, so
    this keeps them by page: keyed by the namespace and the page's position-aware
    radixmeta chain hash (a cheap C++ hash of the whole path up to that page),
    it remembers the page's SHA-256 digest and the published hashes of the
    path it was computed for. A new path then costs one C++ chain pass, a binary
    search for its longest remembered prefix (the remembered pages of a path
    are always a prefix of it) and SHA-256 for the rest only.

    What it remembers is a cache of a pure function, so it may be dropped at
    any time: it is, whole, past ``max_pages`` pages. Two different paths with
    the same 64-bit chain hash in one namespace would share an entry (the
    published hash of one would be the other's); the chain is not
    cryptographic, so a client that crafts such collisions can mislabel its own
    pages in the event stream. The event stream only steers routing: a wrong
    hash costs a cache miss, never a wrong result.

    Parameters
    ----------
    dynamo, lora_name
        As for :func:`event_hashes`.
    max_pages : int, default 2**18
        Pages remembered before the memory is dropped.
    """

    def __init__(
        self,
        *,
        dynamo: bool = False,
        lora_name: Callable[[str | None], str | None] | None = None,
        max_pages: int = 1 << 18,
    ) -> None:
        self.dynamo = dynamo
        self.lora_name = lora_name
        self.max_pages = max_pages
        self._chain = _native_chain()
        # (namespace, seed, chain hash) -> (digest, published hashes of a path, its index)
        self._pages: dict[tuple[Any, bytes | None, int], tuple[bytes, npt.NDArray[np.uint64], int]]
        self._pages = {}

    def clear(self) -> None:
        self._pages.clear()

    def __len__(self) -> int:
        return len(self._pages)

    def __call__(
        self, path: npt.NDArray[np.uint32], page_size: int, *, namespace: Namespace | None
    ) -> npt.NDArray[np.uint64]:
        """The published hash of every whole page of ``path`` (see :func:`event_hashes`)."""
        if namespace is not None and namespace.first is not None:  # bigram pages: not kept
            return event_hashes(
                path, page_size, namespace, dynamo=self.dynamo, lora_name=self.lora_name
            )
        pages = len(path) // page_size
        if pages == 0:
            return np.empty(0, dtype=np.uint64)
        seed = self._seed(namespace)
        chain = self._chain(path, page_size)
        memo = self._pages
        lo, hi = 0, pages  # the remembered pages of this path are its first `lo`
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (namespace, seed, int(chain[mid - 1])) in memo:
                lo = mid
            else:
                hi = mid - 1
        out = np.empty(pages, dtype=np.uint64)
        if lo:
            digest, known, index = memo[(namespace, seed, int(chain[lo - 1]))]
            out[:lo] = known[index - lo + 1 : index + 1]
        else:
            salt = None if namespace is None else namespace.cache_salt
            digest = b"" if salt is None else salt_seed(salt)
        if lo == pages:
            return out
        words = np.ascontiguousarray(path[lo * page_size : pages * page_size], dtype="<u4")
        data = words.tobytes()
        step = page_size * 4
        sha = hashlib.sha256
        keys = chain[lo:].tolist()
        for j, key in enumerate(keys):
            digest = sha(digest + data[j * step : (j + 1) * step]).digest()
            h = int.from_bytes(digest[:8], "big", signed=True)
            if seed is not None:
                h = int.from_bytes(
                    sha(seed + h.to_bytes(8, "big", signed=True)).digest()[:8], "big", signed=True
                )
            out[lo + j] = h % _U64
            memo[(namespace, seed, key)] = (digest, out, lo + j)
        if len(memo) > self.max_pages:
            memo.clear()
        return out

    def _seed(self, namespace: Namespace | None) -> bytes | None:
        if namespace is None:
            return None
        if self.dynamo:
            return namespace_seed(namespace.extra_key, namespace.cache_salt)
        known = self.lora_name is not None and self.lora_name(namespace.extra_key) is not None
        return namespace_seed(namespace.extra_key if known else None, None)
