"""The ``optimisers`` command line: ``optimisers demo``, ``optimisers --version``."""

from __future__ import annotations

import argparse
import sys

import optimisers


def main(argv: list[str] | None = None) -> int:
    """main(argv) -> exit status of the ``optimisers`` command."""
    parser = argparse.ArgumentParser(prog="optimisers", description=optimisers.__doc__)
    parser.add_argument("--version", action="version", version=optimisers.__version__)
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
