"""Routing policies: which worker a request goes to, given what every worker holds.

A policy is any object with ``choose(request, view)`` returning one of
``view.workers`` (or a :class:`Choice` naming one, with a reason). The router
builds the :class:`View` from its MetaTree and its load accounting; the policy never
touches the tree. ``create(name, **params)`` builds a built-in by name and
``names()`` lists them; the guide is :doc:`/routing`.

Examples
--------
>>> from radixmeta import policies
>>> policies.names()[:4]
['cache_aware', 'default', 'dynamo_cost', 'least_loaded']
>>> policies.create("least_loaded", load="tokens")
LeastLoaded(load='tokens')
"""

from __future__ import annotations

import inspect

from radixmeta.errors import InputTypeError, PolicyError
from radixmeta.policies import costs
from radixmeta.policies.affinity import CACHE_AWARE_PRESETS, CacheAware, LongestPrefix
from radixmeta.policies.base import (
    BatchPolicy,
    Choice,
    EngineLoad,
    Policy,
    PrefixGroups,
    Request,
    View,
    worker_of,
)
from radixmeta.policies.basic import LeastLoaded, PowerOfTwo, Random, RoundRobin
from radixmeta.policies.default import DefaultPolicy
from radixmeta.policies.dynamo import DynamoCost
from radixmeta.policies.preble import PrebleE2

__all__ = [
    "BatchPolicy",
    "CACHE_AWARE_PRESETS",
    "CacheAware",
    "Choice",
    "DefaultPolicy",
    "DynamoCost",
    "EngineLoad",
    "LeastLoaded",
    "LongestPrefix",
    "POLICIES",
    "Policy",
    "PowerOfTwo",
    "PrebleE2",
    "PrefixGroups",
    "Random",
    "Request",
    "RoundRobin",
    "View",
    "as_policy",
    "costs",
    "create",
    "names",
    "worker_of",
]

#: The built-in policies by name: the table :func:`create` and :func:`names` read.
POLICIES: dict[str, type[Policy]] = {
    "round_robin": RoundRobin,
    "random": Random,
    "least_loaded": LeastLoaded,
    "power_of_two": PowerOfTwo,
    "longest_prefix": LongestPrefix,
    "cache_aware": CacheAware,
    "preble_e2": PrebleE2,
    "dynamo_cost": DynamoCost,
    "default": DefaultPolicy,
}


def names() -> list[str]:
    """The names of the built-in policies, sorted."""
    return sorted(POLICIES)


def create(name: str, **params: object) -> Policy:
    """Build the built-in policy ``name`` with ``params``.

    Parameters
    ----------
    name : str
        One of :func:`names`.
    **params
        The policy's parameters, by keyword (see each class).

    Returns
    -------
    Policy
        A new policy object; policies hold state, so each router gets its own.

    Raises
    ------
    PolicyError
        ``name`` is not a built-in, a parameter is not one the policy takes, or a
        value is out of its range; the message names the culprit and what is allowed.
    InputTypeError
        ``name`` is not a str, or a parameter has the wrong type.

    Examples
    --------
    >>> create("power_of_two", seed=7)
    PowerOfTwo(seed=7, load='tokens')
    >>> create("nope")
    Traceback (most recent call last):
    ...
    radixmeta.errors.PolicyError: unknown policy 'nope'; the built-in policies are cache_aware, ...
    """
    if not isinstance(name, str):
        msg = f"policy name must be a str, got {type(name).__name__}"
        raise InputTypeError(msg)
    try:
        cls = POLICIES[name]
    except KeyError:
        msg = f"unknown policy {name!r}; the built-in policies are {', '.join(names())}"
        raise PolicyError(msg) from None
    accepted = [
        p.name
        for p in inspect.signature(cls).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    unknown = [key for key in params if key not in accepted]
    if unknown:
        takes = ", ".join(accepted) if accepted else "no parameters"
        msg = f"policy {name!r} has no parameter {unknown[0]!r}; it takes {takes}"
        raise PolicyError(msg)
    return cls(**params)


def as_policy(policy: str | Policy) -> Policy:
    """A policy object from a built-in's name or from an object with ``choose``.

    What ``Router(policy=...)`` accepts: a name is passed to :func:`create` with no
    parameters, an object with a callable ``choose`` is returned as it is.

    Raises
    ------
    PolicyError
        An unknown name.
    InputTypeError
        Neither a str nor an object with a ``choose`` method.
    """
    if isinstance(policy, str):
        return create(policy)
    if callable(getattr(policy, "choose", None)):
        return policy
    msg = (
        "policy must be a built-in policy's name or an object with a "
        f"choose(request, view) method, got {type(policy).__name__}"
    )
    raise InputTypeError(msg)
