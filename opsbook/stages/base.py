"""A stage as a unit over a set of hosts: its per-host function, the bounded fan-out, and the
typed per-host results it ends with.

A stage module (``preflight``, ``download``...) wraps the library functions of its step in one
function ``run(host, deployment, options) -> Report`` for one host, where ``options`` is the
module's ``Options``: a frozen dataclass whose fields, with their types and defaults, are the
stage's options. Its notebook's ``parameters`` cell declares them (with ``deployment``, ``hosts``
and ``forks``, :class:`Targets`), the notebook's form shows them, and ``opsbook run -p`` values are
typed by them (:func:`parameters_of`); a field made with :func:`hook` is set by a caller in its
own process (a callback) and is none of those. :func:`run_stage` runs it on
every host of a deployment, ``forks`` at a time; each host's
:class:`~opsbook.core.results.HostResult`
is recorded the moment it is done (:func:`opsbook.core.channel.record_host`), so ``opsbook run``
prints it as it happens. An unreachable host is a result, not an exception.
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opsbook.core import channel
from opsbook.core.deployment import Deployment
from opsbook.core.diffs import Diff
from opsbook.core.exceptions import HostUnreachable, OpsbookError, RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import TOOL_FAILED, Finding, HostResult, Result, State, Table, host_anchor
from opsbook.remote.hosts import DEFAULT_FORKS, HostGroup
from opsbook.remote.protocol import RemoteHost

if TYPE_CHECKING:
    from opsbook.steps.host_facts import RunReadings


@dataclass
class Report:
    """What a stage did on one host, before it is timed and named.

    Args:
        state: how it ended.
        verdict: its result (message and findings).
        shows: what the notebook displays in the host's section (tables, charts, results).
        failure_id: the catalogue id of the failure, when one is known.
        script_sha256: the launch script's hash, when the stage knows which one runs.

    A stage whose evidence other code reads (a cluster's check that compares its nodes, a
    notebook's button that picks hosts) returns a subclass of its own with that evidence as a
    typed field (``preflight.PreflightReport.facts``...), found by ``isinstance``.
    """

    state: State
    verdict: Result
    shows: list[Any] = field(default_factory=list)
    failure_id: str = ""
    script_sha256: str = ""


# One host, its deployment and the stage's options in, the host's report out.
StageFunction = Callable[[Any, Deployment, Any], Report]
# A stage over a whole cluster (a deployment with a ``cluster`` section): the group's hosts,
# the whole deployment and the stage's options in, one report per host name out.
ClusterFunction = Callable[[Sequence[Any], Deployment, Any], dict[str, Report]]
# A stage's look across its hosts once each has its report (hosts serving one model side by
# side): the hosts (open on a cluster's run, closed on a fleet's), the whole deployment and the
# reports in; the reports amended (a finding added, a state changed) and what the stage shows
# of the hosts together out (see Together).
HostsFunction = Callable[[Sequence[Any], Deployment, dict[str, Report]], "Together"]
# The metadata key that marks a field of a stage's options as a hook (see hook()).
HOOK = "opsbook.hook"


def hook(default: Any = None) -> Any:
    """A field of a stage's options that the caller sets in its own process (a callback, the
    scheduled check's mode): not a parameter of the notebook, nor of ``opsbook run -p``."""
    return field(default=default, compare=False, metadata={HOOK: True})


# The metadata key of a field of Targets or of a stage's options that says which values it may
# take (a Limits): opsbook.runner.parameters holds `-p` values to it before a run starts.
LIMITS = "opsbook.limits"


@dataclass(frozen=True)
class Limits:
    """The values a parameter may take: a number at least ``low``, above ``above``, at most
    ``high``; a text among ``choices``; true only when none of ``excludes`` is."""

    low: float | None = None
    above: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()


def limited(default: Any, **limits: Any) -> Any:
    """A field of a stage's options (or of :class:`Targets`) with its :class:`Limits`."""
    return field(default=default, metadata={LIMITS: Limits(**limits)})


@dataclass(frozen=True)
class NoOptions:
    """The options of a stage that has no module of its own (a test's stage)."""


@dataclass(frozen=True)
class Targets:
    """The parameters of every stage notebook before its stage's options (``deployment``, the
    file, is the runner's own: ``opsbook run -f``)."""

    # Names of the hosts to run on (user@address:port); empty: all of them.
    hosts: list[str] = field(default_factory=list)
    forks: int = limited(DEFAULT_FORKS, low=1)  # hosts worked on at once


@dataclass(frozen=True)
class Parameter:
    """A parameter of a stage's notebook: its name and default (whose type is the parameter's:
    ``opsbook run -p`` values are converted to it)."""

    name: str
    default: Any


@dataclass(frozen=True)
class Stage:
    """One stage of the runbook.

    Args:
        name: its short name, as results and the recap show it (``config-patch``).
        notebook: the notebook that runs it (``02_config_patch``).
        changes_host: whether it can change a host (with ``apply=True``).
        run_host: the per-host function.
        run_cluster: what the stage does instead on a deployment served across its hosts
            (``cluster:``), where the hosts depend on each other; None: per host as usual.
        module: the stage's module under :mod:`opsbook.stages`, whose ``Options`` are the
            stage's options (imported when they are first asked for); "": none.
        across: what the stage does with its hosts' reports once all are in, on a run over
            several hosts (compare them); None: nothing. On a fleet each host's result is
            recorded as it finishes, and recorded again as amended (``channel.record_amended``)
            where the look across changed it.
        across_fleet: whether ``across`` runs on a fleet too, or only on a cluster (a fleet's
            hosts are compared by 00 and 05; a cluster's launch compares its nodes once they
            joined, a command more per node).
    """

    name: str
    notebook: str
    changes_host: bool
    run_host: StageFunction
    run_cluster: ClusterFunction | None = None
    module: str = ""
    across: HostsFunction | None = None
    across_fleet: bool = True

    @property
    def options_type(self) -> type[Any]:
        """The class of the stage's options."""
        if not self.module:
            return NoOptions
        options: type[Any] = importlib.import_module(f"opsbook.stages.{self.module}").Options
        return options

    def options(self, given: Mapping[str, Any]) -> Any:
        """The stage's options, with the values ``given`` by name.

        Raises:
            RunError: a name is not one of the stage's options.
        """
        kind = self.options_type
        known = [f.name for f in dataclasses.fields(kind)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise RunError(
                f"the {self.name} stage has no option(s) {', '.join(unknown)}",
                remedy=f"its options are: {', '.join(known) or 'none'}",
            )
        return kind(**given)


def parameters_of(stage: Stage) -> list[Parameter]:
    """The parameters of the stage's notebook after ``deployment``, in the order its
    ``parameters`` cell declares them: :class:`Targets`', then the stage's options (hooks
    aside)."""
    fields = [
        *dataclasses.fields(Targets),
        *(f for f in dataclasses.fields(stage.options_type) if not f.metadata.get(HOOK)),
    ]
    return [Parameter(f.name, _default(f)) for f in fields]


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


class Note(str):
    """A line of text that a notebook shows as it is (no quotes)."""

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self)}</p>"


