"""Running the runbook headless with papermill, into a run folder of its own.

A run folder is named by UTC time, notebook and host (or deployment), and is never overwritten.
It holds the executed notebooks (written even when a cell fails), the journal of remote
commands, the per-host results the notebooks recorded, and ``run.json`` with the exit code.

Each stage notebook runs its stage on every host it is given, in one kernel, fanning out over
threads (:mod:`opsbook.stages`); the runner follows the results file while the notebook runs,
so each host's line is reported as it finishes. ``run_deploy`` goes through the stages, drops
a host from the later stages once it fails, stops when too many hosts failed, and with
``serial`` does it one batch of hosts at a time, stopping at the first batch that fails.
The stages of a deploy share one kernel (:class:`SharedKernel`) and their HTML copies are
exported on a thread of their own while the next stages run.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

from opsbook.core import channel, exceptions
from opsbook.core.exceptions import RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_TOOL_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    TOOL_FAILED,
    HostResult,
    State,
    worst_exit_code,
)
from opsbook.remote.journal import JOURNAL_ENV
from opsbook.runner import records
from opsbook.runner.interrupt import RunInterrupted, quiet_abandoned_tasks, signal_name, signum_of
from opsbook.runner.progress import HEADLESS_ENV

if TYPE_CHECKING:
    from opsbook import stages
    from opsbook.core.deployment import Deployment, HostSpec
    from opsbook.runner import lock as deploylock

# papermill, nbformat, the stages (Fabric, paramiko) and YAML are imported by the functions that use
# them: the CLI imports this module to parse its arguments, and must start in a blink.

__all__ = ["EXIT_OK", "EXIT_PROBLEM", "EXIT_TOOL_FAILED", "EXIT_UNREACHABLE", "EXIT_USAGE"]

OnResult = Callable[[HostResult], None]
OnProgress = Callable[[channel.StageProgress], None]
# How often the runner looks for results the notebook wrote.
FOLLOW_SECONDS = 0.2

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
# As opsbook.remote.hosts.DEFAULT_FORKS, without importing Fabric to read it.
DEFAULT_FORKS = 10


@dataclass
class RunRecord:
    """What one notebook run did and where its record is."""

    folder: Path
    notebook: str
    exit_code: int
    status: str
    message: str
    duration: float
    parameters: dict[str, Any] = field(default_factory=dict)
    results: list[HostResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def executed_notebook(self) -> Path:
        return self.folder / Path(self.notebook).name


def find_notebook(name: str) -> Path:
    """A notebook by path, or by stage name (``00_preflight``, ``preflight``) in notebooks/.

    Raises:
        RunError: no such notebook.
    """
    path = Path(name)
    if path.is_file():
        return path
    candidates = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) + sorted(Path("notebooks").glob("*.ipynb"))
    stem = path.stem
    for nb in candidates:
        if nb.stem == stem or nb.stem.split("_", 1)[-1] == stem:
            return nb
    known = ", ".join(sorted({nb.stem for nb in candidates})) or "none found"
    raise RunError(f"no notebook named {name!r}", remedy=f"use a path or one of: {known}")


def check_parameters(notebook: Path, parameters: Mapping[str, Any]) -> None:
    """Refuse parameter names the notebook does not declare (papermill only warns).

    Raises:
        RunError: a name is unknown.
    """
    import papermill

    declared = set(papermill.inspect_notebook(str(notebook)))
    unknown = sorted(set(parameters) - declared)
    if unknown:
        raise RunError(
            f"{notebook.name} has no parameter(s) {', '.join(unknown)}",
            remedy=f"its parameters are: {', '.join(sorted(declared)) or 'none'}",
        )


# Parameters the runner sets itself; `-p` may not give them (the deployment comes from -f).
RUNNER_PARAMETERS = {"deployment": "-f FILE"}
TRUE_WORDS = ("true",)
FALSE_WORDS = ("false",)
INTEGER = re.compile(r"[+-]?[0-9]+")
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def typed_parameters(notebook: Path, raw: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as the values the notebook declares: each VALUE is converted to
    the type of the parameter's default in the notebook's parameters cell (bool, int, float,
    str, or a list of strings given comma-separated), never parsed as YAML or Python.

    Raises:
        RunError: a name is unknown or set by the runner, or a value does not fit its type.
    """
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    values = {}
    for name, text in raw:
        if name in RUNNER_PARAMETERS:
            raise RunError(
                f"the parameter {name} is set by opsbook run itself",
                remedy=f"give it as {RUNNER_PARAMETERS[name]}, not -p {name}",
            )
        if name not in declared:
            check_parameters(notebook, {name: text})
        values[name] = plain_value(name, text, _declared_default(declared[name]))
    return values


