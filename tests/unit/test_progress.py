import io

import pytest

from opsbook.core import channel
from opsbook.runner import progress
from opsbook.runner.progress import LineReporter, WidgetReporter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_lines_are_throttled_but_first_and_last_always_show() -> None:
    clock, out = Clock(), io.StringIO()
    report = progress.progress_reporter(
        100, "sha256", interval=10, widgets=False, stream=out, clock=clock
    )
    for done in range(101):
        clock.now = done * 0.5  # a tick every half second, 50 s in all
        report(done, f"{done}/100")
    assert lines(out) == [
        "sha256: 0/100",
        "sha256: 20/100",
        "sha256: 40/100",
        "sha256: 60/100",
        "sha256: 80/100",
        "sha256: 100/100",
    ]


def test_nothing_after_the_last_line() -> None:
    clock, out = Clock(), io.StringIO()
    report = LineReporter(3, "watch", interval=10, stream=out, clock=clock)
    report(3, "done")
    report(3, "done again")
    report.finish()
    assert lines(out) == ["watch: done"]


def test_finish_shows_a_held_back_line_once() -> None:
    clock, out = Clock(), io.StringIO()
    report = LineReporter(10, "watch", interval=10, stream=out, clock=clock)
    report(1, "one")
    clock.now = 3
    report(2, "two")
    report.finish()
    report.finish()
    assert lines(out) == ["watch: one", "watch: two"]


def test_slow_ticks_each_show() -> None:
    clock, out = Clock(), io.StringIO()
    report = LineReporter(3, "hash", interval=5, stream=out, clock=clock)
    for done in (1, 2, 3):
        clock.now += 60
        report(done, str(done))
    assert lines(out) == ["hash: 1", "hash: 2", "hash: 3"]


@pytest.mark.parametrize("value", ["1", "yes"])
def test_headless_never_has_a_frontend(value: str) -> None:
    assert not progress.has_frontend({channel.HEADLESS_ENV: value})


def test_plain_python_has_no_frontend() -> None:
    assert not progress.has_frontend({})
    out = io.StringIO()
    report = progress.progress_reporter(2, "x", stream=out)
    assert isinstance(report, LineReporter)


def test_widget_reporter_moves_its_bar(capsys: pytest.CaptureFixture[str]) -> None:
    report = progress.progress_reporter(4, "sha256", widgets=True)
    assert isinstance(report, WidgetReporter)
    report(2, "2 of 4")
    assert (report.bar.value, report.text.value) == (2, "2 of 4")
    report(9, "all")
    assert report.bar.value == 4 and report.bar.bar_style == "success"
