"""What both command lines share (``connect-coordinator``, ``connect-worker``): the version, and
sub-command parsers that report their own mistakes.

argparse leaves the arguments a sub-command does not know to the top-level parser, which then
prints the *top-level* usage (``connect-coordinator serve --bogus`` showed
``usage: connect-coordinator [-h] COMMAND ...``, not serve's options). :class:`StrictParser`,
given as the ``parser_class`` of ``add_subparsers`` (nested sub-commands inherit it), refuses
them itself, with its own usage (exit status 2, as any usage error).
"""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import Any

DISTRIBUTION = "connect-coordinator"


def version() -> str:
    """The installed distribution's version (``unknown`` when run from a source tree that was
    never installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser, prog: str) -> None:
    parser.add_argument("--version", action="version", version=f"{prog} {version()}",
                        help="print the version and exit")


class StrictParser(argparse.ArgumentParser):
    """A sub-command's parser: arguments it does not know are an error of its own."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras
