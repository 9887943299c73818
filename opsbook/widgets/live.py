"""Outputs drawn again in place when a button's step changes what they show, and the display
helpers the form and the buttons share."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from opsbook.core.results import shown
from opsbook.stages.base import while_busy
from opsbook.widgets import page_state


class Live:
    """An output drawn again, in place, when a button's step changes what it shows.

    ``render`` returns what to show (one object, or a list drawn one after the other).
    :func:`refresh` draws every live output of the page again; a gate's ``after`` calls it.
    """

    def __init__(self, name: str, render: Callable[[], Any]):
        self.name = name
        self.render = render
        self._handle: Any = None
        page_state.LIVE[name] = self

    def refresh(self) -> None:
        if self._handle is not None:
            self._handle.update(Combined(while_busy(self.render(), page_state.BUSY)))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        shown_now = Combined(self.render())
        if page_state.has_frontend():
            self._handle = display(shown_now, display_id=True)
        else:
            for item in shown_now.items:
                display(item)


def live(name: str, render: Callable[[], Any]) -> Live:
    """A :class:`Live` output named ``name`` (a cell run again replaces its earlier one)."""
    return Live(name, render)


def live_result(name: str, render: Callable[[], Any]) -> Any:
    """In JupyterLab a :class:`Live` output; headless what ``render`` gives, to be the cell's
    result as a bare name at the end of a cell shows it (the stored outputs stay as they were)."""
    return Live(name, render) if page_state.has_frontend() else render()


def refresh(*names: str) -> None:
    """Draw the live outputs again: those named, or all of them."""
    for name, view in list(page_state.LIVE.items()):
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


def widget_bundle(widget: Any, text: str) -> dict[str, Any]:
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
        if not page_state.has_frontend():
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
