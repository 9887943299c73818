"""The cells of an interactive session, written as they run: ``cells.jsonl`` and ``session.ipynb``.

A :class:`CellRecorder` attached to the kernel's IPython shell (by the deployment form, in
JupyterLab only) appends one line per executed cell to ``cells.jsonl``: its source and its
outputs as the operator saw them (what it printed, what it displayed, its result, its error),
redacted as the journal is. An output drawn again in place later (a button's record, a live
verdict) is written as an ``update`` line. ``session.ipynb`` is made again from those lines
after each cell and each click, so a closed tab or a dead kernel still leaves the notebook up
to its last cell.

The record begins at the kernel's first cell: the cells run before the recorder was attached
(before the form was drawn, or while it waited for a deployment) are written first, from
IPython's history (its ``In`` and ``Out``), marked ``backfilled``: their sources, and their
results as far as IPython kept them (what they printed or displayed it does not keep). A cell
an earlier session of the same kernel recorded is not written again.
"""

from __future__ import annotations

import json
import os
import sys
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CELLS = "cells.jsonl"
NOTEBOOK = "session.ipynb"
# What the notebook says above the cells written from IPython's history.
BACKFILLED_NOTE = (
    "The cells below ran in this kernel before the session's record began (before the "
    "deployment form was drawn): written from IPython's history, with their results as "
    "IPython kept them; what they printed or displayed was not kept."
)