def _declared_default(parameter: Mapping[str, Any]) -> Any:
    """The default a parameters cell gives (a Python literal), or None when it is an
    expression."""
    try:
        return ast.literal_eval(str(parameter.get("default", "")))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def plain_value(name: str, text: str, default: Any) -> Any:
    """``text`` as a value of the type of ``default``: ``true``/``false`` (any case) for a bool,
    a whole number for an int, a number for a float, the text itself for a str, the
    comma-separated items for a list.

    Raises:
        RunError: the text does not fit, or the parameter has no literal default.
    """
    if isinstance(default, bool):
        word = text.strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise _misfit(name, text, "true or false", f"-p {name} true")
    if isinstance(default, int):
        if INTEGER.fullmatch(text.strip()):
            return int(text)
        raise _misfit(name, text, "a whole number", f"-p {name} {default}")
    if isinstance(default, float):
        if NUMBER.fullmatch(text.strip()):
            return float(text)
        raise _misfit(name, text, "a number", f"-p {name} {default}")
    if isinstance(default, str):
        return text
    if isinstance(default, list):
        return [item.strip() for item in text.split(",") if item.strip()]
    raise RunError(
        f"the parameter {name} cannot be given on the command line",
        remedy="set it in the deployment file or the notebook",
    )


def _misfit(name: str, text: str, expected: str, example: str) -> RunError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return RunError(f"-p {name} {shown!r}: expected {expected}", remedy=f"write e.g. {example}")


