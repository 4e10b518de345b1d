"""`python -m downpour.launch --servers 2 --workers 2 [--replication 2] [--fault F] train.py ARGS`

Starts a coordinator and the servers on this machine and runs `python train.py ARGS` once per
worker, as `torchrun` does: each script joins with `downpour.connect()` and finds in its
environment `DOWNPOUR_COORDINATOR`, `DOWNPOUR_WORKER_FLAGS` (the cluster's settings) and
`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (its launch slot; `Session.rank` is the
rank the coordinator gave it). Every option of `downpour launch` works here: `--fault "kill
server:1 at 3s"`, `--replication 2`, `--checkpoint-dir`, `--tls-dir`, … (`--help` lists
them). Like torchrun, it sets OMP_NUM_THREADS to the machine's cores divided by the workers
unless it is set. Output lines are prefixed with their process; the first process to fail ends the run
(a killed server of a replicated job does not) and sets the exit code.
"""

import os
import sys

from ._downpour import cli


def _workers(argv) -> int:
    """The value of launch's --workers (1 if absent or unreadable: the CLI reports it)."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        v = a.split("=", 1)[1] if a.startswith("--workers=") else (argv[i + 1] if a == "--workers" and i + 1 < len(argv) else None)
        if v is not None:
            try:
                return int(v)
            except ValueError:
                return 1
    return 1


def main(argv=None) -> int:
    """Runs the launcher with `argv` (the command line without the program's name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # the workers' output is read line by line: no block buffering in their interpreters
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # as torchrun: W workers on one machine share its cores, so each one's intra-op thread
    # pool (PyTorch, NumPy's BLAS) gets its share, unless OMP_NUM_THREADS says otherwise
    # (2 workers of the MovieLens example on 2 cores: 25,000 examples/s with 2 threads
    # each, 106,000 with 1)
    workers = _workers(argv)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    return cli(
        ["downpour", "launch", "--exec", sys.executable, *argv],
        [sys.executable, "-m", "downpour"],
    )


if __name__ == "__main__":
    sys.exit(main())
