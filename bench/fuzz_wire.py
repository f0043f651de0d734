#!/usr/bin/env python3
"""Fuzz the wire decoders: a million seeded mutations, and optionally atheris.

Run: ``python bench/fuzz_wire.py`` (1,000,000 mutations, about 6 minutes on a shared
2-core machine); ``--mutations N``, ``--seed S``, ``--json out.json``;
``--atheris SECONDS`` adds a coverage-guided run (``pip install 'radixmeta[fuzz]'``).
Not part of the test suite; ``tests/test_wire_fuzz.py`` runs 6,000 of the same in CI.

Each mutation (``tests/wire_fuzz.py``: bit flips, byte changes, insertions, deletions,
truncations, splices of two seeds, header swaps, length inflation up to a 2**32 - 1
bomb, nesting past the depth limit) is decoded by every codec (vLLM, SGLang, native) on
the native paths and on the pure-Python ones; the contract is that each either decodes
(the same on both paths, and again after re-encoding) or raises DecodeError (with the
same message on both), and that the binding's entry points never raise. The table
counts, per codec, what it decoded, what it refused for the bytes' structure (the check
before msgspec: truncation, length bombs, depth, UTF-8), what it refused for the schema,
and what broke the contract (which must be 0; each is listed with its bytes in hex).

``--atheris`` runs libFuzzer through atheris on the same contract, starting from the same
seeds, with radixmeta's Python instrumented for coverage (the C++ is not: it is
covered by the mutations and by ``csrc/tests``' ASan/UBSan runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the checkout's radixmeta
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the shared seeds and mutators

# tests/wire_fuzz.py, imported in main(): under atheris, only after its instrumentation
# is set up, so that radixmeta's Python is compiled with coverage hooks.
wire_fuzz: Any = None

OUTCOMES = ("decoded", "structure", "schema", "broken")


def outcome(result: Any) -> str:
    """One of OUTCOMES: a DecodeError from the structure check says "msgpack:"."""
    if result.kind == "error":
        return "structure" if "msgpack:" in result.value else "schema"
    return "decoded" if result.kind == "decoded" else "broken"


def mutation_run(n: int, seed: int, report_every: int) -> dict[str, Any]:
    corpus = wire_fuzz.seeds()
    rng = random.Random(seed)
    counts: dict[str, Counter[str]] = {name: Counter() for name in wire_fuzz.CODECS}
    operators: Counter[str] = Counter()
    broken: list[dict[str, Any]] = []
    breaks = 0
    t0 = time.perf_counter()
    for i in range(n):
        _, data, names = wire_fuzz.mutate(rng, corpus)
        operators.update(names)
        results, problems = wire_fuzz.problems(data)
        for name, result in results.items():
            # A codec whose decode, Python-path parity or round trip broke is counted broken.
            failed = any(p.startswith(f"{name}:") for p in problems)
            counts[name]["broken" if failed else outcome(result)] += 1
        if problems:
            breaks += 1
            if len(broken) < 100:
                broken.append({"mutation": i, "mutators": names, "hex": data.hex(),
                               "problems": problems})
        if report_every and (i + 1) % report_every == 0:
            rate = (i + 1) / (time.perf_counter() - t0)
            print(f"  {i + 1:>10,} mutations, {rate:,.0f}/s, {breaks} broken", flush=True)
    seconds = time.perf_counter() - t0
    return {
        "mutations": n,
        "seed": seed,
        "seeds": len(corpus),
        "seconds": seconds,
        "counts": {name: dict(c) for name, c in counts.items()},
        "operators": dict(operators),
        "contract_breaks": breaks,
        "broken": broken,
    }


def print_table(result: dict[str, Any]) -> None:
    n = result["mutations"]
    print(f"\n{n:,} mutations of {result['seeds']} seeds (seed {result['seed']}), "
          f"{result['seconds']:.0f} s, every codec on each")
    print(f"{'codec':<8}" + "".join(f"{k:>12}" for k in OUTCOMES) + f"{'decoded %':>11}")
    for name, c in result["counts"].items():
        print(f"{name:<8}" + "".join(f"{c.get(k, 0):>12,}" for k in OUTCOMES)
              + f"{100 * c.get('decoded', 0) / n:>10.1f}%")
    print(f"contract breaks: {result['contract_breaks']} (a decoder, the Python paths,")
    print("  a round trip or an entry point of the binding)")
    for item in result["broken"][:5]:
        print(f"  mutation {item['mutation']} ({'+'.join(item['mutators'])}): {item['hex']}")
        for p in item["problems"][:3]:
            print(f"    {p}")


# -- atheris ---------------------------------------------------------------------------------
def atheris_child(args: list[str]) -> None:
    """The libFuzzer target: every codec on the input; anything but DecodeError is a crash."""
    import atheris

    global wire_fuzz
    with atheris.instrument_imports(include=["radixmeta"]):
        import wire_fuzz as module
    wire_fuzz = module

    def one_input(data: bytes) -> None:
        _, problems = wire_fuzz.problems(data)
        if problems:
            raise AssertionError("; ".join(problems))

    atheris.Setup(args, one_input)
    atheris.Fuzz()


def atheris_run(seconds: int) -> dict[str, Any]:
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("\natheris: not installed (pip install 'radixmeta[fuzz]'); skipped")
        return {"skipped": "atheris is not installed"}
    with tempfile.TemporaryDirectory() as corpus:
        for i, (_, data) in enumerate(wire_fuzz.seeds()):
            with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
                f.write(data)
        artifacts = tempfile.mkdtemp(prefix="fuzz_wire-")
        command = [sys.executable, __file__, "--atheris-child", f"-max_total_time={seconds}",
                   f"-artifact_prefix={artifacts}/", "-max_len=4096", corpus]
        print(f"\natheris: {seconds} s of libFuzzer from {len(os.listdir(corpus))} seeds",
              flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    log = done.stderr
    runs = re.findall(r"Done (\d+) runs in (\d+) second", log)
    coverage = re.findall(r"#\d+\s+\w+\s+cov: (\d+) ft: (\d+)", log)
    crashes = sorted(os.listdir(artifacts))
    if not crashes:
        os.rmdir(artifacts)  # kept only to hold what libFuzzer found
    result = {
        "seconds": seconds,
        "exit_code": done.returncode,
        "runs": int(runs[-1][0]) if runs else None,
        "coverage": int(coverage[-1][0]) if coverage else None,
        "features": int(coverage[-1][1]) if coverage else None,
        "crashes": [os.path.join(artifacts, c) for c in crashes],
    }
    print(f"atheris: exit {done.returncode}, {result['runs']} runs, "
          f"{result['coverage']} edges, {result['features']} features covered")
    print(f"atheris: {len(crashes)} crash file(s)" + (f" in {artifacts}" if crashes else ""))
    if done.returncode != 0:
        print("\n".join(log.splitlines()[-20:]))
    return result


def main() -> None:
    global wire_fuzz
    if "--atheris-child" in sys.argv:
        atheris_child([a for a in sys.argv if a != "--atheris-child"])
        return
    import wire_fuzz as module

    wire_fuzz = module
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mutations", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--atheris", type=int, metavar="SECONDS", default=0,
                        help="also run atheris (libFuzzer) this long")
    parser.add_argument("--json", metavar="OUT", help="write the counts and any breaks here")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, cwd=HERE, check=False).stdout.strip(),
    }
    if args.mutations:
        result["mutation_run"] = mutation_run(args.mutations, args.seed,
                                              max(1, args.mutations // 10))
        print_table(result["mutation_run"])
    if args.atheris:
        result["atheris"] = atheris_run(args.atheris)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    breaks = result.get("mutation_run", {}).get("contract_breaks", 0)
    crashed = bool(result.get("atheris", {}).get("crashes"))
    sys.exit(1 if breaks or crashed else 0)


if __name__ == "__main__":
    main()