def new_run_folder(runs_dir: Path, name: str, host: str) -> Path:
    """Create ``runs_dir/<UTC time>-<notebook>-<host>``; a taken name gets a suffix."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    # Absolute: the notebook's kernel runs in notebooks/ and writes the journal here.
    runs_dir = runs_dir.resolve()
    base = runs_dir / f"{stamp}-{name}-{safe_host}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            # Private to the operator: the journal names hosts, users and their processes.
            folder.mkdir(mode=records.FOLDER_MODE)
            folder.chmod(records.FOLDER_MODE)
            return folder
        except FileExistsError:
            continue
    raise RunError(f"could not create a new run folder under {runs_dir}")


def run_notebook(
    notebook: str | Path,
    deployment: str | Path,
    parameters: Mapping[str, Any] | None = None,
    runs_dir: str | Path = "runs",
    timeout: float | None = None,
    stage_timeout: float | None = None,
    *,
    forks: int = DEFAULT_FORKS,
    on_result: OnResult | None = None,
    on_progress: OnProgress | None = None,
) -> RunRecord:
    """Execute one runbook notebook against a deployment and file the run.

    Args:
        notebook: a path or a stage name.
        deployment: the deployment file (passed to the notebook as ``deployment``).
        parameters: further notebook parameters; unknown names are refused.
        runs_dir: where run folders are made.
        timeout: seconds a single cell may run.
        stage_timeout: seconds the whole notebook may run.
        forks: how many hosts a stage notebook works on at once.
        on_result: called with each host's result as the notebook records it.
        on_progress: called with the steps long stages reach on each host.

    Raises:
        RunError: the notebook or a parameter is unknown.
        DeploymentError: the deployment file is unusable.
        HostLocked: the notebook changes hosts and another run holds one of them.
    """
    nb_path = find_notebook(str(notebook))
    given = dict(parameters or {})
    for name, flag in RUNNER_PARAMETERS.items():
        if name in given:
            raise RunError(
                f"the parameter {name} is set by opsbook run itself",
                remedy=f"give it as {flag}, not as a notebook parameter",
            )
    deployment_path = Path(deployment).resolve()
    from opsbook.core.deployment import load_deployment

    dep = load_deployment(deployment_path)
    params = {"deployment": str(deployment_path), **given}
    if _stages().for_notebook(nb_path.stem) is not None:
        params.setdefault("forks", forks)
    check_parameters(nb_path, params)
    if isinstance(params.get("hosts"), list):  # before a run folder or a kernel: bad input
        from opsbook.stages.base import known_hosts

        known_hosts(dep, params["hosts"])
    folder = new_run_folder(Path(runs_dir), nb_path.stem, run_label(dep))
    redactor = Redactor(dep.secret_values())
    started = time.monotonic()
    locks = _lock_for(_stages().for_notebook(nb_path.stem), dep, folder, params)
    try:
        record = execute_stage(
            nb_path,
            folder,
            params,
            redactor,
            timeout,
            stage_timeout,
            on_result,
            on_progress=on_progress,
        )
    except (RunInterrupted, KeyboardInterrupt) as e:
        quiet_abandoned_tasks()
        record = _interrupted_record(folder, nb_path, params, redactor, started, signum_of(e))
    finally:
        locks.release()
    record.message = "; ".join([*locks.notes, record.message])
    _recreate_lost_folder(folder)
    with records.private_files():
        _write_run_json(folder, record)
    return record


@dataclass
class CheckRecord:
    """What a health check found on each host; nothing is filed (``--record`` files the
    diagnose notebook instead)."""

    exit_code: int
    status: str
    message: str
    duration: float
    results: list[HostResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def check_servers(
    deployment: str | Path,
    *,
    forks: int = DEFAULT_FORKS,
    on_result: OnResult | None = None,
) -> CheckRecord:
    """The scheduled health check: the diagnose stage on every host of the deployment, in this
    process, over one SSH connection and one status probe per host; no kernel, no notebook,
    no run folder. The verdict and the exit code are those of ``run_notebook("05_diagnose")``,
    which is the same check with a record.

    Raises:
        DeploymentError: the deployment file is unusable.
    """
    from opsbook.core.deployment import load_deployment

    started = time.monotonic()
    dep = load_deployment(Path(deployment).resolve())
    stages = _stages()
    done = stages.run_stage(
        stages.DIAGNOSE, dep, forks=forks, on_result=on_result, log_when_ready=False
    )
    code, message = _verdict(done.results, None)
    return CheckRecord(
        exit_code=code,
        status=STATUS[code],
        message=Redactor(dep.secret_values()).redact(message),
        duration=round(time.monotonic() - started, 2),
        results=done.results,
    )


def _lock_for(
    stage: stages.Stage | None, dep: Deployment, folder: Path, params: Mapping[str, Any]
) -> deploylock.Locks:
    """The deploy locks of the hosts a stage that changes them works on (none for a stage
    that only reads); a held host refuses the run before it begins.

    Raises:
        HostLocked: another run holds one of the hosts (the empty run folder is removed).
    """
    deploylock = _deploylock()
    if stage is None or not stage.changes_host:
        return deploylock.Locks()
    hosts = params.get("hosts") or ()
    names = [hosts] if isinstance(hosts, str) else [str(h) for h in hosts]
    try:
        return deploylock.acquire(dep, folder, names)
    except (exceptions.HostLocked, RunInterrupted, KeyboardInterrupt):
        folder.rmdir()
        raise


def _interrupted_record(
    folder: Path,
    nb_path: Path,
    params: Mapping[str, Any],
    redactor: Redactor,
    started: float,
    signum: int,
) -> RunRecord:
    redact_notebook(folder / nb_path.name, redactor)
    return RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=128 + signum,
        status="interrupted",
        message=f"interrupted by {signal_name(signum)}: the notebook was stopped",
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
    )


def run_label(deployment: Deployment) -> str:
    """What a run folder is named after: the host, or the deployment when it has several."""
    return deployment.host.address if len(deployment.hosts) == 1 else deployment.name


def execute_stage(
    nb_path: Path,
    folder: Path,
    params: Mapping[str, Any],
    redactor: Redactor,
    timeout: float | None = None,
    stage_timeout: float | None = None,
    on_result: OnResult | None = None,
    journal: Path | None = None,
    on_progress: OnProgress | None = None,
    kernel: SharedKernel | None = None,
) -> RunRecord:
    """Run one notebook with papermill into ``folder``; the notebook is written even when a
    cell fails, and the journal and per-host results go next to it.

    Args:
        nb_path: the notebook.
        folder: the run folder.
        params: its parameters.
        redactor: masks secrets in what is filed.
        timeout: seconds a cell may run.
        stage_timeout: seconds the whole notebook may run (enforced from the main thread).
        on_result: called with each host's result while the notebook runs.
        journal: where the remote commands are journalled (default: ``journal.jsonl`` in
            ``folder``).
        on_progress: called with the steps long stages reach on each host.
        kernel: a kernel the stages of a run share (a fresh kernel per notebook without it).
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from opsbook.runner import engine

    output = folder / nb_path.name
    results_file = folder / f"{nb_path.stem}.results.jsonl"
    started = time.monotonic()
    env = {
        JOURNAL_ENV: str(journal or folder / "journal.jsonl"),
        channel.OUTCOME_ENV: str(results_file),
        HEADLESS_ENV: "1",
    }
    if kernel is not None:  # the stages that share the kernel share its SSH connections
        from opsbook.remote.hosts import KEEP_CONNECTIONS_ENV

        env[KEEP_CONNECTIONS_ENV] = "1"
    failure: tuple[int, str] | None = None
    with _following(results_file, on_result, on_progress) as results:
        try:
            with _environment(env), _deadline(stage_timeout), records.private_files():
                shared = _kernel_options(kernel, env, folder / KERNEL_LOG)
                papermill.execute_notebook(
                    str(nb_path),
                    str(output),
                    parameters=dict(params),
                    engine_name=engine.register(),
                    progress_bar=False,
                    cwd=str(nb_path.parent),
                    execution_timeout=timeout,
                    **shared,
                )
        except PapermillExecutionError as e:
            failure = exit_code_for(e.ename), f"cell {e.exec_count} raised {e.ename}: {e.evalue}"
        except StageTimeout:
            message = f"the stage ran longer than {stage_timeout:g} s and was stopped"
            failure = EXIT_TOOL_FAILED, message
        except Exception as e:  # a dead kernel or a broken notebook still gets a record
            failure = EXIT_TOOL_FAILED, f"the notebook could not run: {type(e).__name__}: {e}"
    if failure is not None and kernel is not None:
        kernel.discard()  # a kernel that a cell failed or a deadline stopped is not reused
    code, message = _verdict(results, failure)
    # The run folder may be deleted while the stage runs: the deploy reports that itself, so
    # what was to be redacted is gone with it rather than a traceback.
    with contextlib.suppress(FileNotFoundError):
        redact_notebook(output, redactor)
        if kernel is None:  # a shared kernel's log is redacted when the run ends
            redact_text_file(folder / KERNEL_LOG, redactor)
    return RunRecord(
        folder=folder,
        notebook=nb_path.name,
        exit_code=code,
        status=STATUS[code],
        message=redactor.redact(message),
        duration=round(time.monotonic() - started, 2),
        parameters={k: redactor.redact(str(v)) for k, v in params.items()},
        results=results,
    )


