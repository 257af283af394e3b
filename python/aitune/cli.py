"""Console script `aitune`: runs the C++ command line (src/cli) inside the extension;
`serve` and `loadtest` (Ray Serve, Python only) go to aitune.serve.cli."""
import os
import signal
import sys

from aitune import _core

#: Commands of the Python side (they drive Ray Serve, which has no C++ API), with the line
#: ``aitune --help`` gives each beside the C++ commands.
PYTHON_COMMANDS = {
    "serve": "Serve a checkpoint with Ray Serve, batching chosen from its measurements (aitune[serve])",
    "loadtest": "Concurrency sweep against a served checkpoint, answers checked",
}


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
    sys.stdout.flush()
    # Ctrl-C as the C++ command line alone takes it: the process ends at once. Python's own
    # handler only sets a flag, read when the call returns (with the GIL released in C++),
    # so a tune went on to its end, wrote its checkpoint and then printed a traceback. Each
    # file the commands write is moved into place whole, so nothing is left half-written.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _core.cli_main([os.fsencode(arg) for arg in sys.argv], list(PYTHON_COMMANDS.items()))


if __name__ == "__main__":
    sys.exit(main())
