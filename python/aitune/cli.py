"""Console script `aitune`: runs the C++ command line (src/cli) inside the extension;
`serve` and `loadtest` (Ray Serve, Python only) go to aitune.serve.cli."""
import os
import sys

from aitune import _core

#: Commands of the Python side: they drive Ray Serve, which has no C++ API.
PYTHON_COMMANDS = ("serve", "loadtest")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in PYTHON_COMMANDS:
        try:
            from aitune.serve import cli as serve_cli
        except ImportError as error:
            print(f"aitune {sys.argv[1]}: needs the serving extra (pip install 'aitune[serve]'): {error}",
                  file=sys.stderr)
            return 2
        return (serve_cli.serve_main if sys.argv[1] == "serve" else serve_cli.loadtest_main)(sys.argv[2:])
    # The arguments as the bytes the process was given (sys.argv decoded them with
    # surrogateescape): a Latin-1 file name reaches the command line unchanged.
    status = _core.cli_main([os.fsencode(arg) for arg in sys.argv])
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        sys.stdout.flush()
        print("  serve                       Serve a checkpoint with Ray Serve, batching chosen from its measurements "
              "(aitune[serve])")
        print("  loadtest                    Concurrency sweep against a served checkpoint, answers checked")
    return status


if __name__ == "__main__":
    sys.exit(main())
