"""The examples in the public modules' docstrings run and print what they show."""

import doctest

import pytest

import radixmeta.cache
import radixmeta.log
import radixmeta.meta
import radixmeta.policies
import radixmeta.policies.affinity
import radixmeta.policies.basic
import radixmeta.policies.costs
import radixmeta.policies.default
import radixmeta.policies.dynamo
import radixmeta.policies.preble
import radixmeta.publishing
import radixmeta.replay
import radixmeta.wire._sglang_hash
import radixmeta.wire.sglang
import radixmeta.wire.vllm

MODULES = [
    radixmeta.cache,
    radixmeta.log,
    radixmeta.meta,
    radixmeta.publishing,
    radixmeta.policies,
    radixmeta.policies.affinity,
    radixmeta.policies.basic,
    radixmeta.policies.costs,
    radixmeta.policies.default,
    radixmeta.policies.dynamo,
    radixmeta.policies.preble,
    radixmeta.replay,
    radixmeta.wire.vllm,
    radixmeta.wire.sglang,
    radixmeta.wire._sglang_hash,  # sglang.block_hashes is defined there
]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module: object) -> None:
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0, "no examples found: the docstrings lost their examples"
    assert failures == 0
