"""The deployment form at the top of each notebook: which deployment file, which overrides, and
what is wrong with the choice, said at the form."""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from opsbook.core.channel import DEPLOYMENT_ENV
from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.runner import session as session_records
from opsbook.widgets import first_contact, page_state
from opsbook.widgets.live import widget_bundle
from opsbook.widgets.session_header import SessionHeader, file_gate

DEPLOYMENT_FOLDERS = ("../deployments", "../.sandbox")


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
    (:mod:`opsbook.widgets.first_contact`); what is wrong with the choice (no file, an override
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
        if page_state.has_frontend():
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
        session = page_state.SESSION
        if session is not None and session.notebook == self.notebook and page_state.has_frontend():
            session.touch(chosen, self.path)  # a deployment switched to joins the record
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

        if not page_state.has_frontend():
            display(SessionHeader.headless(self.notebook, self.path, self.parameters))
            display(HTML(f"<p>deployment: <code>{html.escape(self.path)}</code></p>"))
            return
        form = widget_bundle(self._form(), f"[form: deployment {self.path}]")
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
        session = page_state.SESSION
        if session is None or session.filed or session.notebook != self.notebook:
            if session is not None:
                session.stop_recording_cells()
            session = session_records.start(self.notebook, deployment, self.path, self.parameters)
            page_state.SESSION = session
            # In JupyterLab only: headless the executed notebook is the record.
            session.record_this_kernel()
        return session

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
