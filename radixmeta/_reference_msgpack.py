"""Pure-Python msgpack structure check: the oracle of the binding's ``msgpack_check``.

``csrc/include/radixmeta/msgpack_batch.hpp`` (``check_message``) walks a message
without decoding it and says why it is not one well-formed msgpack value; the
wire codecs run it before msgspec, so that no decoder recurses past the depth
limit or allocates for a length nobody sent. This is the same rule written the
simple way, one value at a time with an explicit stack, for builds without the
extension and as the oracle of the native check in the tests. The answers are
the same tuples.
"""

from __future__ import annotations

__all__ = ["msgpack_check"]

# Total bytes of the headers whose value has a fixed size: ints, floats, nil,
# bools, fixext.
_FIXED = dict.fromkeys(range(0x00, 0x80), 1) | dict.fromkeys(range(0xE0, 0x100), 1)
_FIXED |= {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9}
_FIXED |= {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
_FIXED |= {0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}
# Containers past the fix forms: header byte -> (bytes of the count, items per entry).
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
# Strings, bins and exts past fixstr: header byte -> (bytes of the length, bytes before data).
_SIZED = {0xD9: (1, 2), 0xDA: (2, 3), 0xDB: (4, 5)}  # str 8, 16, 32
_SIZED |= {0xC4: (1, 2), 0xC5: (2, 3), 0xC6: (4, 5)}  # bin 8, 16, 32
_SIZED |= {0xC7: (1, 3), 0xC8: (2, 4), 0xC9: (4, 6)}  # ext 8, 16, 32: length, type, data


Problem = tuple[str, int, int, int]


def msgpack_check(data: bytes | bytearray | memoryview, max_depth: int) -> Problem | None:
    """Why ``data`` is not one well-formed msgpack value, or None when it is.

    The answer is ``(problem, offset, claimed, header)`` as the binding's
    ``msgpack_check`` gives it: ``problem`` is ``"truncated"``, ``"too_long"``
    (a header claims more items, entries or bytes than the bytes left can hold:
    an item takes a byte at the least, a map entry two), ``"too_deep"`` (arrays
    and maps nested more than ``max_depth`` deep), ``"invalid_byte"`` (0xC1),
    ``"invalid_utf8"`` (a str, map keys included, that Python's strict decoder
    refuses) or ``"trailing"`` (bytes after the value); ``offset`` is the header
    at fault (the data's length when it is truncated), ``claimed`` the count a
    ``"too_long"`` header claims, ``header`` that header's byte (else 0).
    """
    data = bytes(data)
    size = len(data)
    at = 0
    left = [1]  # per open container, the values still to read; first, the message itself
    while left:
        if at >= size:
            return ("truncated", size, 0, 0)
        left[-1] -= 1
        tag = data[at]
        rest = size - at
        fixed = _FIXED.get(tag)
        if fixed is not None:
            if rest < fixed:
                return ("truncated", size, 0, 0)
            at += fixed
        elif 0x80 <= tag <= 0x9F or tag in _CONTAINERS:
            if tag <= 0x9F:
                head, count, per = 1, tag & 0x0F, 1 if tag >= 0x90 else 2
            else:
                width, per = _CONTAINERS[tag]
                head = 1 + width
                if rest < head:
                    return ("truncated", size, 0, 0)
                count = int.from_bytes(data[at + 1 : at + head], "big")
            if count > (rest - head) // per:
                return ("too_long", at, count, tag)
            if len(left) > max_depth:
                return ("too_deep", at, 0, tag)
            at += head
            if count:
                left.append(count * per)
        elif tag == 0xC1:
            return ("invalid_byte", at, 0, tag)
        else:
            if 0xA0 <= tag <= 0xBF:  # fixstr
                head, length = 1, tag & 0x1F
            else:
                width, head = _SIZED[tag]
                if rest < head:
                    return ("truncated", size, 0, 0)
                length = int.from_bytes(data[at + 1 : at + 1 + width], "big")
            if length > rest - head:
                return ("too_long", at, length, tag)
            if tag <= 0xBF or tag >= 0xD9:  # a str (not a bin or an ext)
                try:
                    data[at + head : at + head + length].decode("utf-8")
                except UnicodeDecodeError:
                    return ("invalid_utf8", at, 0, tag)
            at += head + length
        while left and left[-1] == 0:
            left.pop()
    if at != size:
        return ("trailing", at, 0, 0)
    return None
