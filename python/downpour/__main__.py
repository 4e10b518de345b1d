"""`python -m downpour …` (and the `downpour` script the package installs): the Downpour
command-line tool, the same as the `downpour` binary (`python -m downpour --help`). The
processes it starts (`launch`, `bench`, `experiment`) run `python -m downpour` too."""

import sys

from ._downpour import cli, prepare_process


def main() -> None:
    # as the binary does first: this process is a downpour node now (and its children too)
    prepare_process()
    sys.exit(cli(["downpour", *sys.argv[1:]], [sys.executable, "-m", "downpour"]))


if __name__ == "__main__":
    main()
