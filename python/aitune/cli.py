"""Console script `aitune`: runs the C++ command line (src/cli) inside the extension."""
import os
import sys

from aitune import _core


def main() -> int:
    # The arguments as the bytes the process was given (sys.argv decoded them with
    # surrogateescape): a Latin-1 file name reaches the command line unchanged.
    return _core.cli_main([os.fsencode(arg) for arg in sys.argv])


if __name__ == "__main__":
    sys.exit(main())
