"""`python -m downpour.launch --servers 2 --workers 2 [--replication 2] [--fault F] train.py ARGS`

Starts a coordinator and the servers on this machine and runs `python train.py ARGS` once per
worker, as `torchrun` does: each script joins with `downpour.connect()` and finds in its
environment `DOWNPOUR_COORDINATOR`, `DOWNPOUR_WORKER_FLAGS` (the cluster's settings) and
`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (its launch slot; `Session.rank` is the
rank the coordinator gave it). Every option of `downpour launch` works here: `--fault "kill
server:1 at 3s"`, `--replication 2`, `--checkpoint-dir`, `--tls-dir`, … (`--help` lists
them). Output lines are prefixed with their process; the first process to fail ends the run
(a killed server of a replicated job does not) and sets the exit code.
"""

import os
import sys

from ._downpour import cli


def main(argv=None) -> int:
    """Runs the launcher with `argv` (the command line without the program's name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # the workers' output is read line by line: no block buffering in their interpreters
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return cli(
        ["downpour launch", "launch", "--exec", sys.executable, *argv],
        [sys.executable, "-m", "downpour"],
    )


if __name__ == "__main__":
    sys.exit(main())
