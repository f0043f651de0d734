"""``python -m radixmeta``: the ``radixmeta`` console script (:mod:`radixmeta.cli`)."""

from __future__ import annotations

from radixmeta.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