def _verdict(results: list[HostResult], failure: tuple[int, str] | None) -> tuple[int, str]:
    """A notebook run's exit code (its worst host's, or the failure of the notebook itself)
    and message (the problems, host by host when there are several)."""
    codes = [worst_exit_code(results)] + ([failure[0]] if failure else [])
    code = max(codes, key=(EXIT_OK, EXIT_PROBLEM, EXIT_TOOL_FAILED, EXIT_UNREACHABLE).index)
    several = len({r.host for r in results}) > 1
    problems = [r for r in results if r.exit_code != EXIT_OK]
    shown = [f"{r.host}: {r.message}" if several else r.message for r in problems or results]
    if failure:
        shown.insert(0, failure[1])
    return code, "; ".join(shown) or "the notebook ran (it records no result)"


@contextlib.contextmanager
def _following(
    path: Path, on_result: OnResult | None, on_progress: OnProgress | None
) -> Iterator[list[HostResult]]:
    """Collect the results written to ``path`` while the body runs, reporting each to
    ``on_result`` (and each progress line to ``on_progress``) as it appears; the list is
    complete when the body is done."""
    follower = channel.Follower(path)
    results: list[HostResult] = []
    done = threading.Event()

    def take() -> None:
        for record in follower.new():
            if isinstance(record, HostResult):
                results.append(record)
                if on_result is not None:
                    on_result(record)
            elif on_progress is not None:
                on_progress(record)

    def loop() -> None:
        while not done.wait(FOLLOW_SECONDS):
            take()

    thread = threading.Thread(target=loop, name="opsbook-results", daemon=True)
    thread.start()
    try:
        yield results
    finally:
        done.set()
        thread.join()
        take()


def redact_notebook(path: Path, redactor: Redactor) -> None:
    """Mask secrets in every cell and output of an executed notebook, in place.

    The library redacts what it logs, but a table a notebook displays is the host's own text
    (a command line with an API key, say): the record is the last place to catch it.
    """
    if not path.exists():
        return
    import nbformat

    # papermill checked the schema when it wrote the file a moment ago: read it as JSON.
    nb = nbformat.v4.reads(path.read_text(encoding="utf-8"))
    changed = False

    def redact(text: str) -> str:
        nonlocal changed
        masked = redactor.redact(text)
        changed = changed or masked != text
        return masked

    for cell in nb.cells:
        cell.source = redact(cell.source)
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = redact(out["text"])
            if "traceback" in out:
                out["traceback"] = [redact(line) for line in out["traceback"]]
            if "evalue" in out:
                out["evalue"] = redact(out["evalue"])
            for mime, value in out.get("data", {}).items():
                if isinstance(value, str):
                    out["data"][mime] = redact(value)
    if changed:  # most records hold no secret: they are left as papermill wrote them
        nbformat.write(nb, path)


def redact_text_file(path: Path, redactor: Redactor) -> None:
    """Mask secrets in a text file of the run folder (the kernel's log), in place."""
    if path.exists():
        path.write_text(redactor.redact(path.read_text(errors="replace")))


BATCH_PREFIX = "batch-"
# The stage kernels' own log in the run folder (opsbook.runner.kernel keeps it off the terminal).
KERNEL_LOG = "kernel.log"


