"""The ``opsbook`` command: a thin layer over the library that parses, prints and exits.

Exit codes: 0 success; 1 a check found a problem; 2 bad arguments or deployment file;
3 the tool failed; 4 the host was unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from opsbook import __version__
from opsbook.cli.common import TERMINAL, CommandParser
from opsbook.cli.records import add_records_group
from opsbook.core.channel import StageProgress
from opsbook.core.exceptions import (
    DeploymentError,
    HostLocked,
    HostUnreachable,
    OpsbookError,
    RunbookCopyRefused,
    RunError,
    SandboxFolderRefused,
    SandboxRequestRefused,
)
from opsbook.core.optional_imports import skip_slow_optional_imports, without_pydantic_plugins
from opsbook.core.results import EXIT_LOCKED, HostResult, recap
from opsbook.runner import run as runner
from opsbook.runner.interrupt import RunInterrupted, raising_on_signals

DEFAULT_SANDBOX_DIR = ".sandbox/demo"
LIMIT_HELP = (
    "only these hosts: comma-separated names or addresses, globs (gpu-0*), or 0-based indices "
    "and inclusive ranges ([0], 1:3), as Ansible's --limit"
)


def console() -> int:
    """The ``opsbook`` program: :func:`main`, in a process that ends when it returns."""
    # A run allocates freely (notebooks, their validation, HTML) over the 200,000 objects its
    # imports leave: at the default threshold the collector walked them 0.2-0.4 s in a deploy.
    gc.set_threshold(50_000)
    try:
        return main()
    finally:
        # The interpreter's last collections would walk them all once more (0.5 s after a
        # deploy); frozen objects are skipped, and nothing needs collecting in a process
        # about to end.
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    skip_slow_optional_imports()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # A run seals its record when interrupted (opsbook.runner.interrupt), then exits 130 or 143.
    signals = raising_on_signals() if args.command == "run" else contextlib.nullcontext()
    try:
        with signals:
            code: int = args.handler(args)
    except RunInterrupted as e:
        print(f"opsbook: {e} before the run began: nothing was filed", file=sys.stderr)
        return e.exit_code
    except (
        DeploymentError,
        RunError,
        RunbookCopyRefused,
        SandboxFolderRefused,
        SandboxRequestRefused,
    ) as e:
        print(f"opsbook: {e}", file=sys.stderr)
        return runner.EXIT_USAGE
    except HostUnreachable as e:
        print(f"opsbook: {e}", file=sys.stderr)
        return runner.EXIT_UNREACHABLE
    except HostLocked as e:
        print(f"opsbook: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except OpsbookError as e:
        print(f"opsbook: {e}", file=sys.stderr)
        return runner.EXIT_TOOL_FAILED
    except BrokenPipeError:
        # The reader left (`opsbook records show RUN | head -1`): it had what it wanted.
        _detach_stdout()
        return runner.EXIT_OK
    return code


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opsbook", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    run = sub.add_parser(
        "run",
        help="execute a runbook notebook headless into a run folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.more_help = _stages_help
    run.add_argument(
        "notebook", help="a path, a stage name such as 00_preflight, or 'deploy' for all stages"
    )
    run.add_argument("-f", "--deployment", required=True, help="deployment YAML file")
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a notebook parameter; VALUE is taken as the type the notebook declares "
        "(true/false, a number, text; a list comma-separated)",
    )
    run.add_argument("--runs-dir", default="runs", help="where run folders go (default: runs)")
    run.add_argument("--timeout", type=float, default=None, help="seconds a cell may run")
    run.add_argument(
        "--stage-timeout", type=float, default=None, help="seconds a whole notebook may run"
    )
    run.add_argument(
        "--forks", type=_positive, default=10, help="hosts worked on at once (default: 10)"
    )
    run.add_argument(
        "--max-fail-percentage",
        type=float,
        default=None,
        metavar="P",
        help="deploy: stop the run once more than P%% of the hosts failed; with -p serial, a "
        "batch that fails within P%% does not stop the roll",
    )
    run.add_argument("--limit", default=None, metavar="HOSTS", help=LIMIT_HELP)
    _add_detach_options(run)
    run.add_argument(
        "--textfile",
        type=Path,
        default=None,
        metavar="DIR",
        help="05_diagnose: write DIR/opsbook_<deployment>.prom for node_exporter's textfile "
        "collector (each host's state, time since ready, last verdict); 06_qualify: "
        "DIR/opsbook_<deployment>_qualify.prom (verdict, tok/s and p99 TTFT per cell)",
    )
    run.set_defaults(handler=cmd_run)

    box = sub.add_parser("sandbox", help="the rehearsal host: a real sshd with a simulated GPU box")
    box.add_argument("action", choices=["up", "down", "status", "prepare"])
    box.add_argument("--dir", default=DEFAULT_SANDBOX_DIR, help="its folder (default: %(default)s)")
    box.add_argument("--address", default="127.0.0.1", help="loopback address to listen on")
    box.add_argument("--port", type=int, default=0, help="SSH port (default: a free one)")
    box.add_argument("--shell", default="zsh", choices=["zsh", "bash"], help="login shell")
    box.add_argument(
        "--server-port", type=int, default=0, help="the model server's port (default: a free one)"
    )
    box.add_argument(
        "--gpus",
        default="rtx-pro-6000",
        choices=["rtx-pro-6000", "b200", "h200"],
        help="the simulated GPUs, 8 of them (default: %(default)s)",
    )
    box.add_argument(
        "--vllm-version",
        default="0.15.1",
        type=_release,
        metavar="X.Y.Z",
        help="the vLLM release the simulated server plays (default: %(default)s, the incident's)",
    )
    box.add_argument(
        "--vllm",
        default="sim",
        choices=["sim", "real"],
        help="the simulated vLLM, or a real CPU build serving tiny models, installed once into "
        "a shared cache (`prepare` installs it without starting a host) (default: %(default)s)",
    )
    box.add_argument(
        "--hosts",
        type=_positive,
        default=None,
        help="a rehearsal fleet of N hosts on consecutive addresses from --address, "
        "one deployment file listing them all",
    )
    box.add_argument(
        "--ray",
        action="store_true",
        help="with prepare: install the Ray tier (ray from PyPI, once, into the shared cache)",
    )
    box.add_argument(
        "--multinode",
        action="store_true",
        help="with --hosts: a deployment serving one model across the hosts on a real Ray "
        "cluster (tensor parallel 8 x pipeline parallel N)",
    )
    box.set_defaults(handler=cmd_sandbox)

    ray = sub.add_parser(
        "cluster", help="a deployment served across nodes: its Ray cluster's nodes, or stop it"
    )
    ray.add_argument("action", choices=["status", "stop"])
    ray.add_argument("-f", "--deployment", required=True, help="deployment YAML file")
    ray.set_defaults(handler=cmd_cluster)

    lint = sub.add_parser("lint", help="flag the hazards of an ad-hoc remote command")
    lint.add_argument("shell_command", metavar="COMMAND", help="the command, quoted as one word")
    lint.add_argument(
        "--path", action="append", default=[], help="a path the command uses (may hold spaces)"
    )
    lint.set_defaults(handler=cmd_lint)

    add_records_group(sub)

    check = sub.add_parser(
        "check",
        help="the scheduled health check: each host's server state over one SSH connection",
    )
    check.add_argument("-f", "--deployment", required=True, help="deployment YAML file")
    check.add_argument(
        "--record",
        action="store_true",
        help="run the diagnose notebook into a run folder instead (a kernel start: seconds)",
    )
    check.add_argument("--runs-dir", default="runs", help="where run folders go (with --record)")
    check.add_argument(
        "--forks", type=_positive, default=10, help="hosts checked at once (default: 10)"
    )
    check.add_argument("--limit", default=None, metavar="HOSTS", help=LIMIT_HELP)
    check.set_defaults(handler=cmd_check)

    book = sub.add_parser(
        "runbook", help="the runbook's notebooks: copy them into a folder for JupyterLab"
    )
    book.add_argument("action", choices=["copy", "path"])
    book.add_argument("folder", nargs="?", help="copy: the folder to copy into (made if missing)")
    book.add_argument(
        "--force", action="store_true", help="copy: replace notebooks you changed in the folder"
    )
    book.set_defaults(handler=cmd_runbook)

    diag = sub.add_parser("diagnose", help="classify a vLLM log: state, failure, remedy")
    diag.add_argument("--log", required=True, help="a vLLM log file ('-' for standard input)")
    diag.add_argument("--json", action="store_true", help="answer in JSON")
    diag.add_argument(
        "-v", "--verbose", action="store_true", help="every source of the diagnosis, not the first"
    )
    diag.add_argument(
        "-f",
        "--deployment",
        default=None,
        help="when the log shows a failed or hung server: what changed on the deployment's "
        "hosts since their last good run (from the records in --runs-dir)",
    )
    diag.add_argument("--runs-dir", default="runs", help="where run folders are (default: runs)")
    diag.set_defaults(handler=cmd_diagnose)

    cap = sub.add_parser(
        "plan", help="the capacity plan: KV tokens, whether the start fits, the knobs"
    )
    cap.add_argument("-f", "--deployment", required=True, help="deployment YAML file")
    cap.add_argument(
        "--offline",
        action="store_true",
        help="no SSH: read config.json and the shard headers from --model-dir",
    )
    cap.add_argument(
        "--model-dir", help="offline: a local copy of the checkpoint (default: model.path)"
    )
    cap.add_argument(
        "--gpu-memory", type=_positive, metavar="MIB", help="offline: each GPU's memory in MiB"
    )
    cap.add_argument(
        "--platform", choices=["cuda", "cpu"], default="cuda", help="offline: vLLM's platform"
    )
    cap.add_argument("--vllm-version", type=_release, help="offline: the vLLM release to plan")
    cap.add_argument(
        "--runs-dir", default="runs", help="where the capacity record is kept (default: runs)"
    )
    cap.add_argument("--limit", default=None, metavar="HOSTS", help=LIMIT_HELP)
    cap.set_defaults(handler=cmd_plan)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_detached(args)
    on_folder = _detached_reporter(args)
    if args.notebook == "deploy":
        params = _deploy_parameters(args.parameter)
        apply = bool(params.get("apply", True))
        print(DEPLOY_APPLIES if apply else DEPLOY_DRY, flush=True)
        record = runner.run_deploy(
            args.deployment,
            args.runs_dir,
            apply=apply,
            timeout=args.timeout,
            stage_timeout=args.stage_timeout,
            forks=args.forks,
            max_fail_percentage=args.max_fail_percentage,
            serial=params.get("serial"),
            restart=str(params.get("restart", "changed")),
            on_failure=str(params.get("on_failure", "leave")),
            limit=args.limit,
            qualify=str(params.get("qualify", "off")),
            recheck=bool(params.get("recheck", False)),
            on_result=_print_result,
            on_progress=_print_progress,
            on_folder=on_folder,
        )
        _print_recap(record)
        print(f"run folder: {record.folder}")
        print(f"index: {record.folder / 'index.html'}")
        return record.exit_code
    notebook = runner.find_notebook(args.notebook)
    if args.textfile is not None:
        _check_textfile(notebook, args.textfile)
    record = runner.run_notebook(
        notebook,
        args.deployment,
        runner.typed_parameters(notebook, args.parameter),
        runs_dir=args.runs_dir,
        timeout=args.timeout,
        stage_timeout=args.stage_timeout,
        forks=args.forks,
        on_result=_print_result,
        on_progress=_print_progress,
        limit=args.limit,
        on_folder=on_folder,
    )
    _print_recap(record)
    print(f"run folder: {record.folder}")
    print(f"executed notebook: {record.executed_notebook}")
    if args.textfile is not None:
        print(f"textfile: {_write_textfile(args.textfile, args.deployment, record)}")
    return record.exit_code


def _check_textfile(notebook: Path, folder: Path) -> None:
    """``--textfile`` goes with 05_diagnose or 06_qualify, into a folder opsbook may write to.

    Raises:
        RunError: another notebook, or a folder that cannot be written.
    """
    from opsbook import stages
    from opsbook.runner import textfile

    if stages.get(notebook.stem) not in (stages.DIAGNOSE, stages.QUALIFY):
        raise RunError(
            f"--textfile is for 05_diagnose and 06_qualify, not {notebook.stem}",
            remedy="run `opsbook run 05_diagnose -f D --textfile DIR` (or 06_qualify)",
        )
    textfile.check_folder(folder)


def _write_textfile(folder: Path, deployment_file: str, record: runner.RunRecord) -> Path:
    """The run's verdicts as ``opsbook_<deployment>.prom`` in ``folder`` (06_qualify's with its
    receipts' figures, as ``opsbook_<deployment>_qualify.prom``)."""
    from opsbook.core.deployment import load_deployment
    from opsbook.runner import records, textfile

    name = load_deployment(deployment_file).name
    if any(r.stage == textfile.QUALIFY for r in record.results):
        from opsbook.steps import qualify_receipt as receipts

        filed = receipts.receipts_in(record.folder / receipts.FOLDER / receipts.RECEIPT_FILE)
        return textfile.write_qualify_textfile(folder, name, record.results, filed)
    summaries = records.recorded_metrics(record.folder)
    return textfile.write_textfile(folder, name, record.results, summaries)


