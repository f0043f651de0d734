#!/usr/bin/env python3
"""Side-by-side benchmark: radixmeta's native cache vs its Python reference vs SGLang 0.5.23.

All implementations run in one process, on the same seeded workload, through
the same timing driver (``_sglang_peer.time_suite`` / ``time_deep_match``):

* ``two_level``: 10,000 sequences (100 system prompts x 10 few-shot blocks x
  10 suffixes), 8.0 M tokens, 1.78 M cached. Phases per repeat, on a fresh
  cache: insert all (values = int64 slot ranges), full-hit match of all,
  partial matches (prefix + 32 novel tokens: they split nodes), lock+unlock
  pairs on the full-hit nodes, evict 4096 tokens per call until empty.
  Median of ``--repeats``; GC off inside timed regions.
* ``deep_tree``: ~100k nodes; the median latency of matching one fully cached
  2,048-token prompt whose path is 128 nodes deep.
* memory (page 1): each implementation builds the 8 M-token tree in a fresh
  child process; ``memory_usage()`` per cached token and per node versus the
  RSS growth (``/proc/self/statm``) during the build (SGLang: RSS only).

The pure-Python reference is slow, so it runs on a same-shaped fraction of the
workload: the sequences of the first ``--reference-systems`` system prompts
(default 5 of 100, i.e. 500 sequences; the tree per system prompt, and so the
path depths after the splitting matches, are as in the full run), and on a
``--reference-deep-nodes`` (default 5,000) deep tree with the same 128-node
prompt path. Its numbers are per-operation rates on that smaller tree.

Usage (see bench/README.md)::

    python bench/compare.py --page-sizes 1 16 --repeats 3 --json out.json
    python bench/compare.py --quick --no-sglang
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _sglang_peer as peer  # noqa: E402
import workloads  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# radixmeta
# --------------------------------------------------------------------------------------


def _purge(prefix: str) -> None:
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]


def load_radixmeta() -> tuple[Any, Any, str]:
    """Return (native ``_core`` module or None, ``_reference`` module, note).

    The package refuses to import without its extension unless
    ``RADIXMETA_IMPLEMENTATION=python``; when the native core is missing this
    sets that variable for this process only, so the reference still runs.
    Falls back to the source tree next to this script if radixmeta is not
    installed at all.
    """
    try:
        import radixmeta  # noqa: F401
    except ModuleNotFoundError:
        sys.path.insert(0, REPO)
        _purge("radixmeta")
    except ImportError:
        pass
    note = ""
    native: Any = None
    try:
        from radixmeta import _core as native
    except ImportError as exc:
        note = f"native core not built: radixmeta._core is not importable ({exc})"
        _purge("radixmeta")
        os.environ["RADIXMETA_IMPLEMENTATION"] = "python"
    from radixmeta import _reference

    return native, _reference, note


class RadixmetaAdapter:
    """Drives ``radixmeta`` ``CacheCore`` (native or reference) for the shared timing driver."""

    def __init__(self, module: Any, label: str, key_dtype: str = "int64") -> None:
        self.mod = module
        self.label = label
        self.key_dtype = np.dtype(key_dtype)

    def prepare(
        self, sequences: Sequence[np.ndarray], values: Sequence[np.ndarray]
    ) -> tuple[list[Any], list[Any]]:
        return self.prepare_keys(sequences), [np.ascontiguousarray(v, np.int64) for v in values]

    def prepare_keys(self, sequences: Sequence[np.ndarray]) -> list[Any]:
        dt = self.key_dtype
        return [np.ascontiguousarray(s, dtype=dt) for s in sequences]

    def new_cache(self, page_size: int) -> Any:
        return self.mod.CacheCore(page_size)

    def insert_all(self, cache: Any, prepared: tuple[list[Any], list[Any]]) -> None:
        insert = cache.insert
        for k, v in zip(*prepared, strict=True):
            insert(k, v)

    def match_all(self, cache: Any, keys: list[Any]) -> tuple[list[Any], int]:
        """Length and handle only (``values=False``), as SGLang's match_prefix returns."""
        match = cache.match_prefix
        nodes: list[Any] = []
        append = nodes.append
        total = 0
        for k in keys:
            m = match(k, values=False)
            append(m.node)
            total += m.length
        return nodes, total

    def match_all_indices(self, cache: Any, keys: list[Any]) -> int:
        """Match and gather the matched slots, as SGLang's match plus path_device_indices."""
        match = cache.match_prefix
        total = 0
        for k in keys:
            total += len(match(k).values)
        return total

    def match_one(self, cache: Any, key: Any) -> int:
        return int(cache.match_prefix(key, values=False).length)

    def match_one_indices(self, cache: Any, key: Any) -> int:
        return len(cache.match_prefix(key).values)

    def lock_pairs(self, cache: Any, nodes: list[Any]) -> None:
        lock, unlock = cache.lock, cache.unlock
        for node in nodes:
            lock(node)
            unlock(node)

    def evict_all(self, cache: Any, chunk: int) -> tuple[int, int]:
        evict = cache.evict
        calls = tokens = 0
        while cache.evictable_size > 0:
            got = evict(chunk).count
            calls += 1
            tokens += got
            if got == 0:
                break
        return calls, tokens

    def evictable(self, cache: Any) -> int:
        return int(cache.evictable_size)

    def node_count(self, cache: Any) -> int:
        return int(cache.node_count)


