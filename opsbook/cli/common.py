"""What the ``opsbook`` command's modules share: the terminal, the parser class of a
subcommand, and how a run folder is named on the command line."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from opsbook.terminal import Terminal

# What a run prints as it goes: plain off a terminal, fitted and coloured on one.
TERMINAL = Terminal()
# `opsbook records show last`: the newest run folder `records list` shows.
LAST_RUN = "last"


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: its options may come before or after its positionals
    (``opsbook run -f d.yml deploy``, ``opsbook records show --json last``), and its help may
    end with text made only when it is asked for (``more_help``)."""

    more_help: Callable[[], str] | None = None
    # A group of subcommands (``records``) parses plainly: argparse's intermixed parsing takes
    # no subcommand; each of its subcommands intermixes its own options.
    groups_subcommands = False
    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # parse_known_intermixed_args parses with parse_known_args itself, twice.
        if self._intermixing or self.groups_subcommands:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def format_help(self) -> str:
        if self.more_help is not None:
            self.epilog = self.more_help()
        return super().format_help()


def run_folder(name: str, runs_dir: Path, following: bool = False) -> Path:
    """The run folder ``records show NAME`` means: a path, a folder under ``runs_dir``, or the
    newest one listed (``last``; following, a detached run still going on counts)."""
    from opsbook.runner import records

    if name == LAST_RUN and not Path(name).is_dir():
        return records.newest_folder(runs_dir) if following else records.newest_run(runs_dir)
    folder = Path(name)
    return folder if folder.is_dir() else runs_dir / name