@dataclass
class Together:
    """What a stage's look across its hosts found: each host's report as amended, and what
    the notebook shows of them together (a host x fact table), None when nothing."""

    reports: dict[str, Report]
    shows: Any = None


@dataclass
class StageRun:
    """A stage's results over its hosts, in the deployment's order."""

    stage: Stage
    results: list[HostResult]
    reports: dict[str, Report]
    group: HostGroup
    together: Any = None

    def side_by_side(self) -> Any:
        """What the stage shows of its hosts together (the hosts side by side), or a note
        that there was nothing to compare."""
        if self.together is not None:
            return self.together
        return Note(f"{len(self.results)} host(s): nothing to compare side by side")

    @property
    def going_on(self) -> list[str]:
        """The hosts that take part in the next stages."""
        return [r.host for r in self.results if r.state.goes_on]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def hosts_in(self, state: State) -> list[str]:
        return [r.host for r in self.results if r.state is state]

    def choice(self, default: Sequence[str], offered: Sequence[str] | None = None) -> HostChoice:
        """The hosts a notebook's button may act on (``offered``; by default the reachable
        ones), each with its state in this run, and those of ``default`` among them."""
        names = (
            [r.host for r in self.results if r.state is not State.UNREACHABLE]
            if offered is None
            else list(offered)
        )
        notes = {r.host: f"{r.state.value}: {r.message}" for r in self.results if r.host in names}
        return HostChoice(notes, tuple(name for name in notes if name in default))

    def as_result(self) -> Result:
        """The whole run as one :class:`Result`: ok when every host is, a finding per host
        that is not."""
        findings = [
            Finding("ok" if r.ok else "error", r.host, f"{r.state.value}: {r.message}")
            for r in self.results
        ]
        counts = {s: len(self.hosts_in(s)) for s in State if self.hosts_in(s)}
        summary = ", ".join(f"{n} {s.value}" for s, n in counts.items())
        return Result(
            self.ok,
            f"{self.stage.name} on {len(self.results)} host(s): {summary}",
            findings=findings,
        )

    def result(self, host: str) -> HostResult:
        return next(r for r in self.results if r.host == host)

    def table(self) -> Table:
        return Table(
            ["host", "state", "time", "message"],
            [[r.host, r.state.value, f"{r.duration:.1f} s", r.message] for r in self.results],
        )

    def journal(self) -> Table:
        """Every command the stage sent, all hosts (they share one journal)."""
        hosts = self.group.hosts
        return hosts[0].journal.table() if hosts else Table(["host", "command"], [])

    def sections(self) -> list[Any]:
        """One section per host: its heading and result, then what the stage shows of it."""
        items: list[Any] = []
        for r in self.results:
            items.append(HostHeading(r))
            report = self.reports.get(r.host)
            items += report.shows if report else []
        return items

    def show(self) -> None:
        """Display :meth:`sections`, one output each."""
        from IPython.display import display

        for item in self.sections():
            display(item)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(r.host)}</td>"
            f'<td style="background:{r.state.colour};color:white">{html.escape(r.state.value)}'
            f"</td><td>{r.duration:.1f} s</td><td>{html.escape(r.message)}</td></tr>"
            for r in self.results
        )
        return (
            f"<p><b>{html.escape(self.stage.name)}</b> on {len(self.results)} host(s)</p>"
            "<table><tr><th>host</th><th>state</th><th>time</th><th>message</th></tr>"
            f"{rows}</table>"
        )

    def __repr__(self) -> str:
        return f"{self.stage.name} on {len(self.results)} host(s)\n{self.table()}"