def _kernel_options(
    kernel: SharedKernel | None, env: Mapping[str, str], log_path: Path
) -> dict[str, Any]:
    """papermill's kernel options: the deploy's shared kernel (with the stage's environment
    for the notebook's client to set in it), or a quiet one of its own."""
    if kernel is not None:
        return {"km": kernel.ready(log_path), "environment": dict(env)}
    from opsbook.runner.kernel import quiet_kernel_manager

    return {"kernel_manager_class": quiet_kernel_manager(log_path)}


# What the deploy's stage notebooks import (their first cells, and the stage modules the
# registry imports on first use): 0.7 s of the kernel's CPU, spent while the run prepares.
WARM_UP = "import opsbook.widgets, opsbook.stages\nopsbook.stages.import_runbook()"
# Before the imports: the first stage's hosts' SSH handshakes, while the run takes its locks
# (a host that fails is the first stage's to report).
OPEN_AHEAD = """
try:
    import opsbook.remote.hosts
    from opsbook.core.deployment import HostSpec
    opsbook.remote.hosts.open_ahead([HostSpec(**fields) for fields in {fields!r}], {forks!r})
except Exception:
    pass
"""
WARM_UP_TIMEOUT = 60.0


class SharedKernel:
    """One Python kernel for the stage notebooks of a deploy run, started by the first stage
    and handed to the next ones: a kernel start and opsbook's imports are paid once per run,
    not once per stage. Each notebook still runs top to bottom from its own parameters; before
    each, the kernel's environment is set to that stage's (results file, journal). A stage
    that fails or runs past its deadline discards the kernel: the next starts a fresh one.
    """

    def __init__(self) -> None:
        self.km: Any = None
        self._warming: Any = None

    def start(
        self, log_path: Path, cwd: Path, hosts: Sequence[HostSpec] = (), forks: int = 1
    ) -> None:
        """Start the kernel now, without waiting for it: it boots, opens the SSH connections
        of ``hosts`` and imports what the stages import, while the run imports papermill and
        prepares its first stage, which then finds it running."""
        from jupyter_core.utils import run_sync

        from opsbook.runner.kernel import quiet_kernel_manager

        self.km = quiet_kernel_manager(log_path)(kernel_name="python3")
        run_sync(self.km.start_kernel)(cwd=str(cwd))
        # Sent now, its reply awaited by the first stage (ready()).
        client = self.km.client()
        client.start_channels()  # no heartbeat (kernel.PromptKernelClient.start_channels)
        fields = [asdict(spec) for spec in hosts]
        code = (OPEN_AHEAD.format(fields=fields, forks=forks) if hosts else "") + WARM_UP
        self._warming = (client, client.execute(code, silent=True, store_history=False))

    def ready(self, log_path: Path) -> Any:
        """The kernel manager for the next notebook: not started yet (papermill starts it
        with this process's environment; it is quiet and logs to ``log_path``), or running
        (the notebook's client sets the stage's environment in it: ``engine.ClosingClient``)."""
        from jupyter_core.utils import run_sync

        from opsbook.runner.kernel import quiet_kernel_manager

        if self.km is not None and self.km.has_kernel:
            # The clients of one kernel manager share a ZMQ identity: the warm-up's must be
            # closed before another connects, or the kernel answers the wrong one.
            run_sync(self._finish_warming)()
            return self.km
        self.km = quiet_kernel_manager(log_path)(kernel_name="python3")
        return self.km

    def discard(self) -> None:
        """Shut the kernel down, if one runs; the next stage starts a new one."""
        from jupyter_core.utils import run_sync

        if self._warming is not None:
            self._warming[0].stop_channels()
            self._warming = None
        km, self.km = self.km, None
        if km is not None and km.has_kernel:
            with contextlib.suppress(Exception):  # a kernel already gone is what we want
                run_sync(km.shutdown_kernel)(now=True)

    async def _finish_warming(self) -> None:
        """Wait for the warm-up's reply (the kernel has imported the stages), then close its
        client."""
        if self._warming is None:
            return
        (client, msg_id), self._warming = self._warming, None
        deadline = time.monotonic() + WARM_UP_TIMEOUT
        try:
            while time.monotonic() < deadline:
                reply = await client.shell_channel.get_msg(timeout=deadline - time.monotonic())
                if reply["parent_header"].get("msg_id") == msg_id:
                    return
        except Empty:
            return  # a kernel that never answered is found out by the next request
        finally:
            client.stop_channels()


def _deploylock() -> Any:
    from opsbook.runner import lock as deploylock

    return deploylock


def _stages() -> Any:
    from opsbook import stages

    return stages


