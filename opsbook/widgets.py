"""Forms and confirm buttons for stepping through the runbook in JupyterLab.

Every step that changes the host goes through :func:`confirm`. With someone at the notebook it
shows a button and runs the step only when clicked; headless (``opsbook run``, nbval) it runs
the step at once when ``apply`` is True and never otherwise, so nothing waits for a click.
"""

from __future__ import annotations

import html
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opsbook import __version__
from opsbook.core.channel import DEPLOYMENT_ENV, JOURNAL_ENV
from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.core.results import Result, shown
from opsbook.runner import first_contact
from opsbook.runner import session as session_records
from opsbook.runner.progress import has_frontend
from opsbook.stages.base import HostChoice, while_busy

DEPLOYMENT_FOLDERS = ("../deployments", "../.sandbox")
# How many lines of a starting server's log a button shows while it follows the start.
TAIL_LINES = 12


class DeploymentForm:
    """The deployment file to use and dotted overrides (``server.port=8001``), as a form.

    Read the choice with :meth:`load` in the cells after the form; change it and run them
    again. Headless it shows the values it was given. Above the form comes the session's
    header (UTC time, user, machine, deployment, parameters, opsbook version, where the record
    goes); in JupyterLab, showing the form starts the session's run folder
    (:mod:`opsbook.runner.session`), which records every cell run from then on and every
    deployment loaded, and offers "File this run"; a note in the form says the
    outputs below are the runbook's example until their cells run. In JupyterLab a relative
    ``OPSBOOK_DEPLOYMENT`` is looked for where JupyterLab was started
    (:mod:`opsbook.runner.first_contact`); what is wrong with the choice (no file, an override
    that is no deployment key, a file that does not load) is said at the form, never as a
    traceback, and the session starts once a deployment loads.

    Args:
        deployment: the notebook's ``deployment`` parameter.
        folders: where to look for other deployment files.
        notebook: the notebook's name (``02_config_patch``), for the record.
        parameters: the notebook's parameters, for the header and the record.
        namespace: a stage notebook's variables (its ``globals()``): its parameters are those
            of its stage (:func:`opsbook.stages.parameters_of`), their values read from here.
    """

    def __init__(
        self,
        deployment: str,
        folders: Iterable[str] = DEPLOYMENT_FOLDERS,
        *,
        notebook: str = "notebook",
        parameters: dict[str, Any] | None = None,
        namespace: Mapping[str, Any] | None = None,
    ):
        # Headless the path is read as given, as it always was; in JupyterLab a relative
        # OPSBOOK_DEPLOYMENT is looked for where JupyterLab was started.
        self.located: first_contact.Located | None = None
        if has_frontend():
            self.located = locate(deployment)
            if self.located.from_env and self.located.found:
                deployment = self.located.found  # the notebook's own path reads as it did
        self.choices = list(dict.fromkeys([deployment, *find_deployments(folders)]))
        if self.located is not None and self.located.missing:
            self.choices.remove(deployment)
        self._path = deployment
        self._overrides = ""
        self._widget: Any = None
        self._note: Any = None
        self._session_waits = False
        self.notebook = notebook
        if namespace is not None:
            parameters = stage_parameters(notebook, namespace)
        self.parameters = dict(parameters or {})

    @property
    def path(self) -> str:
        if self._widget is None or self._widget.children[0].value is None:
            return self._path
        return str(self._widget.children[0].value)

    @property
    def overrides(self) -> dict[str, Any]:
        text = str(self._widget.children[1].value) if self._widget is not None else self._overrides
        return parse_overrides(text)

    def load(self) -> Deployment:
        """The chosen deployment with the overrides applied. In JupyterLab, when the form was
        first drawn without one, the session starts here (its header shown in this cell)."""
        chosen = load_deployment(self.path, self.overrides)
        if SESSION is not None and SESSION.notebook == self.notebook and has_frontend():
            SESSION.touch(chosen, self.path)  # a deployment switched to joins the record
        if self._session_waits:
            from IPython.display import display

            self._session_waits = False
            session = self._session(chosen)
            display(SessionHeader.of(session))
            display(file_gate(session))
        return chosen

    def problem(self) -> str:
        """What is wrong with the choice as it stands, said at the form ("" when nothing):
        no deployment file, an override that is no deployment key, a file that does not load."""
        if self.located is not None and self.located.missing and self.path == self._path:
            return first_contact.what_to_do(self.located)
        try:
            overrides = self.overrides
        except ValueError as e:
            return f"overrides: {e}"
        unknown = [first_contact.unknown_override(key) for key in overrides]
        if any(unknown):
            return "overrides: " + "; ".join(filter(None, unknown))
        try:
            load_deployment(self.path, overrides)
        except DeploymentError as e:
            return str(e)
        return ""

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        if not has_frontend():
            display(SessionHeader.headless(self.notebook, self.path, self.parameters))
            display(HTML(f"<p>deployment: <code>{html.escape(self.path)}</code></p>"))
            return
        form = _widget_bundle(self._form(), f"[form: deployment {self.path}]")
        if self.problem():
            # Nothing to record yet: the session starts once a deployment loads (load()).
            self._session_waits = True
            display(form, raw=True)
            return
        session = self._session(self.load())
        display(SessionHeader.of(session))
        display(form, raw=True)
        display(file_gate(session))

    def _session(self, deployment: Deployment) -> session_records.Session:
        """This kernel's session, started anew for another notebook or after filing."""
        global SESSION
        if SESSION is None or SESSION.filed or SESSION.notebook != self.notebook:
            if SESSION is not None:
                SESSION.stop_recording_cells()
            SESSION = session_records.start(self.notebook, deployment, self.path, self.parameters)
            # In JupyterLab only: headless the executed notebook is the record.
            SESSION.record_this_kernel()
        return SESSION

    def _form(self) -> Any:
        import ipywidgets as w

        if self._widget is None:
            wide = {"width": "95%"}
            picker = w.Dropdown(
                options=self.choices,
                value=self._path if self._path in self.choices else None,
                description="deployment",
                layout=wide,
            )
            overrides = w.Text(
                value=self._overrides,
                description="overrides",
                placeholder="server.port=8001, model.path=/data/other",
                layout=wide,
            )
            self._note = w.HTML(layout=wide)
            # Said at the field as it is typed: no cell runs again, no button is drawn again.
            picker.observe(lambda _: self._show_problem(), names="value")
            overrides.observe(lambda _: self._show_problem(), names="value")
            example = w.HTML(example_note_html(), layout=wide)
            self._widget = w.VBox([picker, overrides, self._note, example])
            self._show_problem()
        return self._widget

    def _show_problem(self) -> None:
        problem = self.problem()
        self._note.value = (
            f"<pre class='opsbook-form-problem' style='color:#cf222e;white-space:pre-wrap'>"
            f"{html.escape(problem, quote=False)}</pre>"
            if problem
            else ""
        )


