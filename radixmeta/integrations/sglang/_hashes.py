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
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from radixmeta._hashing import sglang_hashes

__all__ = ["Namespace", "event_hashes", "namespace_seed", "salt_seed", "signed"]

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
