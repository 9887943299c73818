"""``opsbook records``: list, show (and follow), diff two runs' facts, last good, mark good,
search; thin over :mod:`opsbook.runner.records` and :mod:`opsbook.runner.history`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from opsbook.cli.common import LAST_RUN, TERMINAL, CommandParser, run_folder
from opsbook.core.exceptions import RunError
from opsbook.runner import run as runner


def add_records_group(sub: Any) -> None:
    """``records list|show|diff|last-good|mark-good|search``; ``--runs-dir`` before or after."""
    runs_help = "where run folders are (default: runs)"
    rec = sub.add_parser(
        "records", help="the run folders: list, show, follow, diff two runs' facts, last good"
    )
    rec.groups_subcommands = True
    rec.add_argument("--runs-dir", default="runs", help=runs_help)
    rec.set_defaults(handler=cmd_records, run=None, other=None, json=False, diff=False)
    rec.set_defaults(follow=False, host=[], fact=[], failure=[])
    actions = rec.add_subparsers(dest="action", required=True, parser_class=CommandParser)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help)
        # SUPPRESS: given after the subcommand it is set, else the group's value stays.
        parser.add_argument("--runs-dir", default=argparse.SUPPRESS, help=runs_help)
        return parser

    _list_filters(action("list", "every run folder, newest first (filters: see --help)"))
    show = action("show", "what a run recorded, for people (or as JSON)")
    show.add_argument("run", help=f"a run folder, or {LAST_RUN!r} for the newest one listed")
    show.add_argument("--json", action="store_true", help="the whole record as JSON")
    show.add_argument("--diff", action="store_true", help="the diffs the stages recorded")
    show.add_argument(
        "--follow",
        action="store_true",
        help="a run going on (a detached one): each host's result as its stage records it, "
        "until the record is filed; then the record, and the run's exit code",
    )
    diff = action("diff", "what changed in the facts between two runs, each number old -> new")
    diff.add_argument("run", help=f"the older run (a folder, or {LAST_RUN!r})")
    diff.add_argument("other", help="the newer run")
    action("last-good", "each deployment's and host's last good run")
    mark = action("mark-good", "mark a ready deploy good (when no qualification judges it)")
    mark.add_argument("run", help=f"a run folder, or {LAST_RUN!r}")
    mark.add_argument(
        "--host", action="append", default=[], help="only this host of the run (repeatable)"
    )
    search = action("search", "the runs where a fact had a value, or a failure struck")
    search.add_argument(
        "--fact",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="runs where the fact had the value (a glob), e.g. vllm=0.15.1",
    )
    search.add_argument(
        "--failure",
        action="append",
        default=[],
        metavar="ID",
        help="runs where this failure (catalogue id) struck, e.g. fp8kv-mla",
    )


def _list_filters(listing: argparse.ArgumentParser) -> None:
    listing.add_argument("--deployment", default="", help="only runs of this deployment file")
    listing.add_argument(
        "--host",
        action="append",
        default=[],
        help="only runs on this host (a glob, or part of its name; repeated: any of them)",
    )
    listing.add_argument("--state", default="", help="only runs with this status (ok...)")
    listing.add_argument("--since", default="", help="only runs started at or after (UTC)")
    listing.add_argument("--until", default="", help="only runs started before (UTC)")


def _follow(folder: Path) -> int:
    """Print a run's results as they come until it is filed; the run's exit code."""
    from opsbook.core.results import HostResult
    from opsbook.runner import records

    try:
        for record in records.follow_run(folder):
            if isinstance(record, HostResult):
                TERMINAL.result(record)
            else:
                TERMINAL.progress(record)
    except KeyboardInterrupt:
        print(f"opsbook: stopped following {folder}; the run goes on", file=sys.stderr)
        return 130
    return int(records.show_run(folder).get("exit_code", runner.EXIT_TOOL_FAILED))


def cmd_records(args: argparse.Namespace) -> int:
    if args.action == "list":
        TERMINAL.table(_listed(args))
        return runner.EXIT_OK
    if args.action in HISTORY_ACTIONS:
        return _cmd_history(args)
    from opsbook.runner import records

    if not args.run:
        raise RunError("records show needs a run folder", remedy="see `opsbook records list`")
    folder = run_folder(args.run, Path(args.runs_dir), following=args.follow)
    code = _follow(folder) if args.follow else runner.EXIT_OK
    if args.json:
        print(json.dumps(records.show_run(folder), indent=2))
    elif args.diff:
        print(records.describe_diffs(folder, colour=sys.stdout.isatty()))
    else:
        print(records.describe_run(folder))
    return code


# The records subcommands over many runs' facts (opsbook.runner.history).
HISTORY_ACTIONS = ("diff", "last-good", "mark-good", "search")


def _listed(args: argparse.Namespace) -> Any:
    from opsbook.runner import history

    only = history.RunFilter(
        deployment=args.deployment,
        hosts=tuple(args.host),
        state=args.state,
        since=history.parse_when(args.since) if args.since else None,
        until=history.parse_when(args.until) if args.until else None,
    )
    return history.list_runs(Path(args.runs_dir), only)


def _cmd_history(args: argparse.Namespace) -> int:
    from opsbook.runner import history

    runs_dir = Path(args.runs_dir)
    if args.action == "diff":
        if not (args.run and args.other):
            raise RunError("records diff needs two runs", remedy="opsbook records diff OLD NEW")
        older, newer = (str(run_folder(r, runs_dir)) for r in (args.run, args.other))
        TERMINAL.facts_diff(history.diff_runs(runs_dir, older, newer))
    elif args.action == "last-good":
        TERMINAL.table(history.last_good_table(runs_dir))
    elif args.action == "mark-good":
        if not args.run:
            raise RunError("records mark-good needs a run", remedy="opsbook records mark-good RUN")
        folder = run_folder(args.run, runs_dir)
        marked = history.mark_good(runs_dir, str(folder), args.host)
        print(f"marked {folder.name} good on {', '.join(marked)}")
    else:
        if not (args.fact or args.failure):
            raise RunError(
                "records search needs --fact or --failure",
                remedy="e.g. opsbook records search --fact vllm=0.15.1 --failure fp8kv-mla",
            )
        facts = [history.parse_fact(f) for f in args.fact]
        TERMINAL.table(history.search(runs_dir, facts, args.failure))
    return runner.EXIT_OK
