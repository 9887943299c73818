"""Forms and confirm buttons for stepping through the runbook in JupyterLab.

Every step that changes the host goes through :func:`confirm`. With someone at the notebook it
shows a button and runs the step only when clicked; headless (``opsbook run``, nbval) it runs
the step at once when ``apply`` is True and never otherwise, so nothing waits for a click.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from opsbook.deployment import Deployment, load_deployment
from opsbook.progress import has_frontend
from opsbook.results import Result

DEPLOYMENT_FOLDERS = ("../deployments", "../.sandbox")


class DeploymentForm:
    """The deployment file to use and dotted overrides (``server.port=8001``), as a form.

    Read the choice with :meth:`load` in the cells after the form; change it and run them
    again. Headless it shows the values it was given.

    Args:
        deployment: the notebook's ``deployment`` parameter.
        folders: where to look for other deployment files.
    """

    def __init__(self, deployment: str, folders: Iterable[str] = DEPLOYMENT_FOLDERS):
        self.choices = list(dict.fromkeys([deployment, *find_deployments(folders)]))
        self._path = deployment
        self._overrides = ""
        self._widget: Any = None

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
            display(HTML(f"<p>deployment: <code>{html.escape(self.path)}</code></p>"))
            return
        display(self._form())

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

    Args:
        label: what the button says, e.g. "Apply the patch".
        action: the step.
    """

    def __init__(self, label: str, action: Callable[[], Result]):
        self.label = label
        self.action = action
        self.result: Result | None = None
        self._output: Any = None

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
        return Result(False, f"not confirmed: click '{self.label}' above, then run the next cells")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.result is not None or not has_frontend():
            display(self.outcome)
            return
        display(self._button())

    def _button(self) -> Any:
        import ipywidgets as w
        from IPython.display import display

        button = w.Button(description=self.label, button_style="warning", icon="check")
        self._output = w.Output()

        def clicked(_: Any) -> None:
            button.disabled = True
            with self._output:
                display(self.run())

        button.on_click(clicked)
        return w.VBox([button, self._output])


def confirm(label: str, action: Callable[[], Result], *, apply: bool) -> Gate:
    """A gate before ``action``: a button to click in JupyterLab; headless, run now only
    when ``apply`` is True."""
    gate = Gate(label, action)
    if apply and not has_frontend():
        gate.run()
    return gate


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