# --------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def measure_memory(
    adapter: Any, sequences: Sequence[np.ndarray], values: Sequence[np.ndarray], nodes: int
) -> dict[str, Any]:
    """Build a page-1 tree and compare its ``memory_usage()`` with the RSS it added.

    Meant for a fresh process (see :func:`run_memory_probes`): memory freed by
    an earlier tree stays with the allocator and would hide the growth. Keys and
    values are converted before the first RSS reading, so the growth is the
    tree's own. ``nodes`` is the tree's node count (from ``describe``), used
    when the implementation does not report one.
    """
    prepared = adapter.prepare(sequences, values)
    gc.collect()
    _malloc_trim()
    before = rss_bytes()
    cache = adapter.new_cache(1)
    adapter.insert_all(cache, prepared)
    gc.collect()
    after = rss_bytes()
    usage = getattr(cache, "memory_usage", None)
    reported = int(usage()) if usage is not None else None
    tokens = adapter.evictable(cache)
    nodes = adapter.node_count(cache) or nodes
    growth = after - before
    return {
        "label": adapter.label,
        "sequences": len(sequences),
        "cached_tokens": tokens,
        "nodes": nodes,
        "memory_usage_bytes": reported,
        "rss_growth_bytes": growth,
        "memory_usage_per_token": reported / tokens if reported is not None else None,
        "memory_usage_per_node": reported / nodes if reported is not None else None,
        "rss_growth_per_token": growth / tokens,
        "rss_growth_per_node": growth / nodes,
        # (reported - measured) / measured: negative = memory_usage() undercounts.
        "relative_difference": (
            (reported - growth) / growth if reported is not None and growth > 0 else None
        ),
    }


def build_two_level(args: argparse.Namespace) -> tuple[list[np.ndarray], int]:
    """The benchmark's two_level workload (1/10 of it with ``--quick``)."""
    n_system = 10 if args.quick else 100
    return workloads.two_level(seed=args.seed, n_system=n_system), n_system


def reference_fraction(args: argparse.Namespace) -> list[np.ndarray]:
    """The sequences of the first ``--reference-systems`` system prompts, in run order."""
    n_system = 10 if args.quick else 100
    seqs, groups = workloads.two_level(seed=args.seed, n_system=n_system, return_groups=True)
    keep = groups < args.reference_systems
    return [s for s, k in zip(seqs, keep.tolist(), strict=True) if k]


