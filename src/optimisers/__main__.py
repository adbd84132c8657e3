"""The ``optimisers`` command line: ``optimisers demo``, ``optimisers --version``."""

from __future__ import annotations

import argparse
import os
import sys

import optimisers


def main(argv: list[str] | None = None) -> int:
    """main(argv) -> exit status of the ``optimisers`` command (also ``python -m optimisers``).

    ``optimisers demo [--steps N] [--seed S] [--backend numpy|torch|jax] [--plot FILE.png]``
    runs the demo (see :mod:`optimisers.demo`); ``optimisers --version`` prints the version.
    """
    from optimisers import demo

    parser = argparse.ArgumentParser(prog="optimisers", description=optimisers.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=optimisers.__version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    about = " ".join(demo.__doc__.split("\n\n")[1].replace("``", "").split())
    sub = commands.add_parser("demo", help="train a small network, showing every feature",
                              description=about)
    demo.add_arguments(sub)
    args = parser.parse_args(argv)
    if args.command == "demo":
        try:
            return demo.run(args)
        except BrokenPipeError:  # e.g. `optimisers demo | head`: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
