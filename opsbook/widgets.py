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
from opsbook.core.channel import JOURNAL_ENV
from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.results import Result, shown
from opsbook.runner import session as session_records
from opsbook.runner.progress import has_frontend

DEPLOYMENT_FOLDERS = ("../deployments", "../.sandbox")
# How many lines of a starting server's log a button shows while it follows the start.
TAIL_LINES = 12


class DeploymentForm:
    """The deployment file to use and dotted overrides (``server.port=8001``), as a form.

    Read the choice with :meth:`load` in the cells after the form; change it and run them
    again. Headless it shows the values it was given. Above the form comes the session's
    header (UTC time, user, machine, deployment, parameters, opsbook version, where the record
    goes); in JupyterLab, showing the form starts the session's run folder
    (:mod:`opsbook.runner.session`) and offers "File this run".

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
        self.choices = list(dict.fromkeys([deployment, *find_deployments(folders)]))
        self._path = deployment
        self._overrides = ""
        self._widget: Any = None
        self.notebook = notebook
        if namespace is not None:
            parameters = stage_parameters(notebook, namespace)
        self.parameters = dict(parameters or {})

    @property
    def path(self) -> str:
        return str(self._widget.children[0].value) if self._widget is not None else self._path

    @property
    def overrides(self) -> dict[str, Any]:
        text = str(self._widget.children[1].value) if self._widget is not None else self._overrides
        return parse_overrides(text)

    def load(self) -> Deployment:
        """The chosen deployment with the overrides applied."""
        return load_deployment(self.path, self.overrides)

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        if not has_frontend():
            display(SessionHeader.headless(self.notebook, self.path, self.parameters))
            display(HTML(f"<p>deployment: <code>{html.escape(self.path)}</code></p>"))
            return
        global SESSION
        if SESSION is None or SESSION.filed or SESSION.notebook != self.notebook:
            SESSION = session_records.start(self.notebook, self.load(), self.path, self.parameters)
        display(SessionHeader.of(SESSION))
        display(_widget_bundle(self._form(), f"[form: deployment {self.path}]"), raw=True)
        display(file_gate(SESSION))

    def _form(self) -> Any:
        import ipywidgets as w

        if self._widget is None:
            wide = {"width": "95%"}
            picker = w.Dropdown(
                options=self.choices, value=self._path, description="deployment", layout=wide
            )
            overrides = w.Text(
                value=self._overrides,
                description="overrides",
                placeholder="server.port=8001, model.path=/data/other",
                layout=wide,
            )
            self._widget = w.VBox([picker, overrides])
        return self._widget


def stage_parameters(notebook: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The values in ``namespace`` of the parameters of the stage whose notebook is ``notebook``
    (``deployment`` aside), in its parameters cell's order.

    Raises:
        RunError: the notebook is not a stage's.
    """
    from opsbook import stages

    return {p.name: namespace[p.name] for p in stages.parameters_of(stages.get(notebook))}


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
            f"{session.folder} (journal.jsonl; file it when done)",
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
        started = datetime.now(timezone.utc)
        clock = time.monotonic()
        self._following = {}
        self.say("started")
        try:
            result = self.run()
        except Exception as e:  # the page says what went wrong; the kernel stays usable
            result = Result(False, f"{type(e).__name__}: {e}")
        took = time.monotonic() - clock
        entry = Click(label, started, took, session_records.user_name(), result)
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
        return entry

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

        def clicked(_: Any) -> None:
            button.disabled = True
            button.description = f"{self.label} (running)"
            self.click()

        button.on_click(clicked)
        self._button = button
        self._refresh_button()
        return button

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

    def line(self) -> str:
        mark = "done" if self.result.ok else "FAILED"
        return (
            f"{self.started:%Y-%m-%d %H:%M:%S} UTC  {self.user} clicked '{self.label}': "
            f"{mark} in {self.seconds:.1f} s: {shown(self.result.message)}"
        )

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.result.ok else "#cf222e"
        head = (
            f'<p style="margin:2px 0"><code>{self.started:%Y-%m-%d %H:%M:%S} UTC</code> '
            f"<b>{html.escape(self.user)}</b> clicked <i>{html.escape(self.label)}</i> "
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
            self._handle.update(Combined(self.render()))

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


def live(name: str, render: Callable[[], Any]) -> Live:
    """A :class:`Live` output named ``name`` (a cell run again replaces its earlier one)."""
    return Live(name, render)


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