def __getattr__(name: str) -> Any:
    # The notebooks of the deploy stages, read from the registry on first use.
    if name == "DEPLOY_STAGES":
        return tuple(s.notebook for s in _stages().DEPLOY)
    if name == "DIAGNOSE_STAGE":
        return str(_stages().DIAGNOSE.notebook)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plan_batches(hosts: Sequence[str], serial: int | str | None) -> list[list[str]]:
    """The hosts in batches for a rolling run: ``serial`` hosts at a time (a count, or a
    percentage such as ``"25%"``); all at once when it is empty or 0.

    Raises:
        RunError: ``serial`` is neither a positive count nor a percentage.
    """
    if serial in (None, "", 0):
        return [list(hosts)]
    text = str(serial).strip()
    try:
        if text.endswith("%"):
            percent = int(text[:-1])
            size = max(1, len(hosts) * percent // 100) if percent > 0 else 0
        else:
            size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise RunError(
            f"serial must be a number of hosts or a percentage, not {serial!r}",
            remedy="e.g. -p serial 1, -p serial 2 or -p serial 25%",
        )
    return [list(hosts[i : i + size]) for i in range(0, len(hosts), size)]


def too_many_failed(results: Sequence[HostResult], total: int, percentage: float | None) -> bool:
    """Ansible's ``max_fail_percentage``: more than ``percentage`` of the hosts failed or were
    unreachable."""
    if percentage is None or total == 0:
        return False
    bad = {r.host for r in results if r.state in (State.FAILED, State.UNREACHABLE)}
    return len(bad) * 100 / total > percentage


@dataclass
class _DeployRun:
    """What a deploy run collects as it goes."""

    deployment: Path
    folder: Path
    redactor: Redactor
    apply: bool
    forks: int
    limits: tuple[float | None, float | None]
    on_result: OnResult | None
    on_progress: OnProgress | None
    results: list[HostResult] = field(default_factory=list)
    notebooks: list[records.NotebookEntry] = field(default_factory=list)
    stopped: str = ""
    kernel: SharedKernel = field(default_factory=SharedKernel)
    # The HTML copies, exported by a helper process while the next stages run.
    html: records.HtmlExports = field(default_factory=records.HtmlExports)
    pages: list[Future[Path | None]] = field(default_factory=list)
    # Deploy-lock notes (a stale lock taken over), and the signal that interrupted the run.
    notes: list[str] = field(default_factory=list)
    interrupted: int = 0


def run_deploy(
    deployment: str | Path,
    runs_dir: str | Path = "runs",
    *,
    apply: bool = True,
    timeout: float | None = None,
    stage_timeout: float | None = None,
    forks: int = DEFAULT_FORKS,
    max_fail_percentage: float | None = None,
    serial: int | str | None = None,
    on_result: OnResult | None = None,
    on_progress: OnProgress | None = None,
) -> RunRecord:
    """The whole runbook on every host of a deployment, into one run folder: the stages 00 to
    04 in order, a host dropped from the later stages once it fails, then 05_diagnose on every
    reachable host; an HTML copy of each notebook, ``summary.json`` and ``index.html`` with a
    host x stage grid. The folder is made read-only when the run ends.

    Args:
        deployment: the deployment file.
        runs_dir: where run folders are made.
        apply: passed to the stages that change the host; False makes the run a rehearsal
            in which a host with something to change is reported "would change".
        timeout: seconds a single cell may run.
        stage_timeout: seconds each stage may run.
        forks: how many hosts a stage works on at once.
        max_fail_percentage: stop the run once more than this share of hosts failed.
        serial: a rolling run: this many hosts (or this percentage) at a time, each batch
            through all the stages before the next; the run stops at the first batch in which
            a host fails, and the hosts of later batches are left untouched.
        on_result: called with each host's result of each stage as it finishes.
        on_progress: called with the steps long stages reach on each host.

    Raises:
        DeploymentError: the deployment file is unusable.
        RunError: ``serial`` is not a count or a percentage.
        HostLocked: another deploy run holds a host (``opsbook.runner.lock``); nothing was done.
    """
    deployment_path = Path(deployment).resolve()
    from opsbook.core.deployment import load_deployment

    dep = load_deployment(deployment_path)
    names = [h.name for h in dep.hosts]
    batches = plan_batches(names, serial)
    folder = new_run_folder(Path(runs_dir), "deploy", run_label(dep))
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    run = _DeployRun(
        deployment_path,
        folder,
        Redactor(dep.secret_values()),
        apply,
        forks,
        (timeout, stage_timeout),
        on_result,
        on_progress,
    )
    # The kernel boots (and imports the stages) while the locks are taken and papermill is
    # imported; the notebooks of a deploy are preflight's neighbours.
    first = [h for h in dep.hosts if h.name in batches[0]] if batches else []
    run.kernel.start(folder / KERNEL_LOG, find_notebook("preflight").parent, first, forks)
    try:
        locks = _deploylock().acquire(dep, folder)
    except (exceptions.HostLocked, RunInterrupted, KeyboardInterrupt):
        run.kernel.discard()
        # Made a moment ago, holding only the kernel's log: no record of a run that never began.
        (folder / KERNEL_LOG).unlink(missing_ok=True)
        folder.rmdir()
        raise
    run.notes = locks.notes
    try:
        run.html.start()
        _deploy_batches(run, batches, names, max_fail_percentage)
    except (RunInterrupted, KeyboardInterrupt) as e:
        quiet_abandoned_tasks()
        run.interrupted = signum_of(e)
        run.stopped = f"interrupted by {signal_name(run.interrupted)}: the run was stopped"
        # The stage cut short never reached its own redaction.
        for notebook in folder.rglob("*.ipynb"):
            redact_notebook(notebook, run.redactor)
    finally:
        # The last HTML copy is made while the locks go and the kernel is shut down.
        closing = threading.Thread(target=run.html.close, name="opsbook-html-close")
        closing.start()
        try:
            locks.release()
            run.kernel.discard()
        finally:
            closing.join()
        # The kernels are done writing their logs (the shared one in the run folder, one
        # started after a failed stage in its batch folder).
        for log in folder.rglob(KERNEL_LOG):
            with contextlib.suppress(FileNotFoundError):  # a folder deleted during the run
                redact_text_file(log, run.redactor)
    pages = [page.result() for page in run.pages]
    run.notebooks = [
        replace(entry, html=str(page.relative_to(folder)) if page else None)
        for entry, page in zip(run.notebooks, pages, strict=True)
    ]
    run.results = _with_skipped(run.results, names, run.stopped)
    return _file_deploy(run, dep, started_at, time.monotonic() - started, serial)


def _deploy_batches(
    run: _DeployRun, batches: list[list[str]], names: list[str], max_fail: float | None
) -> None:
    for number, batch in enumerate(batches, start=1):
        where = run.folder if len(batches) == 1 else run.folder / f"{BATCH_PREFIX}{number:02d}"
        where.mkdir(exist_ok=True)
        _deploy_batch(run, batch, where, len(names), max_fail)
        failed = [r.host for r in run.results if r.host in batch and not r.state.goes_on]
        if run.stopped:
            break
        if failed and number < len(batches):
            run.stopped = (
                f"batch {number} of {len(batches)} failed on {', '.join(dict.fromkeys(failed))}: "
                "the hosts of later batches were left untouched"
            )
            break
    unreachable = {r.host for r in run.results if r.state is State.UNREACHABLE}
    diagnosed = [n for n in names if n not in unreachable]
    if diagnosed and run.folder.is_dir():
        _run_stage(run, _stages().DIAGNOSE, diagnosed, run.folder)


def _deploy_batch(
    run: _DeployRun, batch: list[str], where: Path, total: int, max_fail: float | None
) -> None:
    active = list(batch)
    for stage in _stages().DEPLOY:
        if not active:
            return
        results = _run_stage(run, stage, active, where)
        active = [r.host for r in results if r.state.goes_on]
        if not run.folder.is_dir():
            run.stopped = "the run folder was deleted during the run: the later stages were not run"
            return
        if too_many_failed(run.results, total, max_fail):
            run.stopped = f"more than {max_fail:g}% of the hosts failed: the run was stopped"
            return


def _run_stage(
    run: _DeployRun, stage: stages.Stage, hosts: list[str], where: Path
) -> list[HostResult]:
    nb_path = find_notebook(stage.notebook)
    params: dict[str, Any] = {"deployment": str(run.deployment), "hosts": hosts, "forks": run.forks}
    import papermill

    if "apply" in papermill.inspect_notebook(str(nb_path)):
        params["apply"] = run.apply
    journal = run.folder / "journal.jsonl"
    record = execute_stage(
        nb_path,
        where,
        params,
        run.redactor,
        *run.limits,
        run.on_result,
        journal=journal,
        on_progress=run.on_progress,
        kernel=run.kernel,
    )
    results = _complete(record, stage, hosts, run.on_result)
    run.results += results
    run.pages.append(run.html.submit(record.executed_notebook))
    run.notebooks.append(
        records.NotebookEntry(
            stage=stage.name,
            notebook=str(record.executed_notebook.relative_to(run.folder)),
            html=None,  # filled in from run.pages when the exports are done
            hosts=tuple(hosts),
            exit_code=record.exit_code,
            message=record.message,
            duration=record.duration,
        )
    )
    return results


def _complete(
    record: RunRecord, stage: stages.Stage, hosts: list[str], on_result: OnResult | None
) -> list[HostResult]:
    """The stage's result for each host it was given: a host the notebook recorded nothing for
    (a cell raised before or after the fan-out) gets the notebook's failure as its result."""
    by_host = {r.host: r for r in record.results if r.stage == stage.name}
    results = []
    for host in hosts:
        result = by_host.get(host)
        if result is None:
            state = State.UNREACHABLE if record.exit_code == EXIT_UNREACHABLE else State.FAILED
            result = HostResult(host, stage.name, state, record.message, failure_id=TOOL_FAILED)
            if on_result is not None:
                on_result(result)
        results.append(result)
    return results


def _with_skipped(results: list[HostResult], names: list[str], stopped: str) -> list[HostResult]:
    """Every host x stage of the run: a pair with no result is skipped, saying why."""
    done = {(r.host, r.stage) for r in results}
    filled = list(results)
    for host in names:
        mine = [r for r in results if r.host == host]
        reason = next(
            (f"not run: {r.state.value} at {r.stage}" for r in mine if not r.state.goes_on),
            f"not run: {stopped}" if stopped else "not run",
        )
        for stage in _stages().STAGES:
            if (host, stage.name) not in done:
                filled.append(HostResult(host, stage.name, State.SKIPPED, reason))
    return filled


def _file_deploy(
    run: _DeployRun, dep: Deployment, started_at: str, duration: float, serial: Any
) -> RunRecord:
    code = 128 + run.interrupted if run.interrupted else worst_exit_code(run.results)
    problems = [r for r in run.results if r.exit_code != EXIT_OK]
    if problems:
        first = problems[0]
        message = f"{len({r.host for r in problems})} of {len(dep.hosts)} host(s) not ok; " + (
            f"{first.host} {first.state.value} at {first.stage}: {first.message}"
        )
    elif run.interrupted:
        message = f"{len(run.notebooks)} stage(s) had finished, with no problem found"
    else:
        message = f"all {len(dep.hosts)} host(s) ok"
    if run.stopped:
        message = f"{run.stopped}; {message}"
    lost = _recreate_lost_folder(run.folder)
    if lost and not run.interrupted:
        code = EXIT_TOOL_FAILED  # the record is incomplete: never "ok"
    message = "; ".join([*run.notes, *([lost] if lost else []), message])
    summary = RunRecord(
        folder=run.folder,
        notebook="deploy",
        exit_code=code,
        status=STATUS.get(code, "interrupted"),
        message=run.redactor.redact(message),
        duration=round(duration, 2),
        parameters={
            "deployment": str(run.deployment),
            "apply": str(run.apply),
            "serial": str(serial or ""),
            "forks": str(run.forks),
        },
        results=run.results,
    )
    doc = records.RunSummary(
        name=dep.name,
        deployment=str(run.deployment),
        started=started_at,
        status=summary.status,
        exit_code=code,
        message=summary.message,
        duration=summary.duration,
        parameters=summary.parameters,
        hosts=[h.name for h in dep.hosts],
        stages=[s.name for s in _stages().STAGES],
        results=run.results,
        notebooks=run.notebooks,
    )
    with records.private_files():
        _write_run_json(run.folder, summary)
        records.write_summary(run.folder, doc)
    records.close(run.folder)
    return summary


def _recreate_lost_folder(folder: Path) -> str:
    """A run folder deleted during the run is made again, so the results held in memory are
    still filed; the note says what was lost with it."""
    if folder.is_dir():
        return ""
    folder.mkdir(parents=True, exist_ok=True)
    return (
        f"the run folder {folder} was deleted during the run and made again with the results "
        "held in memory (the executed notebooks and journal written before it are lost)"
    )


def _write_run_json(folder: Path, record: RunRecord) -> None:
    doc = {
        **{k: v for k, v in asdict(record).items() if k != "results"},
        "results": [channel.to_dict(r) for r in record.results],
    }
    (folder / "run.json").write_text(json.dumps(doc, default=str, indent=2) + "\n")


STATUS = {
    EXIT_OK: "ok",
    EXIT_PROBLEM: "problem found",
    EXIT_USAGE: "usage error",
    EXIT_TOOL_FAILED: "tool failed",
    EXIT_UNREACHABLE: "host unreachable",
}


def exit_code_for(ename: str) -> int:
    """The exit code for an exception a notebook cell raised, by its class name."""
    cls = getattr(exceptions, ename, None)
    if isinstance(cls, type) and issubclass(cls, exceptions.HostUnreachable):
        return EXIT_UNREACHABLE
    return EXIT_TOOL_FAILED


class StageTimeout(Exception):
    """Raised inside a stage that ran past its deadline."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    # SIGALRM interrupts the wait for the kernel; papermill has saved every finished cell,
    # and nbclient shuts the kernel down on the way out.
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise StageTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    # The kernel papermill starts inherits this process's environment.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
