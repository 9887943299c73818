"""Run records: the folder a run leaves behind, its summary, its index page, and listing.

A closed run folder is made read-only: an incident record is not edited after the fact.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State, Table, host_anchor, recap

if TYPE_CHECKING:
    from opsbook.core.channel import StageProgress

SUMMARY = "summary.json"
INDEX = "index.html"
JOURNAL_PAGE = "journal.html"

# How a dry run is labelled wherever a run is shown: the terminal, the index page, the list.
DRY_RUN_NOTE = "dry run: nothing on the hosts was changed; -p apply true applies"


@dataclass(frozen=True)
class NotebookEntry:
    """One executed notebook of a run: the stage it ran, on which hosts, and how it ended."""

    stage: str
    notebook: str
    html: str | None
    hosts: tuple[str, ...]
    exit_code: int
    message: str
    duration: float


@dataclass
class RunSummary:
    """What a deploy run did, host by host and stage by stage."""

    name: str
    deployment: str
    started: str
    status: str
    exit_code: int
    message: str
    duration: float
    parameters: dict[str, str]
    hosts: list[str]
    stages: list[str]
    results: list[HostResult]
    notebooks: list[NotebookEntry]
    dry_run: bool = False

    def result(self, host: str, stage: str) -> HostResult | None:
        return next((r for r in self.results if r.host == host and r.stage == stage), None)

    def notebook_of(self, host: str, stage: str) -> NotebookEntry | None:
        return next((n for n in self.notebooks if n.stage == stage and host in n.hosts), None)

    def script_versions(self) -> dict[str, str]:
        """Per host, the sha256 of the launch script its server runs, as the last stage that
        knows it says (empty when no server of opsbook runs there)."""
        versions = {}
        for host in self.hosts:
            known = [
                r.script_sha256
                for r in self.results
                if r.host == host
                and r.stage in ("launch", "diagnose")
                and r.state in (State.OK, State.CHANGED)
            ]
            versions[host] = known[-1] if known else ""
        return versions


def export_html(notebook: Path, exporter: Any = None) -> Path | None:
    """An HTML copy next to the executed notebook, as a ticket takes it (:func:`for_the_record`;
    widget state included when saved).

    Args:
        exporter: an ``nbconvert.HTMLExporter`` to reuse (it keeps its compiled templates).
    """
    import nbformat

    if exporter is None:
        from nbconvert import HTMLExporter

        exporter = HTMLExporter()
    target = notebook.with_suffix(".html")
    try:  # a run folder deleted during the run takes its notebooks with it
        nb = nbformat.reads(notebook.read_text(encoding="utf-8"), as_version=4)
        body, _ = exporter.from_notebook_node(for_the_record(nb))
        target.write_text(body)
    except FileNotFoundError:
        return None
    return target


# The code cells whose code a record keeps: the parameters, as written and as the run gave them.
KEPT_CODE_TAGS = frozenset({"parameters", "injected-parameters"})
# Tags an author may put on a cell (Jupyter Book's and nbconvert's TagRemovePreprocessor's).
REMOVE_CELL, REMOVE_INPUT = "remove-cell", "remove-input"
# The notebooks' note that their stored outputs are examples from the rehearsal host: true of
# the runbook as shipped, false of an executed copy.
_EXAMPLE_BANNER = re.compile(r"^\s*>?\s*\*\*Example output\b", re.IGNORECASE)


def for_the_record(nb: Any) -> Any:
    """An executed notebook as an incident record shows it (changed in place, and returned):
    the parameters' code and every output, but not the code that draws the form and the
    buttons or runs the stage, nor the example banner.

    Args:
        nb: an ``nbformat`` notebook node.
    """
    kept = []
    for cell in nb.cells:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if REMOVE_CELL in tags or is_example_banner(cell):
            continue
        if REMOVE_INPUT in tags or (cell.cell_type == "code" and not tags & KEPT_CODE_TAGS):
            # nbconvert's templates leave out the source of a cell so marked (as its
            # TagRemovePreprocessor does), and keep its outputs.
            cell.metadata.setdefault("transient", {})["remove_source"] = True
        kept.append(cell)
    nb.cells = kept
    return nb


def is_example_banner(cell: Any) -> bool:
    """Whether a cell is the note that the notebook's outputs are stored examples."""
    return cell.cell_type == "markdown" and bool(_EXAMPLE_BANNER.match(cell.source))


