"""`python -m downpour …` (and the `downpour` script the package installs): the Downpour
command-line tool, the same as the `downpour` binary (`python -m downpour --help`). The
processes it starts (`launch`, `bench`, `experiment`) run `python -m downpour` too."""

import sys

from ._downpour import cli


def main() -> None:
    sys.exit(cli(["downpour", *sys.argv[1:]], [sys.executable, "-m", "downpour"]))


if __name__ == "__main__":
    main()
