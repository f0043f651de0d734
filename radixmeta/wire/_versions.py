"""Engine release strings and the table that maps a release to its wire layout."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Generic, TypeVar

from radixmeta.errors import InputTypeError, InvalidInputError

__all__ = ["Version", "VersionTable", "parse_version", "show"]

Version = tuple[int, int, int]
T = TypeVar("T")

# "0.33", "0.9.0", "0.10.1.1", "0.4.6.post5", "0.33.0rc1": the first three numbers
# decide the layout; pre-, post- and dev-release suffixes map to their base release.
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)*(?:[.+-]?[A-Za-z][0-9A-Za-z.+-]*)?")


def parse_version(text: object, engine: str) -> Version:
    """``"0.22.0"`` as ``(0, 22, 0)``; a missing micro number is 0.

    Raises
    ------
    InputTypeError
        ``text`` is not a string.
    InvalidInputError
        ``text`` does not look like a release number.
    """
    if not isinstance(text, str):
        msg = f"version must be a string such as '0.33', got {type(text).__name__}"
        raise InputTypeError(msg)
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        msg = f"{engine} version must look like '0.33' or '0.9.0', got {text!r}"
        raise InvalidInputError(msg)
    major, minor, micro = match.groups()
    return (int(major), int(minor), int(micro or 0))


def show(version: Version) -> str:
    return ".".join(map(str, version))


class VersionTable(Generic[T]):
    """Layouts keyed by the first release that uses each.

    A release uses the layout of the newest entry at or below it, so releases
    between two entries (patch releases, releases the reference did not list)
    take the layout of the one before.

    Parameters
    ----------
    engine : str
        ``"vLLM"`` or ``"SGLang"``, for messages.
    entries : sequence of (Version, T)
        In increasing version order; the first is the oldest supported release.
    end : Version
        The first release *not* supported (newer than any the layouts were checked on).
    newest : str
        How the newest supported release is shown in messages (``"0.33.x"``).
    """

    def __init__(
        self, engine: str, entries: Sequence[tuple[Version, T]], end: Version, newest: str
    ) -> None:
        self.engine = engine
        self._starts = [start for start, _ in entries]
        self._layouts = [layout for _, layout in entries]
        if self._starts != sorted(self._starts) or self._starts[-1] >= end:
            msg = "entries must be in version order, all before end"
            raise ValueError(msg)
        self._end = end
        self._newest = newest

    @property
    def range_text(self) -> str:
        """The supported releases, as ``"0.9.0 to 0.33.x"``."""
        return f"{show(self._starts[0])} to {self._newest}"

    def find(self, text: object) -> T:
        """The layout of the release named by ``text``.

        Raises
        ------
        InputTypeError, InvalidInputError
            As :func:`parse_version`; ``InvalidInputError`` also for a release
            outside the supported range.
        """
        version = parse_version(text, self.engine)
        if not self._starts[0] <= version < self._end:
            msg = f"{self.engine} version {text!r} is outside the supported range {self.range_text}"
            raise InvalidInputError(msg)
        return self._layouts[bisect.bisect_right(self._starts, version) - 1]