@dataclass(frozen=True)
class HostChoice:
    """The hosts a notebook's button may act on, and those it acts on unless the operator
    chooses otherwise: the ones that need the action.

    Args:
        offered: each host's name and its state as last seen ("ok: already running...").
        default: the hosts chosen at first, in the deployment's order.
    """

    offered: dict[str, str]
    default: tuple[str, ...]


@dataclass(frozen=True)
class HostHeading:
    """The heading of a host's section: its name, state and message, and its problems."""

    result: HostResult

    def _repr_html_(self) -> str:
        anchor = host_anchor(self.result.host)
        heading = f'<h3 id="{anchor}">{html.escape(self.result.host)}</h3>'
        return heading + self.result._repr_html_()

    def __repr__(self) -> str:
        lines = [f"### {self.result.host}", self.result.line()]
        lines += [
            f"  [{f.severity}] {f.subject}: {f.message}"
            for f in self.result.findings
            if f.severity in ("warning", "error")
        ]
        return "\n".join(lines)


def while_busy(shown_now: Any, busy: Mapping[str, str]) -> Any:
    """What a live output shows while a step acts on the ``busy`` hosts: in a stage's table
    their rows say what is being done, and each of their sections is only its heading saying
    so (what it showed before, a server's old PIDs, is no longer true)."""
    if not busy:
        return shown_now
    if isinstance(shown_now, StageRun):
        return BusyRun(shown_now, dict(busy))
    if not isinstance(shown_now, (list, tuple)):
        return shown_now
    items: list[Any] = []
    skipping = False
    for item in shown_now:
        if isinstance(item, HostHeading):
            skipping = item.result.host in busy
            if skipping:
                items.append(BusyHost(item.result.host, busy[item.result.host]))
                continue
        if not skipping:
            items.append(while_busy(item, busy))
    return items