def cmd_check(args: argparse.Namespace) -> int:
    if args.record:
        record = runner.run_notebook(
            "05_diagnose",
            args.deployment,
            runs_dir=args.runs_dir,
            forks=args.forks,
            on_result=_print_result,
            limit=args.limit,
        )
        _print_recap(record)
        print(f"run folder: {record.folder}")
        return record.exit_code
    with without_pydantic_plugins():
        import opsbook.core.deployment  # noqa: F401  (its schema is built here)
    checked = runner.check_servers(
        args.deployment, forks=args.forks, on_result=_print_result, limit=args.limit
    )
    _print_recap(checked)
    return checked.exit_code


def _print_result(result: HostResult) -> None:
    TERMINAL.result(result)


def _print_progress(progress: StageProgress) -> None:
    TERMINAL.progress(progress)


def _print_recap(record: runner.RunRecord | runner.CheckRecord) -> None:
    from opsbook.runner.rolling import recap_notes

    notes = recap_notes(record.results)
    ok = record.exit_code == 0
    TERMINAL.recap(recap(record.results), record.status, record.message, ok, notes=notes)
    if isinstance(record, runner.RunRecord):
        from opsbook.runner import records

        if records.dry_run(record.parameters, record.notebook):
            TERMINAL.plain(records.DRY_RUN_NOTE)


