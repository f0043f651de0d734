"""Endpoint rules shared with vLLM: who binds, who connects, and one endpoint per dp rank.

These are string rules, so they live apart from any socket: a test can check them without
ZeroMQ, and the publisher and the subscriber cannot drift apart.
"""

from __future__ import annotations

from radixmeta.errors import InvalidInputError

__all__ = ["dp_endpoints", "offset_endpoint", "publisher_binds", "subscriber_binds"]

_LOCAL_SCHEMES = ("ipc://", "inproc://")
_MAX_PORT = 65_535


def publisher_binds(endpoint: str) -> bool:
    """Tell whether a PUB socket given ``endpoint`` binds it (True) or connects to it.

    This is vLLM's rule (``ZmqEventPublisher``): bind if the endpoint contains ``*`` or
    ``::``, or uses ``ipc://`` or ``inproc://``; connect otherwise. SGLang 0.5.14+ also binds
    ``0.0.0.0``, which is added here because connecting to it means nothing.
    A connecting PUB is llm-d's central-indexer layout: the router binds, workers connect.

    Parameters
    ----------
    endpoint : str
        A ZeroMQ endpoint such as ``tcp://*:5557`` or ``tcp://router:5557``.

    Returns
    -------
    bool
        ``True`` to bind, ``False`` to connect.

    Examples
    --------
    >>> publisher_binds("tcp://*:5557"), publisher_binds("tcp://127.0.0.1:*")
    (True, True)
    >>> publisher_binds("tcp://127.0.0.1:5557"), publisher_binds("inproc://kv")
    (False, True)
    """
    return (
        "*" in endpoint
        or "::" in endpoint
        or "0.0.0.0" in endpoint
        or endpoint.startswith(_LOCAL_SCHEMES)
    )


def subscriber_binds(endpoint: str) -> bool:
    """Tell whether a SUB socket given ``endpoint`` binds it (True) or connects to it.

    The other end of :func:`publisher_binds`: a tcp endpoint that a vLLM PUB would bind (a
    wildcard host or port, so it names no peer to connect to) is bound by the SUB too; that
    is the central-indexer layout. Everything else connects, including ``ipc://`` and
    ``inproc://``, which the publisher binds.

    Parameters
    ----------
    endpoint : str
        A ZeroMQ endpoint.

    Returns
    -------
    bool
        ``True`` to bind, ``False`` to connect.

    Examples
    --------
    >>> subscriber_binds("tcp://127.0.0.1:5557"), subscriber_binds("tcp://*:5557")
    (False, True)
    >>> subscriber_binds("ipc:///tmp/kv")
    False
    """
    return not endpoint.startswith(_LOCAL_SCHEMES) and publisher_binds(endpoint)


def offset_endpoint(endpoint: str, rank: int) -> str:
    """Return the endpoint of data-parallel rank ``rank`` for a worker's base endpoint.

    vLLM's ``offset_endpoint_port``: rank 0 keeps the endpoint; a tcp port becomes
    ``port + rank``; ``inproc://x`` becomes ``inproc://x_dp{rank}``. An ephemeral port
    (``0`` or ``*``) is left alone, as vLLM 0.31+ does, since each rank's socket then picks
    its own.

    Parameters
    ----------
    endpoint : str
        The rank-0 endpoint, ``tcp://host:port`` or ``inproc://name``.
    rank : int
        The data-parallel rank, ``>= 0``.

    Returns
    -------
    str
        The endpoint of that rank.

    Raises
    ------
    InvalidInputError
        A negative rank, another scheme (``ipc://`` has no per-rank rule in vLLM), a tcp
        endpoint without a numeric port, or a port beyond 65535.

    Examples
    --------
    >>> offset_endpoint("tcp://127.0.0.1:5557", 2)
    'tcp://127.0.0.1:5559'
    >>> offset_endpoint("inproc://kv", 1)
    'inproc://kv_dp1'
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        msg = f"rank must be an int >= 0, got {rank!r}"
        raise InvalidInputError(msg)
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if not endpoint.startswith("tcp://"):
        msg = f"no per-rank rule for endpoint {endpoint!r}: use tcp:// or inproc://"
        raise InvalidInputError(msg)
    base, sep, port_text = endpoint.rpartition(":")
    if not sep or base == "tcp":
        msg = f"tcp endpoint {endpoint!r} has no port"
        raise InvalidInputError(msg)
    if port_text in ("*", "0"):
        return endpoint
    if not port_text.isdigit():
        msg = f"tcp endpoint {endpoint!r} has a port that is not a number"
        raise InvalidInputError(msg)
    port = int(port_text) + rank
    if port > _MAX_PORT:
        msg = f"port of {endpoint!r} plus rank {rank} is {port}, beyond {_MAX_PORT}"
        raise InvalidInputError(msg)
    return f"{base}:{port}"


def dp_endpoints(endpoint: str, dp_size: int) -> list[str]:
    """Return the endpoints of a worker's ``dp_size`` ranks, rank 0 first.

    Parameters
    ----------
    endpoint : str
        The rank-0 endpoint, as given to the engine.
    dp_size : int
        The number of data-parallel ranks, ``>= 1``.

    Returns
    -------
    list of str
        ``[offset_endpoint(endpoint, r) for r in range(dp_size)]``.

    Raises
    ------
    InvalidInputError
        ``dp_size < 1``, or see :func:`offset_endpoint`.

    Examples
    --------
    >>> dp_endpoints("tcp://10.0.0.5:5557", 3)
    ['tcp://10.0.0.5:5557', 'tcp://10.0.0.5:5558', 'tcp://10.0.0.5:5559']
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        msg = f"dp_size must be an int >= 1, got {dp_size!r}"
        raise InvalidInputError(msg)
    return [offset_endpoint(endpoint, rank) for rank in range(dp_size)]