# The exporter process reads one notebook path a line and answers one line: the HTML copy's
# path, an empty line when the notebook is gone, or "!" and the error.
_EXPORTER = "from opsbook.runner.records import serve_html_exports; serve_html_exports()"
EXPORTER_NICENESS = 10


class HtmlExports:
    """HTML copies of a run's notebooks, made by a helper process of lower priority.

    nbconvert takes about a second of CPU to import and a quarter of a second a notebook: in
    the runner's process it would hold the interpreter lock that reading the kernel's
    messages needs, and slow every stage after the first. The helper uses the CPU the stages
    leave idle (a launch mostly waits); started when the run starts (:meth:`start`), it has
    imported nbconvert and compiled its templates by the time the first notebook is done.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._waiter: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Start the helper now (the first export would otherwise start it)."""
        with self._lock:
            self._started()

    def submit(self, notebook: Path) -> Future[Path | None]:
        """:meth:`export` while the caller goes on: a thread of this object waits for the
        helper."""
        if self._waiter is None:
            self._waiter = ThreadPoolExecutor(1, thread_name_prefix="opsbook-html")
        return self._waiter.submit(self.export, notebook)

    def export(self, notebook: Path) -> Path | None:
        """The notebook's HTML copy (next to it), or None when the notebook is gone."""
        with self._lock:
            answer = self._ask(str(notebook))
        if answer is None or answer.startswith("!"):  # the helper failed: do it here
            with private_files():
                return export_html(notebook)
        return Path(answer) if answer else None

    def close(self) -> None:
        """Let the exports submitted finish, and the helper end."""
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own helper, by its handle
            proc.wait()

    def _ask(self, path: str) -> str | None:
        if "\n" in path:
            return None
        try:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(path + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:
            return None
        return line.rstrip("\n") if line else None

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _EXPORTER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self._proc


def serve_html_exports() -> None:
    """The exporter process: HTML copies of the notebooks named on stdin (see
    :class:`HtmlExports`), private like the rest of the run folder.

    Importing nbconvert and compiling its templates (about 0.5 s of CPU) is done at a lower
    priority, on a thread of its own, while the run's first stage runs; the exports themselves
    (0.03-0.1 s each) are not: the last one is waited for as the run ends, and at a low
    priority on a busy machine it took 0.3-0.5 s. Linux keeps a nice value per thread
    (``setpriority(2)``); elsewhere the whole helper is niced, as it was.
    """
    from opsbook.core.optional_imports import skip_slow_optional_imports

    skip_slow_optional_imports()
    os.umask(PRIVATE_UMASK)
    warmed: list[Any] = []
    warming = threading.Thread(target=_warm_exporter, args=(warmed,), name="opsbook-html-warm")
    warming.start()
    for line in sys.stdin:
        warming.join()
        try:
            page = export_html(Path(line.rstrip("\n")), warmed[0] if warmed else None)
            answer = str(page) if page else ""
        except Exception as e:  # the runner makes this copy itself, and reports what fails
            answer = f"!{type(e).__name__}: {e}".replace("\n", " ")
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    # Every copy is written and answered for; the interpreter's own teardown (nbconvert's
    # modules) would only delay the run's end, which waits for this process.
    os._exit(0)


def _warm_exporter(into: list[Any]) -> None:
    """Import nbconvert and compile its templates, niced: the first export would otherwise do
    it (half a second) while the run waits. The notebook exported to warm it up has what a
    stage's record has (markdown, a parameters cell, a printed line, an HTML table): an empty
    one left the markdown renderer, the Python lexer and the HTML post-processing to the first
    real export, 130 ms at full priority against 40 ms."""
    os.nice(EXPORTER_NICENESS)
    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    exporter.from_notebook_node(_warm_up_notebook())
    into.append(exporter)


def _warm_up_notebook() -> Any:
    import nbformat

    code = nbformat.v4.new_code_cell("forks = 10", metadata={"tags": ["parameters"]})
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="ok\n"),
        nbformat.v4.new_output(
            "display_data", data={"text/html": "<table><tr><td>ok</td></tr></table>"}
        ),
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Stage\n\nWhat and *why*:\n\n- `one`"), code]
    return nb


