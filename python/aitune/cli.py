"""Console script `aitune`: runs the C++ command line (src/cli) inside the extension."""
import sys

from aitune import _core


def main() -> int:
    return _core.cli_main(sys.argv)


if __name__ == "__main__":
    sys.exit(main())