def locate(deployment: str) -> first_contact.Located:
    """Where ``deployment`` is, as the kernel of a notebook open in JupyterLab finds it."""
    return first_contact.locate_deployment(
        deployment,
        from_env=bool(deployment) and deployment == os.environ.get(DEPLOYMENT_ENV),
        start_dirs=first_contact.server_start_dirs(),
        notebook_dir=Path.cwd(),
    )


# Said under the form in JupyterLab. A widget, so that the saved notebook and its record keep
# only the form's text stand-in, not this note about outputs they no longer hold.
EXAMPLE_NOTE = (
    "Until a cell below runs in this session, its output is the EXAMPLE stored with the "
    "runbook, from the rehearsal host (simulated GPUs on 127.0.0.x), not from this "
    "deployment's hosts. Run > Run Selected Cell and All Below replaces it."
)


def example_note_html() -> str:
    return (
        "<div class='opsbook-example-note' style='border:2px solid #bf8700;"
        "background:#fff8c5;color:#000;padding:4px 8px;margin:4px 0'>"
        f"<b>Example output below</b>: {html.escape(EXAMPLE_NOTE)}</div>"
    )


def stage_parameters(notebook: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values in ``namespace`` of the parameters of the stage whose notebook is ``notebook``
    (``deployment`` aside), in its parameters cell's order; one a notebook copied before the
    stage had it does not declare is left out.

    Raises:
        RunError: the notebook is not a stage's.
    """
    from opsbook import stages

    declared = stages.parameters_of(stages.get(notebook))
    return {p.name: namespace[p.name] for p in declared if p.name in namespace}


# The session this kernel records, started by the first deployment form shown in JupyterLab.
SESSION: session_records.Session | None = None


@dataclass(frozen=True)
class SessionHeader:
    """The header of an executed notebook: when, who, where, what, and where it is filed."""

    notebook: str
    started: str
    user: str
    machine: str
    version: str
    deployment: str
    parameters: dict[str, str]
    record: str

    @classmethod
    def of(cls, session: session_records.Session) -> SessionHeader:
        return cls(
            session.notebook,
            f"{session.started:%Y-%m-%d %H:%M:%S} UTC",
            session.user,
            session.machine,
            session.version,
            session.deployment,
            session.parameters,
            f"{session.folder} (written as the session goes; 'File this run' seals it)",
        )

    @classmethod
    def headless(cls, notebook: str, deployment: str, parameters: dict[str, Any]) -> SessionHeader:
        journal = os.environ.get(JOURNAL_ENV, "")
        record = str(Path(journal).parent) if journal else "none (not run by `opsbook run`)"
        return cls(
            notebook,
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            session_records.user_name(),
            socket.gethostname(),
            __version__,
            deployment,
            {k: shown(str(v)) for k, v in parameters.items()},
            record,
        )

    def rows(self) -> list[tuple[str, str]]:
        params = ", ".join(f"{k}={v}" for k, v in self.parameters.items()) or "none"
        return [
            ("notebook", self.notebook),
            ("started", self.started),
            ("user", f"{self.user} on {self.machine}"),
            ("deployment", self.deployment),
            ("parameters", params),
            ("opsbook", self.version),
            ("record", self.record),
        ]

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        return f"<table class='opsbook-header'>{cells}</table>"

    def __repr__(self) -> str:
        return "\n".join(f"{k:<11} {v}" for k, v in self.rows())


def file_gate(session: session_records.Session) -> Gate:
    """The "File this run" button of a session."""
    return Gate(
        "File this run",
        session.file,
        unavailable=lambda: f"filed: {session.folder} is read-only" if session.filed else "",
    )


def find_deployments(folders: Iterable[str]) -> list[str]:
    """Deployment files in ``folders`` (and the rehearsal hosts' ``*/deployment.yml``)."""
    found: set[str] = set()
    for folder in folders:
        base = Path(folder)
        found.update(str(p) for p in base.glob("*.yml"))
        found.update(str(p) for p in base.glob("*/deployment.yml"))
    return sorted(found)


def parse_overrides(text: str) -> dict[str, Any]:
    """``"a.b=1, c=x"`` as ``{"a.b": 1, "c": "x"}``; values are read as YAML scalars.

    Raises:
        ValueError: an item has no ``=``.
    """
    import yaml

    result: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not KEY=VALUE (e.g. server.port=8001)")
        result[key.strip()] = yaml.safe_load(value.strip()) if value.strip() else ""
    return result


class Gate:
    """A step that changes the host, run once it is confirmed.

    In JupyterLab it shows a button and, under it, the record of what the button did: who
    clicked, when (UTC), how long it took and the result, written as ordinary output (HTML and
    text) so that it survives saving the notebook and its HTML export, where a widget would
    leave ``Button(...)``. While the step runs, :meth:`say` shows its progress there. After
    the step, ``after`` runs (the notebook refreshes the outputs the step changed), and the
    button is enabled again only when ``unavailable`` gives no reason against it.

    Args:
        label: what the button says, e.g. "Apply the patch"; or a function giving it.
        action: the step.
        unavailable: why there is nothing to do now ("" when there is); the button is
            disabled and the reason shown.
        after: run after each click (refresh what depends on the step).
    """

    def __init__(
        self,
        label: str | Callable[[], str],
        action: Callable[[], Result],
        *,
        unavailable: Callable[[], str] | None = None,
        after: Callable[[], None] | None = None,
    ):
        self._label = label
        self.action = action
        self.unavailable = unavailable or (lambda: "")
        self.after = after
        self.result: Result | None = None
        self.history: list[Click] = []
        self._button: Any = None
        self._record: Any = None
        self._following: dict[str, Any] = {}

    @property
    def label(self) -> str:
        return self._label() if callable(self._label) else self._label

    def run(self) -> Result:
        self.result = self.action()
        return self.result

    @property
    def outcome(self) -> Result:
        """The step's result, or why it has not run."""
        if self.result is not None:
            return self.result
        if not has_frontend():
            return Result(True, f"dry run: '{self.label}' not done (apply=False)")
        return Result(False, f"not confirmed: click '{self.label}' above")

    def say(self, text: str, detail: str = "") -> None:
        """Show the running step's progress under the button, with ``detail`` (a log's last
        lines) as preformatted text (no-op headless)."""
        if self._record is not None:
            self._record.update(_Page([*self.history, _Running(self.label, text, detail)]))

    def follow(self, host: str, progress: Any) -> None:
        """Show a starting server's progress on each host, with its log's last lines (an
        ``on_progress`` for the launch stage: ``progress`` is a :class:`launch.Progress`)."""
        self._following[host] = progress
        lines = [
            f"{name}: {p.state} {p.phase or ''} after {p.seconds:.0f} s"
            for name, p in self._following.items()
        ]
        tails = "\n\n".join(
            f"== {name} ==\n" + "\n".join(p.tail.splitlines()[-TAIL_LINES:])
            for name, p in self._following.items()
        )
        self.say("; ".join(lines), shown(tails))

    def click(self) -> Click:
        """What a click does: run the step, record it, refresh the page, re-check the button."""
        label = self.label  # as it read when clicked; the step changes what it counts
        hosts = self._starting()
        started = datetime.now(timezone.utc)
        clock = time.monotonic()
        self._following = {}
        self.say("started")
        try:
            result = self.run()
        except Exception as e:  # the page says what went wrong; the kernel stays usable
            result = Result(False, f"{type(e).__name__}: {e}")
        finally:
            self._finished()
        took = time.monotonic() - clock
        entry = Click(label, started, took, session_records.user_name(), result, hosts)
        self.history.append(entry)
        if SESSION is not None:
            SESSION.note_click(entry)
        if self._record is not None:
            self._record.update(_Page(self.history))
        if self.after is not None:
            self.after()
        # Every button of the page: this step may have given another one something to do.
        for gate in [self, *(g for g in GATES if g is not self)]:
            gate._refresh_button()
        if SESSION is not None:
            SESSION.save_notebook()  # the click's record under its button, and the redraw
        return entry

    def _starting(self) -> tuple[str, ...]:
        """Before the step runs: the hosts it acts on (none named here)."""
        return ()

    def _finished(self) -> None:
        """After the step ran, before the page is drawn again."""

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.result is not None or not has_frontend():
            display(self.outcome)
            return
        display(_widget_bundle(self._make_button(), f"[button: {self.label}]"), raw=True)
        GATES.append(self)
        self._record = display(_Page(self.history, self.unavailable()), display_id=True)

    def _make_button(self) -> Any:
        import ipywidgets as w

        button = w.Button(
            description=self.label, button_style="warning", icon="check", layout={"width": "auto"}
        )

        button.on_click(lambda _: self._pressed())
        self._button = button
        self._refresh_button()
        return button

    def _pressed(self) -> None:
        """The button was clicked: run the step."""
        self._button.disabled = True
        self._button.description = f"{self.label} (running)"
        self.click()

    def _refresh_button(self) -> None:
        if self._button is None:
            return
        reason = self.unavailable()
        self._button.description = self.label
        self._button.disabled = bool(reason)
        self._button.tooltip = reason or self.label
        if self._record is not None and not self.history:
            self._record.update(_Page(self.history, reason))
        elif self._record is not None:
            self._record.update(_Page(self.history, reason))


@dataclass(frozen=True)
class Click:
    """One click of a button: what, when (UTC), how long, by whom, and what came of it."""

    label: str
    started: datetime
    seconds: float
    user: str
    result: Result
    hosts: tuple[str, ...] = ()

    @property
    def on_hosts(self) -> str:
        """The hosts the click acted on, as a phrase ("" when the step names none)."""
        return f" on {', '.join(self.hosts)}" if self.hosts else ""

    def line(self) -> str:
        mark = "done" if self.result.ok else "FAILED"
        return (
            f"{self.started:%Y-%m-%d %H:%M:%S} UTC  {self.user} clicked '{self.label}'"
            f"{self.on_hosts}: {mark} in {self.seconds:.1f} s: {shown(self.result.message)}"
        )

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.result.ok else "#cf222e"
        head = (
            f'<p style="margin:2px 0"><code>{self.started:%Y-%m-%d %H:%M:%S} UTC</code> '
            f"<b>{html.escape(self.user)}</b> clicked <i>{html.escape(self.label)}</i>"
            f"{html.escape(self.on_hosts)} "
            f'({self.seconds:.1f} s): <span style="color:{colour}">'
            f"{html.escape(shown(self.result.message))}</span></p>"
        )
        problems = [f for f in self.result.findings if f.severity in ("warning", "error")]
        if not problems:
            return head
        return head + Result(self.result.ok, "", findings=problems).findings_table()._repr_html_()


@dataclass(frozen=True)
class _Running:
    label: str
    text: str
    detail: str = ""

    def line(self) -> str:
        return f"running '{self.label}': {self.text}" + (f"\n{self.detail}" if self.detail else "")

    def _repr_html_(self) -> str:
        head = f"<p><b>running</b> <i>{html.escape(self.label)}</i>: {html.escape(self.text)}</p>"
        if not self.detail:
            return head
        return head + f"<pre class='opsbook-log-tail'>{html.escape(self.detail)}</pre>"


class _Page:
    """What a gate's record shows: its clicks so far, and why the button is disabled."""

    def __init__(self, entries: Iterable[Click | _Running], reason: str = ""):
        self.entries = list(entries)
        self.reason = reason

    def _repr_html_(self) -> str:
        parts = [e._repr_html_() for e in self.entries]
        if self.reason:
            parts.append(f"<p><i>nothing to do: {html.escape(self.reason)}</i></p>")
        return "".join(parts) or "<p><i>not clicked yet</i></p>"

    def __repr__(self) -> str:
        lines = [e.line() for e in self.entries]
        if self.reason:
            lines.append(f"nothing to do: {self.reason}")
        return "\n".join(lines) or "not clicked yet"


def confirm(
    label: str | Callable[[], str],
    action: Callable[[], Result],
    *,
    apply: bool,
    unavailable: Callable[[], str] | None = None,
    after: Callable[[], None] | None = None,
) -> Gate:
    """A gate before ``action``: a button to click in JupyterLab; headless, run now only
    when ``apply`` is True."""
    gate = Gate(label, action, unavailable=unavailable, after=after)
    if apply and not has_frontend():
        gate.run()
    return gate


class FleetGate(Gate):
    """A step on the hosts the operator chooses, run once confirmed by their names.

    Above the button, a checkbox per host that ``choice`` offers (with its state as last
    seen), ticked for the hosts that need the step (``choice().default``); a host that does
    not, a healthy serving one, is acted on only when ticked. A click on the button asks
    "Confirm: restart the server on host-02, host-03" and runs nothing; the confirming click
    runs the step on exactly those hosts. While it runs, each of them is marked with
    ``doing`` ("restarting") in every live output (:func:`refresh`); after it, the ticks go
    back to what the new state needs.

    Args:
        name: what the step does, e.g. "Restart the server"; or a function giving it.
        action: the step, given the chosen hosts' names.
        choice: the hosts offered and those chosen by default, as of now.
        doing: what a host is doing while the step runs ("restarting").
        unavailable: why there is nothing to do now, whatever is ticked ("" when there is).
        after: run after each click (refresh what depends on the step).
    """

    def __init__(
        self,
        name: str | Callable[[], str],
        action: Callable[[list[str]], Result],
        *,
        choice: Callable[[], HostChoice],
        doing: str | Callable[[], str],
        unavailable: Callable[[], str] | None = None,
        after: Callable[[], None] | None = None,
    ):
        super().__init__(
            lambda: f"{self.name} on {len(self.acting_on())} host(s)",
            lambda: action(list(self.acting_on())),
            unavailable=self._why_not,
            after=after,
        )
        self._name = name
        self._choice = choice
        self._doing = doing
        self._reason = unavailable or (lambda: "")
        self.offered: dict[str, str] = {}
        self.ticked: list[str] = []
        self.pending: tuple[str, ...] | None = None
        self._running: tuple[str, ...] = ()
        self._boxes: Any = None
        self._confirm: Any = None
        self._cancel: Any = None
        self.reset()

    @property
    def name(self) -> str:
        return self._name() if callable(self._name) else self._name

    @property
    def doing(self) -> str:
        return self._doing() if callable(self._doing) else self._doing

    def reset(self) -> None:
        """Offer the hosts as they are now and tick the ones that need the step."""
        found = self._choice()
        self.offered = dict(found.offered)
        self.ticked = list(found.default)

    def choose(self, names: Iterable[str]) -> None:
        """Tick exactly ``names`` (those offered), as the operator's clicks on the boxes do."""
        wanted = set(names)
        self.ticked = [name for name in self.offered if name in wanted]
        if self._boxes is not None:
            for row in self._boxes.children:
                row.children[0].value = row.children[0].description in wanted
        self._sync()

    def acting_on(self) -> tuple[str, ...]:
        """The hosts the step runs on: those confirmed, else those ticked now."""
        return self.pending if self.pending is not None else tuple(self.ticked)

    def ask(self) -> str:
        """The first click: hold the ticked hosts and say what the confirming click does."""
        self.pending = tuple(self.ticked)
        return self.confirmation(self.pending)

    def cancel(self) -> None:
        self.pending = None
        self._sync()

    def confirmation(self, names: Iterable[str]) -> str:
        """The confirming button's words, naming each host: "Confirm: restart the server on
        host-02, host-03"."""
        name = self.name
        return f"Confirm: {name[:1].lower()}{name[1:]} on {', '.join(names)}"

    def _why_not(self) -> str:
        reason = self._reason()
        if reason or self.ticked or self.pending:
            return reason
        return "no host chosen: tick the hosts to act on above"

    def follow(self, host: str, progress: Any) -> None:
        """As :meth:`Gate.follow`, and the host's sections say how far it got."""
        before = BUSY.get(host)
        BUSY[host] = f"{self.doing}: {progress.state} {progress.phase or ''}".strip()
        if BUSY[host] != before:
            refresh()
        super().follow(host, progress)

    def _pressed(self) -> None:
        """The first click only asks: the confirming button runs the step."""
        self.ask()
        self._sync()

    def _starting(self) -> tuple[str, ...]:
        self._running = self.acting_on()
        BUSY.update(dict.fromkeys(self._running, self.doing))
        refresh()
        return self._running

    def _finished(self) -> None:
        for name in self._running:
            BUSY.pop(name, None)
        self._running = ()
        self.pending = None

    def _make_button(self) -> Any:
        import ipywidgets as w

        button = super()._make_button()
        self._boxes = w.VBox([])
        self._confirm = w.Button(button_style="danger", icon="check", layout={"width": "auto"})
        self._cancel = w.Button(description="Cancel", layout={"width": "auto"})

        def confirmed(_: Any) -> None:
            self._confirm.disabled = self._cancel.disabled = True
            self._confirm.description = f"{self._confirm.description} (running)"
            self.click()

        self._confirm.on_click(confirmed)
        self._cancel.on_click(lambda _: self.cancel())
        self._refresh_button()
        return w.VBox([self._boxes, w.HBox([button, self._confirm, self._cancel])])

    def _refresh_button(self) -> None:
        if self._boxes is None:
            return
        import ipywidgets as w

        self.reset()
        boxes = []
        for name, state in self.offered.items():
            box = w.Checkbox(
                value=name in self.ticked, description=name, indent=False,
                tooltip=state, layout={"width": "auto"},
            )  # fmt: skip
            box.observe(lambda _: self._ticks_changed(), names="value")
            boxes.append(w.HBox([box, w.HTML(f"<i>{html.escape(shown(state))[:160]}</i>")]))
        self._boxes.children = boxes
        self._sync()

    def _ticks_changed(self) -> None:
        rows = self._boxes.children
        ticked = {row.children[0].description for row in rows if row.children[0].value}
        self.ticked = [name for name in self.offered if name in ticked]
        self._sync()

    def _sync(self) -> None:
        """Draw the button, the boxes and the confirmation as the ticks and the step stand."""
        if self._boxes is None:
            return
        asking = self.pending is not None
        for row in self._boxes.children:
            row.children[0].disabled = asking
        super()._refresh_button()
        self._button.layout.display = "none" if asking else None
        self._confirm.layout.display = self._cancel.layout.display = None if asking else "none"
        self._confirm.disabled = self._cancel.disabled = False
        self._confirm.description = self.confirmation(self.pending or ()) if asking else ""


def confirm_on_hosts(
    name: str | Callable[[], str],
    action: Callable[[list[str]], Result],
    *,
    choice: Callable[[], HostChoice],
    doing: str | Callable[[], str],
    apply: bool,
    unavailable: Callable[[], str] | None = None,
    after: Callable[[], None] | None = None,
) -> FleetGate:
    """A :class:`FleetGate` before ``action``: host boxes, a button and its confirmation in
    JupyterLab; headless, run now on the default hosts only when ``apply`` is True."""
    gate = FleetGate(name, action, choice=choice, doing=doing, unavailable=unavailable, after=after)
    if apply and not has_frontend():
        gate.run()
    return gate


class Live:
    """An output drawn again, in place, when a button's step changes what it shows.

    ``render`` returns what to show (one object, or a list drawn one after the other).
    :func:`refresh` draws every live output of the page again; a gate's ``after`` calls it.
    """

    def __init__(self, name: str, render: Callable[[], Any]):
        self.name = name
        self.render = render
        self._handle: Any = None
        LIVE[name] = self

    def refresh(self) -> None:
        if self._handle is not None:
            self._handle.update(Combined(while_busy(self.render(), BUSY)))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        shown_now = Combined(self.render())
        if has_frontend():
            self._handle = display(shown_now, display_id=True)
        else:
            for item in shown_now.items:
                display(item)


LIVE: dict[str, Live] = {}
# The buttons shown in this kernel, so that each click re-checks them all.
GATES: list[Gate] = []
# The hosts a button's step is acting on right now, and what it is doing there.
BUSY: dict[str, str] = {}


def live(name: str, render: Callable[[], Any]) -> Live:
    """A :class:`Live` output named ``name`` (a cell run again replaces its earlier one)."""
    return Live(name, render)


def live_result(name: str, render: Callable[[], Any]) -> Any:
    """In JupyterLab a :class:`Live` output; headless what ``render`` gives, to be the cell's
    result as a bare name at the end of a cell shows it (the stored outputs stay as they were)."""
    return Live(name, render) if has_frontend() else render()


def refresh(*names: str) -> None:
    """Draw the live outputs again: those named, or all of them."""
    for name, view in list(LIVE.items()):
        if not names or name in names:
            view.refresh()


class Combined:
    """Several displayable objects as one output (HTML and text), so that one display can be
    updated in place."""

    def __init__(self, items: Any):
        self.items = list(items) if isinstance(items, (list, tuple)) else [items]

    def _repr_html_(self) -> str:
        parts = []
        for item in self.items:
            if hasattr(item, "_repr_html_"):
                parts.append(item._repr_html_())
            elif hasattr(item, "_repr_svg_"):
                parts.append(f"<div>{item._repr_svg_()}</div>")
            else:
                parts.append(f"<pre>{html.escape(shown(repr(item)))}</pre>")
        return "".join(parts)

    def __repr__(self) -> str:
        return "\n".join(shown(repr(item)) for item in self.items)


def _widget_bundle(widget: Any, text: str) -> dict[str, Any]:
    """A widget's display data with a plain-text stand-in that says what it is, for the saved
    notebook (which keeps no widget state)."""
    return {
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2,
            "version_minor": 0,
            "model_id": widget.model_id,
        },
        "text/plain": text,
    }


class LogTail:
    """The last lines of the server's log, updated in place while waiting for readiness."""

    def __init__(self, lines: int = 12):
        self.lines = lines
        self._widget: Any = None

    def update(self, text: str) -> None:
        if not has_frontend():
            return
        import ipywidgets as w
        from IPython.display import display

        tail = "\n".join(text.rstrip().splitlines()[-self.lines :])
        if self._widget is None:
            self._widget = w.Textarea(
                value=tail, disabled=True, layout={"width": "95%", "height": "16em"}
            )
            display(self._widget)
        else:
            self._widget.value = tail
