"""Engine batches to records: page identity, tiers, and what is left out (counted)."""

from __future__ import annotations

import numpy as np
import pytest

from radixmeta import EventLog, MetaTree, RadixCache
from radixmeta.errors import InvalidInputError
from radixmeta.events import Cleared, Removed, Replayer, Stored
from radixmeta.ingest import BatchConverter, engine_batch, extras_tag, namespace_of
from radixmeta.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    UnknownEvent,
    sglang,
    vllm,
)


def stored(
    hashes: list[int], tokens: list[int], parent: int | None = None, **kw: object
) -> BlockStored:
    return BlockStored(
        np.array(hashes, np.uint64),
        parent,
        np.array(tokens, np.uint32),
        kw.pop("block_size", 2),
        **kw,  # type: ignore[arg-type]
    )


def test_events_become_records_named_by_seq_and_index() -> None:
    batch = EventBatch(
        1.0,
        [
            stored([1, 2], [1, 2, 3, 4]),
            UnknownEvent("BlockTransferred", b"\x91\xb0BlockTransferred"),
            BlockRemoved(np.array([2], np.uint64), medium="GPU"),
            AllBlocksCleared(),
        ],
        0,
    )
    conv = BatchConverter(2)
    out = conv.records(batch, worker="w", dp_rank=1, seq=7)
    assert [(type(r), r.seq, r.index) for r in out] == [
        (Stored, 7, 0),
        (Removed, 7, 2),
        (Cleared, 7, 3),
    ]
    assert out[0].block_hashes.tolist() == [1, 2] and out[0].token_ids.tolist() == [1, 2, 3, 4]
    assert conv.counts.unknown == 1 and conv.counts.records == 3


@pytest.mark.parametrize(
    ("event", "counter"),
    [
        (stored([1], [], block_size=0), "tokenless"),  # vLLM's offload placeholder
        (stored([1], [1, 2], group_idx=1), "other_group"),
        (stored([1], [1, 2], medium="STORAGE"), "unmapped_medium"),
        (BlockRemoved(np.array([1], np.uint64), medium="DISK"), "unmapped_medium"),
        (stored([1], [1, 2, 3, 4], block_size=4), "wrong_block_size"),
    ],
)
def test_what_is_left_out_is_counted(event: object, counter: str) -> None:
    conv = BatchConverter(2)
    assert conv.records(EventBatch(0.0, [event], 0), worker="w", dp_rank=0, seq=0) == []
    assert conv.counts.as_dict()[counter] == 1


def test_media_map_to_tiers() -> None:
    conv = BatchConverter(2, tiers={"GPU": 0, "CPU": 1, "STORAGE": 1})
    events = [stored([1], [1, 2], medium=m) for m in ("GPU", "CPU", "STORAGE")]
    out = conv.records(EventBatch(0.0, events, 0), worker="w", dp_rank=0, seq=0)
    assert [r.tier for r in out] == [0, 1, 1]


def test_lora_and_salt_make_the_namespace() -> None:
    assert namespace_of(stored([1], [1, 2])) is None
    assert namespace_of(stored([1], [1, 2], lora_name="ad")) == "lora:ad"
    assert namespace_of(stored([1], [1, 2], lora_id=3)) == "lora:3"
    assert namespace_of(stored([1], [1, 2], cache_salt="s")) == "salt:s"
    assert namespace_of(stored([1], [1, 2], lora_name="ad", cache_salt="s")) == "lora:ad|salt:s"


def test_extra_keys_become_one_tag_per_page() -> None:
    assert extras_tag(None) == extras_tag([]) == 0
    assert extras_tag(["img", 0]) == extras_tag(("img", 0)) != extras_tag(["img", 1])
    conv = BatchConverter(2)
    plain = conv.records(
        EventBatch(0.0, [stored([1, 2], [1, 2, 3, 4], extra_keys=[None, None])], 0),
        worker="w",
        dp_rank=0,
        seq=0,
    )
    assert plain[0].extras is None  # no tag at all: the tree pays nothing
    tagged = conv.records(
        EventBatch(0.0, [stored([1, 2], [1, 2, 3, 4], extra_keys=[["img", 0], None])], 0),
        worker="w",
        dp_rank=0,
        seq=1,
    )
    assert tagged[0].extras.tolist() == [extras_tag(["img", 0]), 0]