@dataclass(frozen=True)
class BusyHost:
    """A host's section while a button's step acts on it."""

    host: str
    doing: str

    def _repr_html_(self) -> str:
        anchor = host_anchor(self.host)
        return (
            f'<h3 id="{anchor}">{html.escape(self.host)}</h3>'
            f"<p><b>{html.escape(self.doing)}</b> (drawn again when the step is done)</p>"
        )

    def __repr__(self) -> str:
        return f"### {self.host}\n{self.doing} (drawn again when the step is done)"


@dataclass(frozen=True)
class BusyRun:
    """A stage's table while a button's step acts on some of its hosts: their rows say what
    is being done instead of the state found before."""

    run: StageRun
    busy: dict[str, str]

    def rows(self) -> list[tuple[str, str, str]]:
        return [
            (r.host, "busy", self.busy[r.host])
            if r.host in self.busy
            else (r.host, r.state.value, r.message)
            for r in self.run.results
        ]

    def _repr_html_(self) -> str:
        def state_cell(state: str) -> str:
            colour = "#0969da" if state == "busy" else State(state).colour
            return f'<td style="background:{colour};color:white">{html.escape(state)}</td>'

        rows = "".join(
            f"<tr><td>{html.escape(host)}</td>{state_cell(state)}<td>{html.escape(text)}</td></tr>"
            for host, state, text in self.rows()
        )
        return (
            f"<p><b>{html.escape(self.run.stage.name)}</b> on {len(self.run.results)} host(s)"
            "</p><table><tr><th>host</th><th>state</th><th>message</th></tr>"
            f"{rows}</table>"
        )

    def __repr__(self) -> str:
        return "\n".join(f"{host}  {state}  {text}" for host, state, text in self.rows())


# Which input of the server each earlier stage of a deploy changes (the launch's restart rule,
# opsbook.stages.launch_server); here, so that a deploy's own process asks it without
# importing the launch's module (logscan and metrics, 0.3-0.5 s).
CHANGES_OF_STAGE = {"config-patch": "configs", "launch-script": "script"}


def pending_changes(results: Sequence[HostResult], hosts: Sequence[str]) -> dict[str, list[str]]:
    """For the launch of a deploy's dry run: per host of ``hosts``, the inputs the earlier
    stages' results say they would change (02 would patch the configs, 03 would write the
    script); the apply's launch finds them changed. Hosts with none are left out."""
    pending: dict[str, list[str]] = {}
    for result in results:
        name = CHANGES_OF_STAGE.get(result.stage)
        if name and result.host in hosts and result.state is State.WOULD_CHANGE:
            pending.setdefault(result.host, []).append(name)
    return pending


def concurrently(*reads: Callable[[], Any]) -> list[Any]:
    """Independent reads of one host at once, each over its own channel of the host's one
    connection: their answers in order. An exception of one is raised after all have ended."""
    with ThreadPoolExecutor(max_workers=len(reads)) as pool:
        futures = [pool.submit(read) for read in reads]
    return [future.result() for future in futures]


# The readings of the deploy run whose shared kernel this is (share_readings); None elsewhere.
_shared_readings: RunReadings | None = None


def share_readings(readings: RunReadings | None) -> None:
    """Make ``readings`` the run's, in a deploy's shared kernel (the runner does this as the
    kernel starts): :func:`run_stage` gives them to every stage whose options take
    ``readings``, so that preflight's reading of a host serves the later stages that may take
    it. A notebook run on its own has none."""
    global _shared_readings
    _shared_readings = readings