def _stages_help() -> str:
    """The stages `opsbook run` takes and each one's parameters (``-p NAME VALUE``), as
    papermill's ``--help-notebook`` shows a notebook's."""
    from opsbook.runner.parameters import runbook_parameters

    lines = [
        "NOTEBOOK is one of these stages (or a path to a notebook), with the parameters -p sets:"
    ]
    for notebook in runbook_parameters():
        lines.append(f"  {notebook.name}: {notebook.title}")
        for p in notebook.parameters:
            said = f" - {p.comment}" if p.comment else ""
            lines.append(f"      {p.name}: {p.type_name} (default {p.default!r}){said}")
    lines += [
        "  deploy: every stage above in order, on every host; it changes the hosts (apply "
        "true) unless -p apply false",
        "      apply: bool (default True) - false for a dry run that changes nothing",
        "      serial: str (default all hosts at once) - N or N% of the hosts per batch",
        "      restart: str (default 'changed') - or 'always': restart a server even when it "
        "is ready and unchanged",
        "      on_failure: str (default 'leave') - or 'rollback': a host whose launch failed "
        "gets its previous script and config back, started again",
        "      qualify: str (default 'off') - or quick|standard|full: 06_qualify after the "
        "launch (in an apply)",
    ]
    return "\n".join(lines)