def test_a_vllm_stream_replays_into_the_tree() -> None:
    """Bytes of a real layout (0.33 map era) through codec, converter and replayer."""
    tree = MetaTree(2)
    w = tree.add_worker("w")
    replayer = Replayer(tree)
    conv = BatchConverter(2)
    batches = [
        EventBatch(0.0, [stored([0xA, 0xB], [1, 2, 3, 4], medium="GPU")], 0),
        EventBatch(0.0, [stored([0xC], [5, 6], parent=0xB, medium="GPU")], 0),
        EventBatch(0.0, [BlockRemoved(np.array([0xC], np.uint64), medium="GPU")], 0),
    ]
    for seq, batch in enumerate(batches):
        decoded = vllm.decode_batch(vllm.encode_batch(batch, version="0.33"))
        replayer.submit_batch("w", 0, seq, conv.records(decoded, worker="w", dp_rank=0, seq=seq))
    stats = replayer.replay()
    assert (stats.applied, stats.malformed) == (3, 0)
    assert tree.match([1, 2, 3, 4, 5, 6]).length_of(w) == 4


@pytest.mark.parametrize(("codec", "version"), [(vllm, "0.33"), (vllm, "0.22"), (sglang, "0.5.23")])
def test_a_radixmeta_engine_publishes_what_engines_consumers_read(
    codec: object, version: str
) -> None:
    """A RadixCache's block log, as vLLM or SGLang bytes, replays into a mirror of the cache."""
    log = EventLog(form="blocks", hash="sglang", worker="w")
    cache = RadixCache(4, capacity=40, event_log=log)
    rng = np.random.default_rng(1)
    for _ in range(40):
        cache.insert(rng.integers(0, 3, int(rng.integers(4, 24))))
    tree = MetaTree(4)
    w = tree.add_worker("w")
    replayer = Replayer(tree)
    conv = BatchConverter(4)
    for seq, record in enumerate(log.read()):  # one batch per record, as a step would send
        data = codec.encode_batch(engine_batch([record], block_size=4), version=version)  # type: ignore[attr-defined]
        batch = codec.decode_batch(data)  # type: ignore[attr-defined]
        replayer.submit_batch("w", 0, seq, conv.records(batch, worker="w", dp_rank=0, seq=seq))
    stats = replayer.replay()
    assert stats.malformed == 0
    assert tree.held_tokens(w) == cache.total_size
    for key, _ in cache.items():
        assert tree.match(key).length_of(w) == len(key)
    # The hashes are SGLang's: a router outside radixmeta recomputes them from tokens.
    first = next(r for r in log.read() if isinstance(r, Stored) and r.parent_hash is None)
    tokens = first.token_ids
    assert first.block_hashes.tolist() == sglang.block_hashes(tokens, 4).tolist()


def test_engine_batch_needs_block_records() -> None:
    with pytest.raises(InvalidInputError, match="token-path form"):
        engine_batch([Stored("w", 0, 3, key=np.zeros(4, np.uint32))], block_size=4)


def test_lora_salt_and_images_reach_the_tree_as_page_identity() -> None:
    """Two images with equal placeholder tokens stay two pages; each adapter its own tree."""
    tree = MetaTree(2)
    w = tree.add_worker("w")
    replayer = Replayer(tree)
    conv = BatchConverter(2)
    img = [9, 9]
    events = [
        stored([0xA], img, extra_keys=[["image-a", 0]]),
        stored([0xA1], [1, 2], parent=0xA),
        stored([0xB], img, extra_keys=[["image-b", 0]]),
        stored([0xC], [1, 2], lora_name="adapter"),
    ]
    batch = EventBatch(0.0, events, 0)
    replayer.submit_batch("w", 0, 0, conv.records(batch, worker="w", dp_rank=0, seq=0))
    assert replayer.replay().malformed == 0
    tag_a, tag_b = extras_tag(["image-a", 0]), extras_tag(["image-b", 0])
    assert tree.match([*img, 1, 2], extras=[tag_a, 0]).length_of(w) == 4
    assert tree.match([*img, 1, 2], extras=[tag_b, 0]).length_of(w) == 2  # B's continuation: none
    assert tree.match([1, 2]).length_of(w) == 0  # the adapter's page is in its namespace only
    assert tree.match([1, 2], namespace="lora:adapter").length_of(w) == 2


def test_host_media_reach_the_tree_as_tier_1() -> None:
    """vLLM's CPU offload and SGLang's HiCache pages count in host_lengths, not lengths."""
    tree = MetaTree(2)
    w = tree.add_worker("w")
    replayer = Replayer(tree)
    conv = BatchConverter(2)
    events = [
        stored([0xA], [1, 2], medium="GPU"),
        stored([0xB], [3, 4], parent=0xA, medium="CPU"),
        stored([0xC], [5, 6], parent=0xB, medium="CPU_PINNED"),
    ]
    replayer.submit_batch(
        "w", 0, 0, conv.records(EventBatch(0.0, events, 0), worker="w", dp_rank=0, seq=0)
    )
    assert replayer.replay().malformed == 0
    m = tree.match([1, 2, 3, 4, 5, 6])
    assert (int(m.lengths[w.index]), int(m.host_lengths[w.index])) == (2, 6)