def run_stage(
    stage: Stage,
    deployment: Deployment,
    *,
    hosts: Sequence[str] = (),
    forks: int = DEFAULT_FORKS,
    group: HostGroup | None = None,
    on_result: Callable[[HostResult], None] | None = print,
    compare: bool = True,
    **options: Any,
) -> StageRun:
    """Run ``stage`` on the deployment's hosts (those named in ``hosts``, when given),
    ``forks`` at a time.

    Args:
        stage: the stage.
        deployment: the deployment; each host sees it through its own ``vars``.
        hosts: names of the hosts to run on (default: all).
        forks: how many hosts are worked on at once.
        group: the hosts to use instead of new connections (tests pass test doubles here).
        on_result: called with each host's result as it finishes (default: print its line).
        compare: on a fleet, the stage's look across its hosts (side by side) once all are
            done; False: none (the scheduled health check: one status probe per host).
        options: the stage's own options (``apply``, ``ready_timeout``...), fields of its
            options class; in a deploy's shared kernel, a stage whose options take
            ``readings`` is given the run's (:func:`share_readings`) unless given others.

    Raises:
        RunError: a name in ``hosts`` is not a host of the deployment, or a name in
            ``options`` is not an option of the stage.
    """
    if _shared_readings is not None and "readings" not in options and _takes_readings(stage):
        options = {**options, "readings": _shared_readings}
    chosen = stage.options(options)
    group = group or HostGroup.from_deployment(deployment, forks, known_hosts(deployment, hosts))
    if deployment.cluster is not None and stage.run_cluster is not None:
        return _run_cluster(stage, deployment, group, on_result, chosen)
    reports: dict[str, Report] = {}
    durations: dict[str, float] = {}
    across = stage.across if compare and stage.across_fleet and len(group.hosts) > 1 else None

    def one(host: RemoteHost) -> HostResult:
        started = time.monotonic()
        report = _run_one(stage, host, deployment, chosen)
        durations[host.name] = time.monotonic() - started
        reports[host.name] = report
        _record_diffs(stage, host.name, report, deployment)
        _record_metrics(stage, host.name, report)
        return _host_result(stage, host.name, report, durations[host.name])

    def done(name: str, answer: Any) -> None:
        if isinstance(answer, HostResult):
            _announce(answer, on_result)

    answers = group.map(one, on_done=done)
    results = [
        a if isinstance(a, HostResult) else _crashed(stage, n, a) for n, a in answers.items()
    ]
    together = None
    if across is not None:
        seen = _across(across, group.hosts, deployment, reports)
        together = seen.shows
        results = [_amended(stage, r, reports, seen.reports, durations, on_result) for r in results]
        reports = seen.reports
    return StageRun(stage, results, reports, group, together)


def _takes_readings(stage: Stage) -> bool:
    return any(f.name == "readings" for f in dataclasses.fields(stage.options_type))


def _announce(result: HostResult, on_result: Callable[[HostResult], None] | None) -> None:
    channel.record_host(result)
    if on_result is not None:
        on_result(result)


def _amended(
    stage: Stage,
    result: HostResult,
    before: dict[str, Report],
    after: dict[str, Report],
    durations: dict[str, float],
    on_result: Callable[[HostResult], None] | None,
) -> HostResult:
    """A host's result as the stage's look across its hosts amended it, recorded in place of
    the one recorded as the host finished (said again when its line changed)."""
    report = after.get(result.host)
    if report is None or report is before.get(result.host):
        return result
    amended = _host_result(stage, result.host, report, durations[result.host])
    channel.record_amended(amended)
    if on_result is not None and not channel.same_line(result, amended):
        on_result(amended)
    return amended


def _across(
    across: HostsFunction, hosts: Sequence[Any], deployment: Deployment, reports: dict[str, Report]
) -> Together:
    """The stage's look across its hosts; when it fails, the reports as they were, and a
    note saying why they were not compared (the hosts' own results stand)."""
    try:
        return across(hosts, deployment, dict(reports))
    except Exception as e:  # a bug in the comparison is shown, and costs no host its result
        return Together(reports, Note(f"the hosts were not compared: {type(e).__name__}: {e}"))


