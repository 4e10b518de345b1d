"""Downpour, a parameter server, from Python.

Start an in-process cluster (or `connect` to a launched one), join it as a worker, make tables
on the servers and push and pull NumPy arrays without copies:

    import numpy as np, downpour
    cluster = downpour.embedded(servers=2)
    s = cluster.join()
    t = s.table(1, "weights", value_len=4, rule="adagrad", lr=0.1)
    keys = np.array([3, 7, 42], dtype=np.uint64)
    t.push(keys, np.ones((3, 4), dtype=np.float32))
    rows = t.pull(keys)                       # a (3, 4) float32 array
    s.finish(); cluster.wait()

A script that `python -m downpour.launch` runs joins its cluster with `downpour.connect()`.
A model exported with `Session.export` is served read-only by `downpour.serve(dir)` (or the
`downpour serve` command) and read with `downpour.serving(addr).pull(table, keys)`.
PyTorch modules whose rows live on the servers are in `downpour.torch`. Every error is a
`DownpourError` carrying the cause's message.
"""

import json as _json
import os as _os
from typing import Optional, Sequence

from . import _downpour
from ._downpour import (
    Cluster,
    DownpourError,
    Handle,
    PullHandle,
    ServingClient,
    ServingNode,
    Session,
    Table,
    embedded,
    initial_rows,
    scramble,
    serve,
    serving,
)

__all__ = [
    "Cluster",
    "DownpourError",
    "Handle",
    "PullHandle",
    "ServingClient",
    "ServingNode",
    "Session",
    "Table",
    "connect",
    "embedded",
    "initial_rows",
    "scramble",
    "serve",
    "serving",
]


def connect(
    coordinator: Optional[str] = None,
    token: Optional[str] = None,
    transport: Optional[str] = None,
    flags: Optional[Sequence[str]] = None,
) -> Session:
    """Joins a running cluster as its next worker and returns the worker's `Session`.

    `coordinator` is the coordinator's `host:port`; left out, it is `DOWNPOUR_COORDINATOR`,
    which `python -m downpour.launch` (and `downpour launch --exec`) set for the scripts
    they run, with the cluster's settings in `DOWNPOUR_WORKER_FLAGS` (a JSON list of the
    command line's global flags, e.g. `["--replication", "2"]`; `flags` replaces it).
    `token` is the cluster's shared secret and `transport` `tcp`, `grpc` or `shm`; other
    `DOWNPOUR_*` variables are read as the `downpour` binary reads them.
    """
    if coordinator is None:
        coordinator = _os.environ.get("DOWNPOUR_COORDINATOR")
        if not coordinator:
            raise DownpourError(
                "connect() needs the coordinator's address: pass it, or run the script with "
                "`python -m downpour.launch`, which sets DOWNPOUR_COORDINATOR"
            )
    if flags is None:
        text = _os.environ.get("DOWNPOUR_WORKER_FLAGS", "[]")
        try:
            flags = _json.loads(text)
        except ValueError as e:
            raise DownpourError(f"DOWNPOUR_WORKER_FLAGS is not a JSON list of strings: {e}") from None
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise DownpourError("DOWNPOUR_WORKER_FLAGS is not a JSON list of strings")
    return _downpour.connect(coordinator, token=token, transport=transport, flags=list(flags))