def cmd_sandbox(args: argparse.Namespace) -> int:
    from opsbook.rehearsal import fleet as fleets
    from opsbook.rehearsal import sandbox

    folder = Path(args.dir)
    if args.hosts is not None or args.multinode or fleets.is_fleet(folder):
        return _cmd_fleet(args, folder)
    if args.action == "up":
        box = sandbox.up(
            folder,
            address=args.address,
            port=args.port,
            shell=args.shell,
            server_port=args.server_port,
            gpu_profile=sandbox.GPU_CHOICES[args.gpus],
            vllm_version=args.vllm_version,
            vllm=args.vllm,
        )
        print(
            f"rehearsal host up: {box.user}@{box.address} port {box.port} (login shell {box.shell})"
        )
        print(*_served(args, box.deployment_path), sep="\n")
        print(f"deployment file: {box.deployment_path}")
        return runner.EXIT_OK
    if args.action == "prepare":
        return _prepare_ray() if args.ray else _prepare_sandbox(args.vllm)
    result = sandbox.down(folder) if args.action == "down" else sandbox.status(folder)
    print(result)
    return runner.EXIT_OK if result.ok else runner.EXIT_PROBLEM


def _served(args: argparse.Namespace, deployment_path: Path, where: str = "") -> list[str]:
    """What a rehearsal host serves: the simulated GPUs and vLLM, or the real vLLM (which
    release, which tiny model, from where) beside the simulated GPUs its preflight sees."""
    if args.vllm != "real":
        return [f"simulated{where}: 8 x {args.gpus} GPUs, vLLM {args.vllm_version}"]
    from opsbook.core.deployment import load_deployment
    from opsbook.rehearsal import real_vllm

    tier = real_vllm.ensure_tier()  # installed by `up` already: this only reads it
    model = Path(load_deployment(deployment_path).model_path)
    return [
        f"real vLLM {tier.version} ({real_vllm.PACKAGE}, on the CPU){where}: "
        f"the tiny model {model.name} at {model}",
        f"simulated{where}: 8 x {args.gpus} GPUs (nvidia-smi only: vLLM runs on the CPU)",
    ]