def _run_cluster(
    stage: Stage,
    deployment: Deployment,
    group: HostGroup,
    on_result: Callable[[HostResult], None] | None,
    options: Any,
) -> StageRun:
    """The stage's cluster function over the group: the hosts act together, one result each."""
    assert stage.run_cluster is not None
    started = time.monotonic()
    together = None
    try:
        reports = stage.run_cluster(group.hosts, deployment, options)
        if stage.across is not None:  # while the nodes' connections are open
            seen = _across(stage.across, group.hosts, deployment, reports)
            reports, together = seen.reports, seen.shows
    except OpsbookError as e:
        verdict = Result(False, e.message, findings=[Finding("error", deployment.name, e.message)])
        reports = {h.name: Report(State.FAILED, verdict, [], TOOL_FAILED) for h in group.hosts}
    except Exception as e:  # a bug is every node's failure, reported as such, not a crash
        verdict = Result(False, f"opsbook failed: {type(e).__name__}: {e}")
        reports = {h.name: Report(State.FAILED, verdict, [], TOOL_FAILED) for h in group.hosts}
    finally:
        group.close()
    results = []
    for host in group.hosts:
        report = reports.get(host.name) or Report(
            State.SKIPPED, Result(True, "not part of the cluster's run")
        )
        result = _host_result(stage, host.name, report, time.monotonic() - started)
        channel.record_host(result)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return StageRun(stage, results, dict(reports), group, together)


def _run_one(stage: Stage, host: RemoteHost, deployment: Deployment, options: Any) -> Report:
    try:
        return stage.run_host(host, deployment.for_host(host.spec), options)
    except HostUnreachable as e:
        return Report(State.UNREACHABLE, Result(False, e.message, findings=[_finding(host, e)]))
    except OpsbookError as e:
        verdict = Result(False, e.message, findings=[_finding(host, e)])
        return Report(State.FAILED, verdict, [], TOOL_FAILED)
    except Exception as e:  # a bug on one host is that host's failure, not the fleet's
        message = f"opsbook failed: {type(e).__name__}: {e}"
        return Report(State.FAILED, Result(False, message), [], TOOL_FAILED)
    finally:
        host.close()


def _record_diffs(stage: Stage, host: str, report: Report, deployment: Deployment) -> None:
    """Keep the diffs the host's section shows in the run record (the deployment's secrets
    masked): a ticket reads the changes without the notebook."""
    diffs = [item for item in report.shows if isinstance(item, Diff)]
    if not diffs:
        return
    mask = Redactor(deployment.secret_values()).redact
    for diff in diffs:
        channel.record_diff(channel.StageDiff(host, stage.name, diff.title, mask(diff.text)))


def _record_metrics(stage: Stage, host: str, report: Report) -> None:
    """Keep the /metrics summaries the host's section shows in the run record."""
    # Imported here, not with the registry: the deploy runner imports the registry for the
    # stages' names and parameters, and metrics brings logscan and compat (0.3-0.6 s).
    from opsbook.steps.metrics import MetricsSummary

    for item in report.shows:
        if isinstance(item, MetricsSummary):
            channel.record_metrics(
                channel.StageMetrics(host, stage.name, item.moment, item.summary)
            )


def _finding(host: RemoteHost, e: OpsbookError) -> Finding:
    return Finding("error", host.name, e.message, e.remedy or "")


def _host_result(stage: Stage, host: str, report: Report, duration: float) -> HostResult:
    return HostResult(
        host=host,
        stage=stage.name,
        state=report.state,
        message=report.verdict.message,
        failure_id=report.failure_id,
        findings=tuple(report.verdict.findings),
        duration=round(duration, 3),
        script_sha256=report.script_sha256,
    )


def _crashed(stage: Stage, host: str, error: BaseException) -> HostResult:
    # A bug in opsbook on one host is that host's failure; the others' results stand.
    result = HostResult(
        host,
        stage.name,
        State.FAILED,
        f"opsbook failed: {type(error).__name__}: {error}",
        failure_id=TOOL_FAILED,
    )
    channel.record_host(result)
    return result


def known_hosts(deployment: Deployment, names: Sequence[str]) -> list[str]:
    """``names``, each a host of the deployment.

    Raises:
        RunError: a name is not one of its hosts.
    """
    known = [h.name for h in deployment.hosts]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise RunError(
            f"{', '.join(unknown)} is not a host of {deployment.name}",
            remedy=f"its hosts are: {', '.join(known)}",
        )
    return list(names)