def summary_doc(run: RunSummary) -> dict[str, Any]:
    """``summary.json``: the run, per-host results, the recap and the script versions."""
    from opsbook.core import channel

    doc = {k: v for k, v in asdict(run).items() if k not in ("results", "notebooks")}
    doc["results"] = [channel.to_dict(r) for r in run.results]
    doc["notebooks"] = [asdict(n) for n in run.notebooks]
    doc["recap"] = {
        line.host: {**line.counts, "exit_code": line.exit_code} for line in recap(run.results)
    }
    doc["script_versions"] = run.script_versions()
    return doc


def write_summary(folder: Path, run: RunSummary) -> Path:
    """``summary.json`` and ``index.html`` of a run folder (with the ``/metrics`` summaries
    its stages recorded)."""
    doc = summary_doc(run)
    metrics = recorded_metrics(folder)
    if metrics:
        doc["metrics"] = metrics
    verdicts = qualification_verdicts(folder, run.results)
    if verdicts:
        doc["qualification"] = verdicts
    (folder / SUMMARY).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (folder / INDEX).write_text(index_page(run, verdicts))
    write_journal_page(folder)
    return folder / SUMMARY


def write_journal_page(folder: Path) -> Path | None:
    """``journal.html``: the run's journal for people, next to ``journal.jsonl``."""
    from opsbook.remote.journal import journal_page, read_journal

    source = folder / "journal.jsonl"
    if not source.exists():
        return None
    page = journal_page(read_journal(source), title=f"journal of {folder.name}")
    (folder / JOURNAL_PAGE).write_text(page)
    return folder / JOURNAL_PAGE


def qualification_verdicts(folder: Path, results: list[HostResult]) -> dict[str, dict[str, Any]]:
    """Per host 06_qualify ran on, its verdict: ``passed`` or ``failed`` with its receipt's
    figures (``qualify/receipt.json``, a rolling run's under ``batch-*/``), else the stage's
    own state (``skipped`` when the server was busy, ``failed`` when there was none)."""
    if not any(result.stage == "qualify" for result in results):
        return {}  # without importing the receipts' schema (a no-op deploy's record)
    from opsbook.steps import qualify_receipt as receipts

    paths = [
        *folder.glob(f"{receipts.FOLDER}/{receipts.RECEIPT_FILE}"),
        *folder.glob(f"batch-*/{receipts.FOLDER}/{receipts.RECEIPT_FILE}"),
    ]
    filed = {r.host: (r, p) for p in paths for r in receipts.receipts_in(p)}
    verdicts: dict[str, dict[str, Any]] = {}
    for result in results:
        if result.stage != "qualify":
            continue
        verdict: dict[str, Any] = {"verdict": result.state.value, "message": result.message}
        if result.host in filed:
            receipt, path = filed[result.host]
            verdict.update(
                verdict="passed" if receipt.passed else "failed",
                profile=receipt.profile,
                compared_with=receipt.compared_with,
                problems=sorted(
                    {f.get("code", "") for f in receipt.findings if f.get("severity") == "error"}
                    - {""}
                ),
                best_output_tok_s=max((c.output_tok_s for c in receipt.cells), default=None),
                receipt=str(path.relative_to(folder)),
            )
        verdicts[result.host] = verdict
    return verdicts