def _prepare_sandbox(vllm: str) -> int:
    if vllm != "real":
        print("the simulated vLLM needs nothing installed beforehand")
        return runner.EXIT_OK
    from opsbook.rehearsal import real_vllm

    tier = real_vllm.ensure_tier()
    print(f"real vLLM {tier.version} in {tier.venv} (installed in {tier.install_seconds:.0f} s)")
    print(f"tiny models: {tier.models}")
    return runner.EXIT_OK


def _prepare_ray() -> int:
    from opsbook.rehearsal import ray_tier

    tier = ray_tier.ensure_tier()
    print(f"Ray {tier.version} in {tier.venv} (installed in {tier.install_seconds:.0f} s)")
    return runner.EXIT_OK


def _cmd_fleet(args: argparse.Namespace, folder: Path) -> int:
    from opsbook.rehearsal import fleet as fleets
    from opsbook.rehearsal import sandbox

    if args.action == "prepare":
        return _prepare_ray() if args.ray else _prepare_sandbox(args.vllm)
    if args.action == "up" and args.multinode and (args.hosts or 0) < 2:
        print(
            "opsbook: serving one model across nodes needs at least 2 hosts "
            "(remedy: add --hosts 2)",
            file=sys.stderr,
        )
        return runner.EXIT_USAGE
    if args.action == "up":
        fleet = fleets.up(
            folder,
            hosts=args.hosts or 1,
            address=args.address,
            shell=args.shell,
            gpu_profile=sandbox.GPU_CHOICES[args.gpus],
            vllm_version=args.vllm_version,
            vllm=args.vllm,
            multinode=args.multinode,
        )
        for box in fleet.hosts:
            print(f"rehearsal host up: {box.user}@{box.address} port {box.port}")
        print(*_served(args, fleet.deployment_path, " on each"), sep="\n")
        print(f"deployment file: {fleet.deployment_path}")
        return runner.EXIT_OK
    result = fleets.down(folder) if args.action == "down" else fleets.status(folder)
    print(result)
    return runner.EXIT_OK if result.ok else runner.EXIT_PROBLEM


def cmd_cluster(args: argparse.Namespace) -> int:
    """``status``: the nodes the Ray cluster lists; ``stop``: the server on the head, then the
    Ray processes opsbook started on every node (nothing else)."""
    from opsbook.core.deployment import load_deployment
    from opsbook.remote.hosts import HostGroup
    from opsbook.stages import cluster_launch
    from opsbook.steps import cluster

    deployment = load_deployment(args.deployment)
    head = cluster.nodes_of(deployment)[0]
    group = HostGroup.from_deployment(deployment)
    try:
        if args.action == "stop":
            result = cluster_launch.stop_serving(group.hosts, deployment)
        else:
            head_host = next(h for h in group.hosts if h.name == head.host.name)
            result = cluster.status(head_host, deployment)
    finally:
        group.close()
    print(result)
    return runner.EXIT_OK if result.ok else runner.EXIT_PROBLEM


