"""Confirm buttons before every step that changes a host, and the record of their clicks.

Every step that changes the host goes through :func:`confirm` (or :func:`confirm_on_hosts`,
for a step on the hosts the operator ticks). With someone at the notebook it shows a button and
runs the step only when clicked; headless (``opsbook run``, nbval) it runs the step at once when
``apply`` is True and never otherwise, so nothing waits for a click.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from opsbook.core.results import Result, shown
from opsbook.runner import session as session_records
from opsbook.stages.base import HostChoice
from opsbook.widgets import page_state
from opsbook.widgets.live import refresh, widget_bundle

# How many lines of a starting server's log a button shows while it follows the start.
TAIL_LINES = 12


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
        if not page_state.has_frontend():
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
        if page_state.SESSION is not None:
            page_state.SESSION.note_click(entry)
        if self._record is not None:
            self._record.update(_Page(self.history))
        if self.after is not None:
            self.after()
        # Every button of the page: this step may have given another one something to do.
        for gate in [self, *(g for g in page_state.GATES if g is not self)]:
            gate._refresh_button()
        if page_state.SESSION is not None:
            # The click's record under its button, and the redraw.
            page_state.SESSION.save_notebook()
        return entry

    def _starting(self) -> tuple[str, ...]:
        """Before the step runs: the hosts it acts on (none named here)."""
        return ()

    def _finished(self) -> None:
        """After the step ran, before the page is drawn again."""

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if self.result is not None or not page_state.has_frontend():
            display(self.outcome)
            return
        display(widget_bundle(self._make_button(), f"[button: {self.label}]"), raw=True)
        page_state.GATES.append(self)
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
    if apply and not page_state.has_frontend():
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
        before = page_state.BUSY.get(host)
        page_state.BUSY[host] = f"{self.doing}: {progress.state} {progress.phase or ''}".strip()
        if page_state.BUSY[host] != before:
            refresh()
        super().follow(host, progress)

    def _pressed(self) -> None:
        """The first click only asks: the confirming button runs the step."""
        self.ask()
        self._sync()

    def _starting(self) -> tuple[str, ...]:
        self._running = self.acting_on()
        page_state.BUSY.update(dict.fromkeys(self._running, self.doing))
        refresh()
        return self._running

    def _finished(self) -> None:
        for name in self._running:
            page_state.BUSY.pop(name, None)
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
    if apply and not page_state.has_frontend():
        gate.run()
    return gate