def _qualification_section(verdicts: Mapping[str, Mapping[str, Any]]) -> str:
    """The index page's table of 06_qualify's verdict per host, each linking its receipt."""
    if not verdicts:
        return ""
    esc = html.escape
    colours = {"passed": State.OK.colour, "failed": State.FAILED.colour}
    rows = []
    for host, v in verdicts.items():
        colour = colours.get(v["verdict"], State.SKIPPED.colour)
        verdict = esc(v["verdict"])
        if v.get("receipt"):
            verdict = f"<a href='{esc(v['receipt'])}'>{verdict}</a>"
        best = v.get("best_output_tok_s")
        against = v.get("compared_with") or ("first run on this hardware" if "profile" in v else "")
        rows.append(
            f"<tr><th style='text-align:left'>{esc(host)}</th>"
            f"<td class='state' style='background:{colour};color:white'>{verdict}</td>"
            f"<td>{esc(v.get('profile', ''))}</td>"
            f"<td>{'' if best is None else f'{best:.1f}'}</td>"
            f"<td>{esc(', '.join(v.get('problems', [])))}</td>"
            f"<td>{esc(against)}</td><td>{esc(v['message'])}</td></tr>"
        )
    return (
        "<h2>Qualification</h2><table><tr><th>host</th><th>verdict</th><th>profile</th>"
        "<th>best tok/s</th><th>problems</th><th>against</th><th>message</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def index_page(run: RunSummary, verdicts: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """A self-contained status page: a host x stage grid of states, each cell linking the
    notebook that ran it, the recap and the launch script each host runs, then 06_qualify's
    ``verdicts`` (:func:`qualification_verdicts`) when it ran."""
    esc = html.escape
    head = "".join(f"<th>{esc(s)}</th>" for s in run.stages)
    versions = run.script_versions()
    rows = []
    lines = {line.host: line for line in recap(run.results)}
    for host in run.hosts:
        cells = "".join(_grid_cell(run, host, stage) for stage in run.stages)
        counts = (
            " ".join(f"{k}={v}" for k, v in lines[host].counts.items()) if host in lines else ""
        )
        version = esc(versions.get(host, "")[:12]) or "&mdash;"
        rows.append(
            f"<tr><th style='text-align:left'>{esc(host)}</th>{cells}"
            f"<td><code>{version}</code></td><td>{esc(counts)}</td></tr>"
        )
    title = f"opsbook run {run.name}: {run.status}" + (f" ({DRY_RUN_NOTE})" if run.dry_run else "")
    notebooks = "".join(
        f"<li><a href='{esc(n.notebook)}'>{esc(n.notebook)}</a>"
        + (f" · <a href='{esc(n.html)}'>html</a>" if n.html else "")
        + f" ({esc(n.stage)} on {len(n.hosts)} host(s), {n.duration:.1f} s)</li>"
        for n in run.notebooks
    )
    return (
        "<!doctype html><meta charset='utf-8'>"
        f"<title>{esc(title)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 10px;border-bottom:1px solid #ddd}"
        "td.state a{color:white}</style>"
        f"<h1>{esc(title)}</h1>"
        f"<p>{esc(run.message)}</p>"
        f"<p>deployment {esc(run.deployment)} · {len(run.hosts)} host(s)"
        f" · started {esc(run.started)} · {run.duration:.1f} s"
        f" · <a href='{JOURNAL_PAGE}'>journal</a> (<a href='journal.jsonl'>JSON lines</a>)</p>"
        f"<table><tr><th>host</th>{head}<th>launch script running</th><th>recap</th></tr>"
        + "".join(rows)
        + "</table>"
        + _qualification_section(verdicts or {})
        + "<h2>Notebooks</h2><ul>"
        + notebooks
        + "</ul>"
    )


def _grid_cell(run: RunSummary, host: str, stage: str) -> str:
    result = run.result(host, stage)
    if result is None:
        return "<td></td>"
    label = html.escape(result.state.value)
    entry = run.notebook_of(host, stage)
    if entry is not None:
        link = f"{entry.html}#{host_anchor(host)}" if entry.html else entry.notebook
        label = f"<a href='{html.escape(link)}'>{label}</a>"
    return (
        f"<td class='state' style='background:{result.state.colour};color:white' "
        f"title='{html.escape(result.message, quote=True)}'>{label}</td>"
    )


# A run folder is the operator's alone: while it is written, and once sealed (read-only).
FOLDER_MODE = 0o700
SEALED_FOLDER_MODE = 0o500
SEALED_FILE_MODE = 0o400
PRIVATE_UMASK = 0o077


# The umask is the process's, and a deploy writes its run folder from two threads at once (the
# stages, and the HTML copies exported meanwhile): the first to enter sets it, the last to
# leave puts the operator's back. Saved and restored per entry, an overlap would leave 077.
_umask_lock = threading.Lock()
_umask_holders = 0
_umask_saved = 0o022


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Files created in the body (here and by a kernel started in it) are the owner's alone
    (0600, folders 0700).

    The umask is the process's: the runner holds it only while it writes a run folder; nested
    and concurrent uses (threads) share one hold.
    """
    global _umask_holders, _umask_saved
    with _umask_lock:
        if _umask_holders == 0:
            _umask_saved = os.umask(PRIVATE_UMASK)
        _umask_holders += 1
    try:
        yield
    finally:
        with _umask_lock:
            _umask_holders -= 1
            if _umask_holders == 0:
                os.umask(_umask_saved)


def close(folder: Path) -> None:
    """Seal a finished run folder: read-only and private, folders 0500 and files 0400 (an
    incident record is not edited after the fact, and lists hosts, users and processes)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            _seal(Path(root) / name, SEALED_FILE_MODE)
        for name in dirs:
            _seal(Path(root) / name, SEALED_FOLDER_MODE)
    _seal(folder, SEALED_FOLDER_MODE)


def _seal(path: Path, mode: int) -> None:
    if not path.is_symlink():
        path.chmod(mode)


def list_runs(
    runs_dir: Path,
    keep: Callable[[Path, dict[str, Any]], bool] | None = None,
    keep_folder: Callable[[Path], bool] | None = None,
) -> Table:
    """Every run folder under ``runs_dir``, newest first: headless runs and interactive
    sessions (filed or not), with who ran it, on which deployment(s), how long, whether it was
    a dry run, and how it ended. ``keep``: only the runs it keeps (``keep_folder`` decides
    first on the folder alone, before its record is read)."""
    rows = []
    for folder in sorted(runs_dir.glob("*"), reverse=True):
        if keep_folder is not None and not keep_folder(folder):
            continue
        doc = _read_record(folder)
        if doc is None or (keep is not None and not keep(folder, doc)):
            continue
        rows.append(
            [
                folder.name,
                run_kind(doc),
                doc.get("user") or folder_owner(folder),
                ", ".join(_short(d) for d in deployments_of(doc)),
                f"{float(doc.get('duration') or 0):.0f} s",
                doc.get("status", "?"),
                doc.get("exit_code", ""),
                doc.get("message", "")[:100],
            ]
        )
    columns = ["run", "kind", "user", "deployment", "took", "status", "exit", "message"]
    return Table(columns, rows)


def run_kind(doc: dict[str, Any]) -> str:
    """ "interactive" (a JupyterLab session, "not filed" until it is) or "headless", and
    "dry run" when a run that could change hosts was told not to."""
    if doc.get("interactive"):
        return "interactive" + ("" if doc.get("filed", True) else ", not filed")
    return "headless, dry run" if is_dry_run(doc) else "headless"


def is_dry_run(doc: dict[str, Any]) -> bool:
    """Whether a headless run (its ``run.json``) changed nothing by design."""
    return dry_run(doc.get("parameters") or {}, str(doc.get("notebook", "")))


def dry_run(parameters: Mapping[str, Any], notebook: str) -> bool:
    """Whether a run with these parameters changes nothing by design: ``apply`` false, given
    or (for a stage that changes hosts) left at its notebook's default, False."""
    from opsbook import stages

    if "apply" in parameters:
        return str(parameters["apply"]).strip().lower() in ("false", "0", "no")
    stage = stages.for_notebook(Path(notebook).stem)
    return stage is not None and stage.changes_host


def deployments_of(doc: dict[str, Any]) -> list[str]:
    """The deployment files a run used (a session: every one it touched)."""
    found = doc.get("deployments") or [
        doc.get("deployment") or (doc.get("parameters") or {}).get("deployment") or ""
    ]
    return [str(d) for d in found if d]


def _short(path: str) -> str:
    """A deployment file as a list shows it: its name, and its folder's for the rehearsal
    hosts' ``<name>/deployment.yml``."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.name == "deployment.yml" else p.name


def folder_owner(folder: Path) -> str:
    """Who made a run folder (a headless run records no user: the folder is its operator's)."""
    import pwd

    try:
        return pwd.getpwuid(folder.stat().st_uid).pw_name
    except (KeyError, OSError):
        return "?"


def show_run(folder: Path) -> dict[str, Any]:
    """What a run folder records.

    Raises:
        RunError: it is not a run folder.
    """
    doc = _read_record(folder)
    if doc is None:
        raise RunError(f"{folder} is not a run folder", remedy="see `opsbook records list`")
    return doc


def describe_run(folder: Path) -> str:
    """What a run folder records, for people: status, parameters, one line per stage and host,
    the recap, and where the notebooks, the journal and the index page are.

    Raises:
        RunError: it is not a run folder.
    """
    from opsbook.core import channel

    doc = show_run(folder)
    results = [channel.decode(json.dumps(r)) for r in doc.get("results", [])]
    params = doc.get("parameters") or {}
    took = f"{float(doc.get('duration') or 0):.1f} s"
    kind = run_kind(doc)
    lines = [
        f"run {folder.name}: {doc.get('status', '?')} (exit {doc.get('exit_code', '?')}), {took}"
        f", {kind}" + (" (status as of its last activity)" if not doc.get("filed", True) else ""),
        f"  {doc.get('message', '')}",
    ]
    if doc.get("interactive"):
        lines.append(f"  user {doc.get('user', '?')}; deployment(s): "
                     + ", ".join(deployments_of(doc))
                     + f"; host(s): {', '.join(doc.get('hosts') or [])}")  # fmt: skip
    if doc.get("started"):
        lines.append(f"  started {doc['started']}")
    if params:
        lines.append("  parameters: " + ", ".join(f"{k}={v}" for k, v in params.items()))
    if results:
        table = Table(
            ["stage", "host", "state", "time", "message"],
            [[r.stage, r.host, r.state.value, f"{r.duration:.1f} s", r.message] for r in results],
        )
        lines += ["", str(table), "", "RECAP"]
        width = max(len(r.host) for r in results)
        lines += [line.line(width) for line in recap(results)]
    lines += _journal_section(folder)
    names = (INDEX, JOURNAL_PAGE, "journal.jsonl", "session.ipynb", "cells.jsonl", "clicks.jsonl")
    files = [name for name in names if (folder / name).exists()]
    files += [n["notebook"] for n in doc.get("notebooks", [])]
    if not doc.get("notebooks") and doc.get("notebook") and not doc.get("interactive"):
        files.append(str(doc["notebook"]))
    if files:
        lines += ["", "files: " + ", ".join(files)]
    return "\n".join(lines)


def _journal_section(folder: Path) -> list[str]:
    """Every remote command of the run, whole and in time order (times UTC)."""
    from opsbook.remote.journal import journal_lines, read_journal

    source = folder / "journal.jsonl"
    entries = read_journal(source) if source.is_file() else []
    if not entries:
        return []
    return ["", f"JOURNAL ({len(entries)} operation(s), in time order, UTC)"] + journal_lines(
        entries
    )


def recorded_diffs(folder: Path) -> list[Any]:
    """The diffs a run's stages recorded (``opsbook.core.channel.StageDiff``), stage by stage
    (batch by batch in a deploy run in batches).

    Raises:
        RunError: it is not a run folder.
    """
    from opsbook.core import channel

    show_run(folder)
    return [
        diff
        for path in sorted(folder.rglob("*.results.jsonl"))
        for diff in channel.read_diffs(path)
    ]


def recorded_metrics(folder: Path) -> list[dict[str, Any]]:
    """The ``/metrics`` summaries a run's stages recorded (04 at ready, 05 at its end), in
    order."""
    from opsbook.core import channel

    return [
        asdict(metrics)
        for path in sorted(folder.rglob("*.results.jsonl"))
        for metrics in channel.read_metrics(path)
    ]


def describe_diffs(folder: Path, colour: bool = False) -> str:
    """The diffs a run's stages recorded, for a terminal: per host and stage, what it changes
    and the diff (coloured when ``colour``).

    Raises:
        RunError: it is not a run folder.
    """
    from opsbook.core.diffs import diff_terminal

    diffs = recorded_diffs(folder)
    if not diffs:
        return f"run {folder.name} recorded no diff (no stage planned or made a change)"
    blocks = [
        f"{d.stage} on {d.host}"
        + (f": {d.title}" if d.title else "")
        + "\n"
        + diff_terminal(d.text, colour)
        for d in diffs
    ]
    return "\n\n".join(blocks)


def _read_record(folder: Path) -> dict[str, Any] | None:
    from opsbook.runner import session

    header = session.read_header(folder)
    for name in (SUMMARY, "run.json"):
        path = folder / name
        if path.is_file():
            try:
                loaded: dict[str, Any] = json.loads(path.read_text())
            except json.JSONDecodeError:
                return None
            if header is not None:  # a filed session
                keep = ("user", "deployments")
                loaded.update({k: header[k] for k in keep if k in header}, interactive=True)
            return loaded
    return session.session_doc(folder) if header is not None else None


def newest_run(runs_dir: Path) -> Path:
    """The newest run folder :func:`list_runs` shows (its first row), whatever it lists.

    Raises:
        RunError: it shows none.
    """
    shown = list_runs(runs_dir).records()
    if not shown:
        raise RunError(
            f"no run folder in {runs_dir}", remedy="give --runs-dir the folder your runs go to"
        )
    return runs_dir / str(shown[0]["run"])


# Seconds between two looks at a run folder being followed.
FOLLOW_POLL = 0.5


def filed_record(folder: Path) -> dict[str, Any] | None:
    """The record of a run once it is filed: a stage run's ``run.json`` (written last), a
    deploy's once its folder is sealed (after ``summary.json``); None while the run goes on.
    """
    doc = _read_record(folder)
    if doc is None or doc.get("interactive"):
        return None
    if doc.get("notebook") == "deploy" and os.stat(folder).st_mode & 0o200:
        return None
    return doc


def follow_run(folder: Path, poll: float = FOLLOW_POLL) -> Iterator[HostResult | StageProgress]:
    """Each host's result (and each progress line of a long stage) of a run as its stages
    record them, from the first, until the run is filed: ``opsbook records show --follow``.
    An amended result comes again only when its line changes. A run filed already gives what
    it recorded, then ends.

    Raises:
        RunError: ``folder`` is no run folder, or the detached run writing it ended without
            filing its record (``console.log`` says why).
    """
    from opsbook.core import channel
    from opsbook.runner.detach import CONSOLE_LOG, detached_run_alive

    if not folder.is_dir():
        raise RunError(f"{folder} is not a run folder", remedy="see `opsbook records list`")
    followers: dict[Path, channel.Follower] = {}
    said: list[HostResult] = []
    while True:
        filed = filed_record(folder) is not None
        for path in sorted(folder.rglob("*.results.jsonl")):
            followers.setdefault(path, channel.Follower(path))
        for follower in followers.values():
            for record in follower.new():
                if isinstance(record, HostResult):
                    said.append(record)
                    yield record
                elif isinstance(record, channel.Amended):
                    if not channel.same_line(channel.amend(said, record.result), record.result):
                        yield record.result
                elif isinstance(record, channel.StageProgress):
                    yield record
        if filed:
            return
        if detached_run_alive(folder) is False and filed_record(folder) is None:
            raise RunError(
                f"the detached run writing {folder} ended without filing its record",
                remedy=f"read {folder / CONSOLE_LOG} for why it stopped",
            )
        time.sleep(poll)


def newest_folder(runs_dir: Path) -> Path:
    """The newest run folder :func:`list_runs` shows, or a detached run's newer still going on
    (``records show last --follow`` right after ``run --detach``).

    Raises:
        RunError: there is neither.
    """
    from opsbook.runner.detach import DETACHED_FILE

    going = sorted((p.parent for p in runs_dir.glob(f"*/{DETACHED_FILE}")), reverse=True)
    try:
        listed = newest_run(runs_dir)
    except RunError:
        if not going:
            raise
        return going[0]
    return going[0] if going and going[0].name > listed.name else listed