def cmd_lint(args: argparse.Namespace) -> int:
    from opsbook.knowledge.lint import is_empty, lint_result

    if is_empty(args.shell_command):
        raise RunError(
            "nothing to lint: the command is empty (or only comments)",
            remedy="give the command as one quoted word, e.g. "
            "opsbook lint \"ssh gpu 'pkill -f vllm'\"",
        )
    result = lint_result(args.shell_command, paths=args.path)
    print(result)
    for finding in result.findings:
        if finding.remedy:
            print(f"    safer: {finding.remedy}")
    return runner.EXIT_OK if result.ok else runner.EXIT_PROBLEM


def _add_detach_options(run: argparse.ArgumentParser) -> None:
    from opsbook.runner.detach import REPORT_OPTION

    run.add_argument(
        "--detach",
        action="store_true",
        help="run in a session of its own, which survives the terminal and the SSH session; "
        "prints the run folder and PID once the hosts are locked, then returns (follow it with "
        "`opsbook records show RUN --follow`)",
    )
    # The pipe a detached run names its folder on (opsbook.runner.detach); never typed.
    run.add_argument(REPORT_OPTION, type=int, default=None, help=argparse.SUPPRESS)


def _start_detached(args: argparse.Namespace) -> int:
    """``run --detach``: the same command started again in a session of its own; this one
    says where its record goes and returns, or relays its error when it ended first."""
    from opsbook.runner import detach

    if args.detached_report is not None:  # the detached run itself, given --detach again
        args.detach = False
        return cmd_run(args)
    started = detach.start_detached(args.argv)
    if started.folder is None:
        sys.stderr.write(started.said)
        return started.exit_code if started.exit_code is not None else runner.EXIT_TOOL_FAILED
    sys.stdout.write(started.said)
    print(f"detached: PID {started.pid}, in a session of its own (it outlives this terminal)")
    print(f"run folder: {started.folder}")
    print(f"output: {started.folder / detach.CONSOLE_LOG}")
    print(f"follow it: opsbook records show {started.folder} --follow")
    return runner.EXIT_OK


def _detached_reporter(args: argparse.Namespace) -> Callable[[Path], None] | None:
    if args.detached_report is None:
        return None
    from opsbook.runner import detach

    return detach.folder_reporter(args.detached_report)


def cmd_runbook(args: argparse.Namespace) -> int:
    """Exit 0 when the folder holds the runbook's notebooks; 2 when it holds changed copies
    (without --force) or is no folder, nothing copied; 3 when a copy could not be written."""
    from opsbook.runner import runbook

    if args.action == "path":
        print(runbook.notebooks_dir())
        return runner.EXIT_OK
    if not args.folder:
        raise RunError("runbook copy needs a folder", remedy="e.g. `opsbook runbook copy runbook`")
    done = runbook.copy_runbook(Path(args.folder), force=args.force)
    verbs = {name: "copied" for name in done.copied}
    verbs.update({name: "replaced" for name in done.replaced})
    verbs.update({name: "unchanged" for name in done.unchanged})
    for name in sorted(verbs):
        print(f"{verbs[name]:<9} {done.folder / name}")
    print(
        f"{len(done.copied)} copied, {len(done.replaced)} replaced, "
        f"{len(done.unchanged)} unchanged; step through them with: jupyter lab {done.folder}"
    )
    return runner.EXIT_OK