def memory_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Child-process side of ``--memory-probe IMPL``: one tree, one measurement."""
    name = args.memory_probe
    seqs, _ = build_two_level(args)
    if name == "reference":
        seqs = reference_fraction(args)
    values = workloads.slot_values(seqs)
    nodes = workloads.describe(seqs, 1)["nodes"]
    if name in ("native", "reference"):
        native, reference, note = load_radixmeta()
        module = native if name == "native" else reference
        if module is None:
            raise SystemExit(note)
        adapter: Any = RadixmetaAdapter(module, name, args.key_dtype)
    else:
        peer.load_sglang()
        if name == "sglang-classic":
            adapter = peer.ClassicRadixCache()
        elif name.startswith("sglang-unified-"):
            adapter = peer.UnifiedCache(name.removeprefix("sglang-unified-"))
        else:
            msg = f"unknown implementation {name!r}"
            raise SystemExit(msg)
    return measure_memory(adapter, seqs, values, nodes)


def run_memory_probes(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Measure each implementation's tree memory in its own fresh interpreter."""
    out: dict[str, Any] = {}
    for name in names:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--memory-probe",
            name,
            "--seed",
            str(args.seed),
            "--reference-systems",
            str(args.reference_systems),
            "--key-dtype",
            args.key_dtype,
        ]
        if args.quick:
            cmd.append("--quick")
        log(f"memory: {name} (page 1, fresh process)")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
            out[name] = {"label": name, "error": tail[0]}
            continue
        out[name] = json.loads(lines[-1])
    return out


# --------------------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", REPO, *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def environment(native: Any, note: str, sgl: dict[str, Any] | None) -> dict[str, Any]:
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    status = _git("status", "--porcelain")
    try:
        import radixmeta

        rm_version = getattr(radixmeta, "__version__", None)
        rm_path = os.path.dirname(radixmeta.__file__ or "")
    except ImportError:
        rm_version = rm_path = None
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "radixmeta_version": rm_version,
        "radixmeta_path": rm_path,
        "native_core": native is not None,
        "native_note": note or None,
        "sglang": sgl.get("version") if sgl else None,
        "torch": sgl.get("torch_version") if sgl else None,
    }


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------

# (row title, result key, field); every row is "higher is better".
ROWS = [
    ("insert (seqs/s)", "insert", "ops_per_s"),
    ("match full hit (/s)", "match_full", "ops_per_s"),
    ("match full + slot indices (/s)", "match_full_indices", "ops_per_s"),
    ("match partial, splits (/s)", "match_partial", "ops_per_s"),
    ("lock+unlock pairs (/s)", "lock_pair", "ops_per_s"),
    ("evict calls, 4096 tok (/s)", "evict", "ops_per_s"),
    ("evicted tokens (/s)", "evict", "tokens_per_s"),
    ("evicted nodes (/s)", "evict", "nodes_per_s"),
    ("deep 2048-tok match (/s)", "deep", "calls_per_s"),
    ("deep 2048-tok match + slots (/s)", "deep", "indices_calls_per_s"),
]


def _value(res: dict[str, Any] | None, key: str, field: str) -> float | None:
    if res is None:
        return None
    entry = res.get(key)
    if entry is None:
        return None
    if field == "nodes_per_s":
        ns = entry.get("ns_per_node")
        return 1e9 / ns if ns else None
    if field in ("calls_per_s", "indices_calls_per_s"):
        us = entry.get("median_us" if field == "calls_per_s" else "indices_median_us")
        return 1e6 / us if us else None
    value = entry.get(field)
    return None if value is None else float(value)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def build_rows(
    page_results: dict[str, dict[str, Any]], sgl_labels: list[str]
) -> tuple[list[str], list[list[str]], dict[str, dict[str, Any]]]:
    impls = list(page_results)
    show_sgl = "native" in impls and bool(sgl_labels)
    show_ref = "native" in impls and "reference" in impls
    header = ["metric", *impls]
    if show_sgl:
        header += ["native/best-sgl", "best sgl"]
    if show_ref:
        header.append("native/ref")
    lines: list[list[str]] = []
    ratios: dict[str, dict[str, Any]] = {}
    for title, key, field in ROWS:
        vals = {
            impl: _value(page_results[impl], key, field)
            for impl in impls
        }
        if all(v is None for v in vals.values()):
            continue
        sgl: dict[str, float] = {k: v for k in sgl_labels if (v := vals.get(k))}
        best = max(sgl, key=lambda k: sgl[k]) if sgl else None
        nat, ref = vals.get("native"), vals.get("reference")
        ratios[title] = {
            "native_over_best_sglang": nat / sgl[best] if nat and best is not None else None,
            "best_sglang": best,
            "native_over_reference": nat / ref if nat and ref else None,
        }
        row = [title, *(_fmt(vals[i]) for i in impls)]
        if show_sgl:
            row += [_ratio(nat, sgl[best] if best else None), (best or "-").replace("sglang-", "")]
        if show_ref:
            row.append(_ratio(nat, ref))
        lines.append(row)
    return header, lines, ratios


