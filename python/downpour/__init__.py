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

Every error is a `DownpourError` carrying the cause's message.
"""

from ._downpour import Cluster, DownpourError, Handle, Session, Table, connect, embedded, scramble

__all__ = ["Cluster", "DownpourError", "Handle", "Session", "Table", "connect", "embedded", "scramble"]
