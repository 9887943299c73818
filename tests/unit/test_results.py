"""The one vocabulary of per-host states, the recap and the exit code of a run."""

import pytest

from opsbook.core.results import (
    EXIT_BUSY,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_TOOL_FAILED,
    EXIT_UNREACHABLE,
    SERVER_BUSY,
    TOOL_FAILED,
    HostResult,
    Result,
    State,
    recap,
    worst_exit_code,
)


def result(host: str, stage: str, state: State, **kw) -> HostResult:
    return HostResult(host, stage, state, f"{stage} {state.value}", **kw)


@pytest.mark.parametrize(
    "state, code, goes_on",
    [
        (State.OK, EXIT_OK, True),
        (State.CHANGED, EXIT_OK, True),
        (State.SKIPPED, EXIT_OK, False),
        (State.WOULD_CHANGE, EXIT_PROBLEM, False),
        (State.FAILED, EXIT_PROBLEM, False),
        (State.UNREACHABLE, EXIT_UNREACHABLE, False),
    ],
)
def test_each_state_has_its_exit_code_and_says_whether_the_host_goes_on(
    state: State, code: int, goes_on: bool
) -> None:
    r = result("h", "s", state)
    assert r.exit_code == code and state.goes_on is goes_on


def test_a_dry_run_that_would_change_is_never_a_green_ok() -> None:
    r = result("h", "config-patch", State.WOULD_CHANGE)
    assert not r.ok and r.state.colour != State.OK.colour
    assert "would change" in r.line() and "ok" not in r.line().split()
    assert State.WOULD_CHANGE.counted_as == "changed"


def test_a_failure_of_opsbook_itself_is_a_tool_failure() -> None:
    assert result("h", "s", State.FAILED, failure_id=TOOL_FAILED).exit_code == EXIT_TOOL_FAILED


def test_a_host_skipped_as_busy_has_its_own_exit_code_below_a_problem() -> None:
    busy = result("h", "qualify", State.SKIPPED, failure_id=SERVER_BUSY)
    assert busy.exit_code == EXIT_BUSY == 6 and busy.ok
    assert worst_exit_code([result("g", "qualify", State.OK), busy]) == EXIT_BUSY
    assert worst_exit_code([busy, result("g", "qualify", State.FAILED)]) == EXIT_PROBLEM


def test_the_recap_counts_per_host_and_names_where_it_first_failed() -> None:
    results = [
        result("a", "preflight", State.OK),
        result("b", "preflight", State.OK),
        result("a", "download", State.FAILED),
        result("b", "download", State.OK),
        result("b", "config-patch", State.CHANGED),
        result("a", "config-patch", State.SKIPPED),
        result("a", "diagnose", State.FAILED),
        result("c", "preflight", State.UNREACHABLE),
    ]
    lines = {line.host: line for line in recap(results)}
    assert list(lines) == ["a", "b", "c"]
    assert lines["a"].counts == {"ok": 1, "changed": 0, "failed": 2, "unreachable": 0, "skipped": 1}
    assert lines["a"].first_failure is not None and lines["a"].first_failure.stage == "download"
    assert lines["b"].line(4) == "b    ok=2  changed=1  failed=0  unreachable=0  skipped=0"
    assert "unreachable at preflight" in lines["c"].line()
    assert lines["c"].exit_code == EXIT_UNREACHABLE


def test_a_run_exits_with_its_worst_hosts_code() -> None:
    assert worst_exit_code([]) == EXIT_OK
    assert worst_exit_code([result("a", "s", State.OK), result("b", "s", State.FAILED)]) == 1
    mixed = [
        result("a", "s", State.UNREACHABLE),
        result("b", "s", State.FAILED, failure_id=TOOL_FAILED),
        result("c", "s", State.FAILED),
    ]
    assert worst_exit_code(mixed) == EXIT_UNREACHABLE


def test_every_result_with_evidence_shows_as_its_verdict() -> None:
    # A typed result (a Result subclass with evidence) must not take the dataclass repr: a
    # notebook shows a result by its repr, and its stored outputs show the verdict.
    import importlib
    import pkgutil

    import opsbook

    for module in pkgutil.walk_packages(opsbook.__path__, "opsbook."):
        if not module.name.endswith("__main__") and ".sim." not in module.name:
            importlib.import_module(module.name)

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    typed = subclasses(Result)
    assert len(typed) >= 15
    for cls in typed:
        assert cls.__repr__ is Result.__repr__, f"{cls.__qualname__} needs @dataclass(repr=False)"