def cmd_diagnose(args: argparse.Namespace) -> int:
    from opsbook.core.exceptions import LogError
    from opsbook.knowledge.logscan import diagnose_stream

    try:
        with _read_log(args.log) as stream:
            diagnosis = diagnose_stream(stream)
    except LogError as e:
        print(f"opsbook: {e}", file=sys.stderr)
        return runner.EXIT_USAGE
    except OpsbookError:
        raise
    except Exception as e:  # a defect of opsbook must not pass for a finding (exit 1)
        raise OpsbookError(
            f"diagnose failed on {args.log}: {type(e).__name__}: {e}",
            remedy="this is a defect of opsbook: report it with the log",
        ) from e
    since = _since_last_good(args) if args.deployment and not diagnosis.ok else []
    if args.json:
        doc = diagnosis.to_dict()
        if args.deployment:
            doc["since_last_good"] = since
        print(json.dumps(doc, indent=2))
    else:
        print(diagnosis.describe(every_source=args.verbose))
        if since:
            TERMINAL.plain("", "SINCE LAST GOOD", *since)
    return runner.EXIT_OK if diagnosis.ok else runner.EXIT_PROBLEM


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan each host's start (or the offline copy's); exit 1 when a start will or may stop."""
    from opsbook.steps import plan

    with without_pydantic_plugins():
        from opsbook.core.deployment import load_deployment

        deployment = load_deployment(args.deployment)
    runs = Path(args.runs_dir)
    if args.offline:
        history = plan.deployment_history(runs, deployment.name)
        found = plan.plan_offline(
            deployment,
            args.model_dir or deployment.model_path,
            args.gpu_memory * 2**20 if args.gpu_memory else None,
            platform=args.platform,
            vllm_version=args.vllm_version,
            history=history,
        )
        print(TERMINAL.capacity_plan(found, "offline"))
        return runner.EXIT_OK if found.ok else runner.EXIT_PROBLEM
    from opsbook.remote.hosts import HostGroup
    from opsbook.runner.execution import limit_hosts

    names = limit_hosts(deployment, args.limit) if args.limit else ()
    group = HostGroup.from_deployment(deployment, names=names)
    ok = True
    try:
        for host in group.hosts:
            record = plan.history_path(runs, deployment.name, host.name)
            found = plan.plan_on_host(host, deployment, record=record, runs_dir=runs)
            print(TERMINAL.capacity_plan(found, host.name))
            ok = ok and found.ok
    finally:
        group.close()
    return runner.EXIT_OK if ok else runner.EXIT_PROBLEM


def _since_last_good(args: argparse.Namespace) -> list[str]:
    """Per host of ``-f``'s deployment, what changed since its last good run."""
    from opsbook.core.deployment import load_deployment
    from opsbook.steps import last_good

    dep = load_deployment(Path(args.deployment))
    found = last_good.since_last_good(Path(args.runs_dir), dep.source, [h.name for h in dep.hosts])
    return last_good.describe_since(found)


def _read_log(name: str) -> BinaryIO:
    """The log as a binary stream: lines are split on ``\n`` only, as ``grep -n`` counts."""
    from opsbook.core.exceptions import LogError

    if name == "-":
        return sys.stdin.buffer
    path = Path(name)
    if path.is_dir():
        raise LogError(f"{path} is a folder, not a log", remedy="give the log file's path")
    try:
        return path.open("rb")
    except OSError as e:
        raise LogError(f"cannot read log {path}: {e.strerror}", remedy="check the path") from None


def _release(text: str) -> str:
    if not re.fullmatch(r"\d+\.\d+\.\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a release number X.Y.Z (e.g. 0.33.0)")
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


DEPLOY_PARAMETERS = ("apply", "serial", "restart", "on_failure", "qualify", "recheck")
# A deploy's first line: whether it changes the hosts (it does unless told not to).
DEPLOY_APPLIES = "deploy: applying changes to the hosts (-p apply false for a dry run)"
DEPLOY_DRY = "deploy: a dry run (-p apply false): nothing on the hosts is changed"


def _deploy_parameters(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``-p apply true|false``, ``-p serial N|N%``, ``-p restart changed|always``,
    ``-p on_failure leave|rollback``, ``-p qualify off|quick|standard|full`` and ``-p recheck
    true|false`` of a deploy, as plain values."""
    unknown = sorted({name for name, _ in pairs} - set(DEPLOY_PARAMETERS))
    if unknown:
        raise RunError(
            f"deploy takes only the parameters {', '.join(DEPLOY_PARAMETERS)}, not "
            f"{', '.join(unknown)}",
            remedy="e.g. -p apply false, -p serial 1 for one host at a time, -p restart "
            "always to restart servers that are ready and unchanged, or -p on_failure rollback",
        )
    params: dict[str, Any] = {}
    for name, text in pairs:
        params[name] = runner.plain_value(name, text, True if name in ("apply", "recheck") else "")
    return params
