"""Type stubs of the extension module (crates/python)."""

from typing import List, Optional

import numpy as np
import numpy.typing as npt

class DownpourError(Exception):
    """An error from Downpour: a bad argument, a request the cluster refused, a lost cluster."""

class Handle:
    def wait(self) -> None:
        """Waits until the servers acknowledged the request."""

class Table:
    id: int
    value_len: int
    def push(self, keys: npt.NDArray[np.uint64], values: npt.NDArray[np.float32]) -> None:
        """Pushes len(keys) * value_len values for keys (sorted, unique) and waits."""
    def push_async(self, keys: npt.NDArray[np.uint64], values: npt.NDArray[np.float32]) -> Handle:
        """Pushes and returns at once; wait on the handle."""
    def pull(self, keys: npt.NDArray[np.uint64], out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Pulls the rows of keys into out (filled in place) or a new (len(keys), value_len) array."""
    def push_range(self, begin: int, values: npt.NDArray[np.float32]) -> None:
        """Pushes whole rows to the consecutive keys begin, begin + 1, ... of a dense table."""
    def pull_range(self, begin: int, out: Optional[npt.NDArray[np.float32]] = None, count: Optional[int] = None) -> npt.NDArray[np.float32]:
        """Pulls rows of keys begin, begin + 1, ... into out, or a new array of count rows."""

class Session:
    rank: int
    num_workers: int
    def table(
        self,
        id: int,
        name: str,
        value_len: int = 1,
        dense: Optional[int] = None,
        init: str = "zeros",
        init_std: float = 0.01,
        seed: int = 1,
        rule: str = "add",
        lr: float = 0.01,
        momentum: float = 0.9,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        l1: float = 0.0,
        l2: float = 0.0,
        ftrl_beta: float = 1.0,
        consistency: str = "async",
        filters: str = "none",
    ) -> Table:
        """Creates table id (or checks that it exists alike) and returns it."""
    def barrier(self, name: str) -> None:
        """Waits until every worker reached the barrier name."""
    def clock(self) -> int:
        """Ends this worker's clock tick; returns the new clock."""
    def finish(self, ok: bool = True, message: str = "") -> None:
        """Leaves the job (ok=False fails it with message)."""

class Cluster:
    servers: int
    workers: int
    def join(self) -> Session:
        """Joins as the next worker; returns once every worker joined."""
    def wait(self) -> None:
        """Waits until every worker finished and the cluster stopped."""

def embedded(servers: int = 2, workers: int = 1, replication: int = 1) -> Cluster:
    """Starts a coordinator and servers inside this process."""

def connect(coordinator: str, token: Optional[str] = None, transport: str = "tcp") -> Session:
    """Joins a running cluster at coordinator (host:port) as its next worker."""

def scramble(ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Spreads application ids over the key space as the servers expect."""

def cli(argv: List[str], program: List[str]) -> int:
    """Runs the downpour command-line tool in this process; returns the exit code."""
