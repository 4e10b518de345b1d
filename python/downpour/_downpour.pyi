"""Type stubs of the extension module (crates/python)."""

from typing import List, Optional, Tuple

import numpy as np
import numpy.typing as npt

class DownpourError(Exception):
    """An error from Downpour: a bad argument, a request the cluster refused, a lost cluster."""

class Handle:
    def wait(self) -> None:
        """Waits until the servers acknowledged the request."""

class PullHandle:
    def wait(self, out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Waits for the values: into out, or a new (len(keys), value_len) array. Once only."""

class Table:
    id: int
    value_len: int
    def push(self, keys: npt.NDArray[np.uint64], values: npt.NDArray[np.float32]) -> None:
        """Pushes len(keys) * value_len values for keys (sorted, unique) and waits."""
    def push_async(self, keys: npt.NDArray[np.uint64], values: npt.NDArray[np.float32]) -> Handle:
        """Pushes and returns at once; wait on the handle."""
    def pull(self, keys: npt.NDArray[np.uint64], out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Pulls the rows of keys into out (filled in place) or a new (len(keys), value_len) array."""
    def pull_async(self, keys: npt.NDArray[np.uint64]) -> PullHandle:
        """Starts a pull of keys (sorted, unique) and returns at once; wait on the handle."""
    def peek(self, keys: npt.NDArray[np.uint64], out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Reads like pull without creating rows (a missing key reads as its initial value)."""
    def push_range(self, begin: int, values: npt.NDArray[np.float32]) -> None:
        """Pushes whole rows to the consecutive keys begin, begin + 1, ... of a dense table."""
    def pull_range(self, begin: int, out: Optional[npt.NDArray[np.float32]] = None, count: Optional[int] = None) -> npt.NDArray[np.float32]:
        """Pulls rows of keys begin, begin + 1, ... into out, or a new array of count rows."""

class Session:
    rank: int
    num_workers: int
    job_clock: int
    resumed: Optional[str]
    checkpointing: bool
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
        aggregate: str = "none",
        backup_workers: int = 0,
        admit: str = "always",
        evict: str = "never",
        changes: bool = False,
    ) -> Table:
        """Creates table id (or checks that it exists alike) and returns it."""
    def export(self, dir: str, tables: list[int], skew_ms: int = 1000) -> dict:
        """The next export of tables (created with changes=True) into export directory dir:
        a full one first, then deltas; returns its manifest entry."""
    def barrier(self, name: str) -> None:
        """Waits until every worker reached the barrier name."""
    def clock(self) -> int:
        """Ends this worker's clock tick; returns the new clock."""
    def checkpoint_point(self, state: str) -> bool:
        """After each clock: takes a checkpoint when one is due (True), recording state."""
    def retire(self, state: str) -> None:
        """This worker takes no more clocks: checkpoints stop waiting for it."""
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

def connect(
    coordinator: str, token: Optional[str] = None, transport: Optional[str] = None, flags: List[str] = ...
) -> Session:
    """Joins a running cluster at coordinator (host:port) as its next worker; flags are the
    command line's global flags (downpour.connect() fills them from the environment)."""

def initial_rows(
    keys: npt.NDArray[np.uint64], value_len: int, init: str = "normal", init_std: float = 0.01, seed: int = 1
) -> npt.NDArray[np.float32]:
    """The rows a table of this init creates for keys, as a (len(keys), value_len) array."""

def scramble(ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Spreads application ids over the key space as the servers expect."""

def cli(argv: List[str], program: List[str]) -> int:
    """Runs the downpour command-line tool in this process; returns the exit code."""

def prepare_process() -> None:
    """Process settings of a downpour command (no transparent huge pages, open-files limit raised)."""

class ServingNode:
    addr: str
    def served(self) -> Tuple[str, int]:
        """The export served: (base file, cut in ms since the UNIX epoch)."""
    def close(self) -> None:
        """Stops serving."""

class ServingClient:
    tables: List[Tuple[int, str, int]]
    def pull(self, table: int, keys: npt.NDArray[np.uint64], out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """The rows of keys in table: into out or a new (len(keys), value_len) array; a key the model lacks reads as the table's initial row."""

def serve(model: str, listen: str = "127.0.0.1:0", follow_ms: int = 1000) -> ServingNode:
    """Serves export directory model read-only on listen, following new exports (downpour serve)."""

def serving(addr: str) -> ServingClient:
    """Connects to the serving node at addr (host:port)."""