# The last execution count a session recorded, per shell: a later session of the same kernel
# backfills only what came after it.
_RECORDED_THROUGH: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class CellRecorder:
    """Writes a shell's executed cells to a session folder while attached."""

    def __init__(self, folder: Path, redact: Callable[[str], str]):
        self.folder = folder
        self.redact = redact
        self.shell: Any = None
        self._outputs: list[dict[str, Any]] = []
        self._in_cell = False
        self._streams: list[Any] = []
        # The cells run before attaching are written when the first cell ends: only then is
        # the running cell's number known (IPython 9 counts it up before running it, 8 after).
        self._to_backfill = False
        # While IPython draws a display or a result it may echo it to stdout (a terminal
        # shell does): that echo is no output of its own.
        self._muted = False

    @property
    def cells_file(self) -> Path:
        return self.folder / CELLS

    def attach(self, shell: Any) -> None:
        """Record ``shell``'s cells: those it ran before, from its history
        (:meth:`backfill`, written when the running cell ends), then each from now on (the
        running cell's too)."""
        self.shell = shell
        self._to_backfill = True
        self._in_cell = True  # the cell drawing the form is running: its outputs count
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        _put_tee(shell.display_pub, "publish", self._published, self)
        _put_tee(shell, "_showtraceback", self._error_shown, self)
        _put_tee(shell.displayhook, "start_displayhook", self._mute)
        _put_tee(shell.displayhook, "write_format_data", self._result_drawn)
        _put_tee(shell.displayhook, "finish_displayhook", self._unmute, self)
        for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            try:
                _put_tee(stream, "write", self._stream_writer(name))
            except AttributeError:  # a plain terminal's stream: no cell output goes there
                continue
            self._streams.append(stream)

    def detach(self) -> None:
        """Stop recording (filing, or another session replacing this one)."""
        if self.shell is None:
            return
        for event, callback in (("pre_run_cell", self.pre_run_cell),
                                ("post_run_cell", self.post_run_cell)):  # fmt: skip
            if callback in self.shell.events.callbacks[event]:
                self.shell.events.unregister(event, callback)
        _untee(self.shell.display_pub, "publish")
        _untee(self.shell, "_showtraceback")
        for name in ("start_displayhook", "write_format_data", "finish_displayhook"):
            _untee(self.shell.displayhook, name)
        for stream in self._streams:
            _untee(stream, "write")
        self._streams = []
        self.shell = None

    def backfill(self, shell: Any, before: int) -> int:
        """Write the cells ``shell`` ran before the cell numbered ``before`` that no session of
        this kernel recorded, from IPython's history: each cell's source and its result
        (``Out``) when IPython kept one, marked ``backfilled``. Returns how many were written."""
        history = getattr(shell, "history_manager", None)
        sources = list(getattr(history, "input_hist_raw", None) or [])
        results = getattr(history, "output_hist", None) or {}
        first = _recorded_through(shell) + 1
        written = 0
        for count in range(max(first, 1), min(before, len(sources))):
            outputs = self._kept_result(shell, results, count)
            self._write(
                {
                    "kind": "cell",
                    "execution_count": count,
                    "source": self.redact(sources[count]),
                    "outputs": outputs,
                    "finished": None,
                    "ok": None,  # IPython's history does not say whether a cell raised
                    "backfilled": True,
                }
            )
            written += 1
            _note_recorded(shell, count)
        return written

    def _kept_result(self, shell: Any, results: Any, count: int) -> list[dict[str, Any]]:
        if count not in results:
            return []
        value = results[count]
        try:
            if hasattr(type(value), "_ipython_display_"):
                # Formatting it would display it again (the form would draw itself anew in
                # the running cell): its text is what is kept of it.
                plain = shell.display_formatter.formatters["text/plain"]
                data, metadata = {"text/plain": plain(value)}, {}
            else:
                data, metadata = shell.display_formatter.format(value)
        except Exception:  # a result that no longer draws (its repr raises): its source stays
            return []
        return [
            {"output_type": "execute_result", "data": self._redacted(data),
             "metadata": dict(metadata or {}), "execution_count": count}
        ]  # fmt: skip

    def pre_run_cell(self, info: Any = None) -> None:
        self._outputs = []
        self._in_cell = True

    def post_run_cell(self, result: Any) -> None:
        """Write the cell that ended (after those run before the recorder was attached, the
        first time), and the notebook as it now stands."""
        if self._to_backfill and self.shell is not None:
            self._to_backfill = False
            self.backfill(self.shell, before=result.execution_count or 0)
        for output in self._outputs:
            if output["output_type"] == "execute_result":
                output["execution_count"] = result.execution_count
        error = result.error_in_exec or result.error_before_exec
        self._write(
            {
                "kind": "cell",
                "execution_count": result.execution_count,
                "source": self.redact(result.info.raw_cell if result.info else ""),
                "outputs": self._outputs,
                "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "ok": error is None,
            }
        )
        self._outputs = []
        self._in_cell = False
        if self.shell is not None:
            _note_recorded(self.shell, result.execution_count or 0)
        write_notebook(self.folder)

    def _published(self, data: Any, metadata: Any = None, *, transient: Any = None,
                   update: bool = False, **_: Any) -> None:  # fmt: skip
        display_id = (transient or {}).get("display_id")
        if update:
            self._write({"kind": "update", "display_id": display_id,
                         "data": self._redacted(data)})  # fmt: skip
        elif self._in_cell:
            self._outputs.append(
                {"output_type": "display_data", "data": self._redacted(data),
                 "metadata": dict(metadata or {}), "display_id": display_id}
            )  # fmt: skip

    def _error_shown(self, etype: Any, evalue: Any, stb: list[str]) -> None:
        if self._in_cell:
            self._outputs.append(
                {"output_type": "error", "ename": getattr(etype, "__name__", str(etype)),
                 "evalue": self.redact(str(evalue)),
                 "traceback": [self.redact(line) for line in stb]}
            )  # fmt: skip

    def _mute(self, *_: Any) -> None:
        self._muted = True

    def _unmute(self, *_: Any) -> None:
        self._muted = False

    def _result_drawn(self, data: Any, metadata: Any = None) -> None:
        if self._in_cell:
            self._outputs.append(
                {"output_type": "execute_result", "data": self._redacted(data),
                 "metadata": dict(metadata or {}), "execution_count": None}
            )  # fmt: skip

    def _stream_writer(self, name: str) -> Callable[..., None]:
        def written(text: str, *_: Any) -> None:
            if self._in_cell and not self._muted and isinstance(text, str) and text:
                last = self._outputs[-1] if self._outputs else None
                if last and last["output_type"] == "stream" and last["name"] == name:
                    last["text"] += self.redact(text)
                else:
                    self._outputs.append(
                        {"output_type": "stream", "name": name, "text": self.redact(text)}
                    )

        return written

    def _redacted(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            mime: self.redact(value) if isinstance(value, str) and not mime.startswith("image/")
            else value
            for mime, value in data.items()
        }  # fmt: skip

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            with self.cells_file.open("a") as f:
                f.write(json.dumps(doc, default=str) + "\n")
        except OSError:  # a sealed or deleted folder: the session goes on unrecorded
            pass