def print_table(header: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{widths[0]}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    print(fmt.format(*header))
    print("  ".join("-" * w for w in widths))
    for row in lines:
        print(fmt.format(*row))


def print_page(
    p: int,
    args: argparse.Namespace,
    dp: dict[str, int],
    ref_n: int,
    ref_dp: dict[str, int],
    deep: Any,
    ref_deep: Any,
    header: list[str],
    lines: list[list[str]],
    page: dict[str, Any],
) -> None:
    print()
    print(
        f"== page_size={p}: two_level {dp['sequences']:,} seqs, "
        f"{dp['total_tokens'] / 1e6:.2f}M tokens, {dp['distinct_tokens'] / 1e6:.2f}M cached, "
        f"{dp['nodes']:,} nodes; median of {args.repeats}; ops/s, higher is better =="
    )
    if not args.no_reference:
        extra = f", deep tree of {ref_deep[2]['nodes']:,} nodes" if ref_deep else ""
        print(
            f"   reference: {ref_n} seqs of {args.reference_systems} system prompts "
            f"({ref_dp['distinct_tokens']:,} cached tokens){extra}"
        )
    if deep is not None:
        info = deep[2]
        print(
            f"   deep: {info['nodes']:,} nodes, prompt path {info['prompt_path_nodes']} "
            f"nodes deep, {args.deep_calls} timed calls"
        )
    print_table(header, lines)
    for name, res in page.items():
        ev = res["evict"]
        bits = []
        if ev.get("ns_per_node"):
            bits.append(f"evict {ev['ns_per_node']:.0f} ns per evicted leaf")
        if "deep" in res:
            d = res["deep"]
            bits.append(f"deep match median {d['median_us']:.2f} us (p90 {d['p90_us']:.2f})")
        bits.append(f"insert {res['insert']['us_per_op']:.2f} us/seq")
        print(f"   {name}: " + ", ".join(bits))


def print_memory(memory: dict[str, dict[str, Any]]) -> None:
    print()
    print("== memory (page 1, each tree built in a fresh process): memory_usage() vs RSS growth ==")
    mib = 2**20
    for name, m in memory.items():
        if "error" in m:
            print(f"   {name}: not measured ({m['error']})")
            continue
        line = f"   {name}: {m['cached_tokens']:,} tokens, {m['nodes']:,} nodes; "
        if m["memory_usage_bytes"] is not None:
            line += (
                f"memory_usage {m['memory_usage_bytes'] / mib:.1f} MiB = "
                f"{m['memory_usage_per_token']:.2f} B/token, "
                f"{m['memory_usage_per_node']:.0f} B/node; "
            )
        line += (
            f"RSS growth {m['rss_growth_bytes'] / mib:.1f} MiB = "
            f"{m['rss_growth_per_token']:.2f} B/token, {m['rss_growth_per_node']:.0f} B/node"
        )
        rel = m["relative_difference"]
        if rel is not None:
            line += f"; relative difference {rel * 100:+.1f}%"
        print(line)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16], metavar="P")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per phase (median)")
    ap.add_argument("--json", metavar="OUT", help="write all numbers to this JSON file")
    ap.add_argument("--quick", action="store_true", help="small scale (~1/10) for a smoke run")
    ap.add_argument("--no-sglang", action="store_true", help="skip the SGLang peers")
    ap.add_argument("--no-deep", action="store_true", help="skip the deep-tree prompt match")
    ap.add_argument("--no-reference", action="store_true", help="skip the Python reference")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    ap.add_argument(
        "--unified-python",
        action="store_true",
        help="also run UnifiedRadixCache on its Python core",
    )
    ap.add_argument(
        "--kv-events", action="store_true", help="also run the classic SGLang tree with KV events"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-probe", metavar="IMPL", help=argparse.SUPPRESS)
    ap.add_argument(
        "--reference-systems",
        type=int,
        default=5,
        metavar="K",
        help="the Python reference runs on the sequences of the first K system prompts",
    )
    ap.add_argument("--reference-deep-nodes", type=int, default=5000, metavar="N")
    ap.add_argument("--deep-nodes", type=int, default=100_000, metavar="N")
    ap.add_argument(
        "--deep-stride",
        type=int,
        default=16,
        metavar="T",
        help="tokens between explicit branch points along the deep prompt (default 16)",
    )
    ap.add_argument(
        "--deep-keep-path",
        action="store_true",
        help="grow the rest of the deep tree away from the prompt, so its path keeps exactly "
        "2048/stride nodes (a chat-like depth with --deep-stride 256)",
    )
    ap.add_argument("--deep-calls", type=int, default=1000, metavar="N")
    ap.add_argument(
        "--key-dtype",
        default="int64",
        choices=["int64", "int32", "uint32"],
        help="dtype of the numpy keys handed to radixmeta (converted before timing)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.deep_nodes = min(args.deep_nodes, 10_000)
        args.deep_calls = min(args.deep_calls, 200)
        args.reference_systems = min(args.reference_systems, 2)
        args.reference_deep_nodes = min(args.reference_deep_nodes, 2000)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_probe:
        print(json.dumps(memory_probe(args)))
        return 0
    t_start = time.time()
    native, reference, note = load_radixmeta()
    if native is None:
        print("radixmeta: native core not built; running the reference only (pip install -e .)")

    # ---- workloads ---------------------------------------------------------------
    seqs, n_system = build_two_level(args)
    values = workloads.slot_values(seqs)
    partial = workloads.partial_queries(seqs, seed=args.seed)
    ref_seqs = reference_fraction(args)
    ref_n = len(ref_seqs)
    ref_values = workloads.slot_values(ref_seqs)
    ref_partial = workloads.partial_queries(ref_seqs, seed=args.seed)
    desc = {p: workloads.describe(seqs, p) for p in args.page_sizes}
    ref_desc = {p: workloads.describe(ref_seqs, p) for p in args.page_sizes}
    d1 = workloads.describe(seqs, 1)
    log(
        f"two_level: {d1['sequences']:,} seqs, {d1['total_tokens']:,} tokens, "
        f"{d1['distinct_tokens']:,} distinct, {d1['nodes']:,} nodes; reference on {ref_n} of them"
    )
    deep = ref_deep = None
    if not args.no_deep:
        deep_shape = {"stride": args.deep_stride, "grow_on_prompt": not args.deep_keep_path}
        dseqs, dprompt, dinfo = workloads.deep_tree(
            seed=args.seed, nodes=args.deep_nodes, return_info=True, **deep_shape
        )
        deep = (dseqs, dprompt, dinfo)
        log(f"deep_tree: {dinfo}")
        if not args.no_reference:
            rseqs, rprompt, rinfo = workloads.deep_tree(
                seed=args.seed, nodes=args.reference_deep_nodes, return_info=True, **deep_shape
            )
            ref_deep = (rseqs, rprompt, rinfo)

    report: dict[str, Any] = {
        "workload": {
            "two_level": {"n_system": n_system, **d1, "by_page": desc},
            "reference_fraction": {
                "system_prompts": args.reference_systems,
                "sequences": ref_n,
                "by_page": ref_desc,
            },
            "deep_tree": deep[2] if deep else None,
            "reference_deep_tree": ref_deep[2] if ref_deep else None,
            "seed": args.seed,
            "evict_chunk": peer.EVICT_CHUNK,
            "key_dtype_radixmeta": args.key_dtype,
        },
        "memory": {},
        "results": {},
        "deep": {},
        "ratios": {},
        "skipped": {},
    }

    # ---- implementations ------------------------------------------------------------
    rm_impls: list[tuple[str, Any, bool]] = []
    if native is not None:
        rm_impls.append(("native", RadixmetaAdapter(native, "native", args.key_dtype), False))
    else:
        report["skipped"]["native"] = note
    if not args.no_reference:
        rm_impls.append(
            ("reference", RadixmetaAdapter(reference, "reference", args.key_dtype), True)
        )
    sgl_adapters: list[Any] = []
    sgl_info: dict[str, Any] | None = None
    if args.no_sglang:
        report["skipped"]["sglang"] = "--no-sglang"
    else:
        try:
            log("importing sglang (several seconds) ...")
            sgl_adapters = peer.sglang_adapters(
                unified_python=args.unified_python, kv_events=args.kv_events
            )
            sgl_info = peer.load_sglang()
        except ModuleNotFoundError as exc:
            print(f"SGLang skipped: {exc}")
            report["skipped"]["sglang"] = str(exc)
    sgl_labels = [a.label for a in sgl_adapters]

    # ---- memory: every tree in a fresh child process --------------------------------
    if not args.no_memory:
        names = [name for name, _, _ in rm_impls] + sgl_labels
        names = [n for n in names if not n.endswith("+events")]
        report["memory"] = run_memory_probes(args, names)

    for p in args.page_sizes:
        page: dict[str, Any] = {}
        for name, adapter, is_ref in rm_impls:
            log(f"[p={p}] {name}")
            if is_ref:
                r = peer.time_suite(
                    adapter,
                    ref_seqs,
                    ref_values,
                    ref_partial,
                    p,
                    args.repeats,
                    cached_tokens=ref_desc[p]["distinct_tokens"],
                )
                r["workload"] = (
                    f"{ref_n} sequences of the first {args.reference_systems} system prompts"
                )
            else:
                r = peer.time_suite(
                    adapter,
                    seqs,
                    values,
                    partial,
                    p,
                    args.repeats,
                    cached_tokens=desc[p]["distinct_tokens"],
                )
            page[name] = r
        for adapter in sgl_adapters:
            log(f"[p={p}] {adapter.label}")
            page[adapter.label] = peer.time_suite(
                adapter,
                seqs,
                values,
                partial,
                p,
                args.repeats,
                cached_tokens=desc[p]["distinct_tokens"],
            )
        if deep is not None:
            dres: dict[str, Any] = {}
            for name, adapter, is_ref in rm_impls:
                dseqs, dprompt, _ = (ref_deep if is_ref else None) or deep
                dres[name] = peer.time_deep_match(adapter, dseqs, dprompt, p, args.deep_calls)
                page[name]["deep"] = dres[name]
            for adapter in sgl_adapters:
                dres[adapter.label] = peer.time_deep_match(
                    adapter, deep[0], deep[1], p, args.deep_calls
                )
                page[adapter.label]["deep"] = dres[adapter.label]
            report["deep"][str(p)] = dres
        report["results"][str(p)] = {
            k: {kk: vv for kk, vv in v.items() if kk != "deep"} for k, v in page.items()
        }

        header, lines, ratios = build_rows(page, sgl_labels)
        report["ratios"][str(p)] = ratios
        print_page(p, args, desc[p], ref_n, ref_desc[p], deep, ref_deep, header, lines, page)

    if report["memory"]:
        print_memory(report["memory"])

    report["environment"] = environment(native, note, sgl_info)
    report["elapsed_s"] = round(time.time() - t_start, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
        print(f"\nwrote {args.json}")
    print(f"elapsed {report['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
