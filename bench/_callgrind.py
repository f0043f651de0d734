"""Instruction counts of a bench script's child run under callgrind.

Shared by ``dispatch_callgrind.py`` and ``batch_callgrind.py``: instructions, unlike
seconds, repeat on this shared machine, so a few per cent between checkouts can be told.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def child_instructions(script: str, root: Path, args: list[str]) -> int:
    """Instructions callgrind collected running ``script --child *args`` with the
    radixmeta checkout at ``root`` (its bench folder too) first on the path."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'bench'}",
               "OPENBLAS_NUM_THREADS": "1"}
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch}/out",
            sys.executable, str(Path(script).resolve()), "--child", *args,
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        msg = f"callgrind run failed in {root}:\n{done.stderr[-2000:]}"
        raise SystemExit(msg)
    return int(found.group(1))