def _recorded_through(shell: Any) -> int:
    try:
        return _RECORDED_THROUGH.get(shell, 0)
    except TypeError:  # a shell that cannot be weakly referenced: nothing known of it
        return 0


def _note_recorded(shell: Any, count: int) -> None:
    try:
        _RECORDED_THROUGH[shell] = max(_recorded_through(shell), count)
    except TypeError:
        pass


def _tee(original: Callable[..., Any], also: Callable[..., None],
         muting: CellRecorder | None = None) -> Callable[..., Any]:  # fmt: skip
    """``original`` that first tells ``also`` its arguments; with ``muting``, what ``original``
    echoes to the streams is not recorded."""

    def both(*args: Any, **kwargs: Any) -> Any:
        try:
            also(*args, **kwargs)
        finally:
            if muting is None:
                answer = original(*args, **kwargs)
            else:
                was, muting._muted = muting._muted, True
                try:
                    answer = original(*args, **kwargs)
                finally:
                    muting._muted = was
        return answer

    both.__wrapped__ = original  # type: ignore[attr-defined]
    return both


def _put_tee(
    owner: Any, name: str, also: Callable[..., None], muting: CellRecorder | None = None
) -> None:
    setattr(owner, name, _tee(getattr(owner, name), also, muting))


def _untee(owner: Any, name: str) -> None:
    """Take a :func:`_tee` off ``owner``: the class's own method shows through again."""
    if hasattr(vars(owner).get(name), "__wrapped__"):
        delattr(owner, name)


def read_cells(folder: Path) -> list[dict[str, Any]]:
    """The session's cells, each with its outputs as last drawn (updates applied)."""
    source = folder / CELLS
    if not source.is_file():
        return []
    cells: list[dict[str, Any]] = []
    shown: dict[str, dict[str, Any]] = {}
    for line in source.read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a dying kernel
            continue
        if doc.get("kind") == "cell":
            cells.append(doc)
            for output in doc["outputs"]:
                if output.get("display_id"):
                    shown[output["display_id"]] = output
        elif doc.get("kind") == "update" and doc.get("display_id") in shown:
            shown[doc["display_id"]]["data"] = doc["data"]
    return cells


def write_notebook(folder: Path) -> Path | None:
    """``session.ipynb`` from ``cells.jsonl`` (None when no cell was recorded)."""
    import nbformat

    cells = read_cells(folder)
    if not cells:
        return None
    nb = nbformat.v4.new_notebook()
    for number, cell in enumerate(cells):
        backfilled = bool(cell.get("backfilled"))
        if backfilled and (number == 0 or not cells[number - 1].get("backfilled")):
            nb.cells.append(nbformat.v4.new_markdown_cell(f"*{BACKFILLED_NOTE}*"))
        outputs = [
            nbformat.v4.new_output(**{k: v for k, v in o.items() if k != "display_id"})
            for o in cell["outputs"]
        ]
        code = nbformat.v4.new_code_cell(
            cell["source"], execution_count=cell.get("execution_count"), outputs=outputs
        )
        if backfilled:
            code.metadata["opsbook"] = {"backfilled": True}
        nb.cells.append(code)
    target = folder / NOTEBOOK
    try:
        # 0600, as every file of a run folder (the umask is the operator's here).
        with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            nbformat.write(nb, f)
    except OSError:
        return None
    return target
