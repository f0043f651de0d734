"""SGLang's block hashes (0.5.6+): a SHA-256 chain over the pages' little-endian u32 tokens.

Reference note section 5.3: ``d_i = SHA256(d_{i-1} || tokens of page i as
<u4)``, the first page of a root path with no prefix; the published hash is
``d_i[:8]`` read big-endian as a signed int64 (``hash_str_to_int64``).
radixmeta keeps the same 64 bits unsigned. Salted, LoRA and ``format:
"dynamo"`` chains seed differently and are not reproduced here.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta._keys import check_page_size
from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.wire._normalise import token_array

__all__ = ["block_hashes", "page_digests"]

DIGEST_SIZE = 32


def page_digests(tokens: Any, page_size: int, *, parent: bytes | None = None) -> list[bytes]:
    """The SHA-256 chain digests of the whole pages of ``tokens``.

    Parameters
    ----------
    tokens : sequence of int or integer array
        Token ids in ``[0, 2**32)``; a tail shorter than a page is not hashed,
        as SGLang caches whole pages only.
    page_size : int
        Tokens per page (SGLang's ``--page-size``), at least 1.
    parent : bytes, optional
        The 32-byte digest of the page just before ``tokens[0]`` (the last
        digest of the parent node), to continue its chain; ``None`` starts at
        the root.

    Returns
    -------
    list of bytes
        One 32-byte digest per whole page.

    Raises
    ------
    InvalidInputError
        A token out of range, ``page_size < 1``, or a ``parent`` that is not 32 bytes.
    InputTypeError
        ``tokens`` is not a sequence of integers, or ``parent`` is not bytes.

    Notes
    -----
    Complexity: O(len(tokens)), one SHA-256 update per page.
    """
    page = check_page_size(page_size)
    if parent is not None and not isinstance(parent, bytes):
        msg = f"parent must be a 32-byte digest or None, got {type(parent).__name__}"
        raise InputTypeError(msg)
    if parent is not None and len(parent) != DIGEST_SIZE:
        msg = f"parent must be a 32-byte digest, got {len(parent)} bytes"
        raise InvalidInputError(msg)
    data = token_array(tokens, "tokens").astype("<u4", copy=False).tobytes()
    step = 4 * page
    previous = parent or b""
    digests = []
    for start in range(0, len(data) - step + 1, step):
        previous = hashlib.sha256(previous + data[start : start + step]).digest()
        digests.append(previous)
    return digests


def block_hashes(
    tokens: Any, page_size: int, *, parent: bytes | None = None
) -> npt.NDArray[np.uint64]:
    """The hashes an SGLang 0.5.6+ worker publishes for these pages, as unsigned 64-bit ints.

    The same 64 bits as SGLang's signed int64 (two's complement), so they
    equal what :func:`radixmeta.wire.sglang.decode_batch` returns for its events.

    Parameters
    ----------
    tokens, page_size, parent
        As :func:`page_digests`.

    Returns
    -------
    numpy.ndarray of uint64
        One hash per whole page.

    Raises
    ------
    InvalidInputError, InputTypeError
        As :func:`page_digests`.

    Notes
    -----
    Complexity: O(len(tokens)).

    Examples
    --------
    The check vector of the reference note (SGLang 0.5.6's own functions):

    >>> from radixmeta.wire.sglang import block_hashes
    >>> hashes = block_hashes([151644, 872, 198, 9064, 374, 279, 6722, 315], 4)
    >>> hashes.view("int64").tolist()
    [-1944566869021170841, 9056173362842263460]
    """
    digests = page_digests(tokens, page_size, parent=parent)
    first8 = b"".join(d[:8] for d in digests)
    return np.frombuffer(first8, dtype=">u8").astype(np.uint64)
