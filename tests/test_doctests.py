"""The examples in the public modules' docstrings run and print what they show."""

import doctest

import pytest

import radixmeta.cache
import radixmeta.events.log
import radixmeta.events.publishing
import radixmeta.events.replay
import radixmeta.meta
import radixmeta.policies
import radixmeta.policies.affinity
import radixmeta.policies.basic
import radixmeta.policies.costs
import radixmeta.policies.default
import radixmeta.policies.dynamo
import radixmeta.policies.preble
import radixmeta.wire._sglang_hash
import radixmeta.wire.sglang
import radixmeta.wire.vllm

MODULES = [
    radixmeta.cache,
    radixmeta.events.log,
    radixmeta.meta,
    radixmeta.events.publishing,
    radixmeta.policies,
    radixmeta.policies.affinity,
    radixmeta.policies.basic,
    radixmeta.policies.costs,
    radixmeta.policies.default,
    radixmeta.policies.dynamo,
    radixmeta.policies.preble,
    radixmeta.events.replay,
    radixmeta.wire.vllm,
    radixmeta.wire.sglang,
    radixmeta.wire._sglang_hash,  # sglang.block_hashes is defined there
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module: object) -> None:
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0, "no examples found: the docstrings lost their examples"
    assert failures == 0
