"""A small on-disk cache of tokenized prompts, so repeated runs do not tokenize again.

Entries are ``.npz`` files (numpy's zip of arrays, read with ``allow_pickle=False``)
named by the SHA-256 of everything that decides their content: the source files'
bytes, the prompt template, the tokenizer's name and the parameters. A changed input
is a new name, so an entry is never stale; deleting the folder is always safe.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["default_cache_dir", "load_prompts", "resolve_cache_dir", "store_prompts"]


def default_cache_dir() -> Path:
    """``$RADIXMETA_CACHE_DIR``, else ``$XDG_CACHE_HOME/radixmeta``, else ``~/.cache/radixmeta``."""
    explicit = os.environ.get("RADIXMETA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "radixmeta"


def resolve_cache_dir(cache: bool | str | os.PathLike[str]) -> Path | None:
    """The folder for ``cache=True`` (the default one), a given path, or None for False."""
    if cache is True:
        return default_cache_dir()
    if cache is False:
        return None
    return Path(cache)


def load_prompts(
    folder: Path, key: str
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]] | None:
    """Return ``(tokens, offsets)`` stored under ``key``, or None when there is none.

    A damaged or foreign file counts as missing: the caller tokenizes again and
    overwrites it.
    """
    path = folder / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            tokens = np.array(data["tokens"], dtype=np.uint32)
            offsets = np.array(data["offsets"], dtype=np.int64)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError):
        return None
    if (
        tokens.ndim != 1
        or offsets.ndim != 1
        or offsets.size == 0
        or offsets[0] != 0
        or offsets[-1] != tokens.size
        or (np.diff(offsets) < 0).any()
    ):
        return None
    return tokens, offsets


def store_prompts(
    folder: Path, key: str, tokens: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64]
) -> bool:
    """Store ``(tokens, offsets)`` under ``key``; return False if the folder is not writable.

    Written to a temporary file and renamed, so a reader in another process sees
    either the whole entry or none.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".npz", dir=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, tokens=tokens, offsets=offsets)
            os.replace(tmp, folder / f"{key}.npz")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        # The cache only saves time: a read-only home or a full disk must not
        # stop a simulation that can tokenize anyway.
        return False
    return True
