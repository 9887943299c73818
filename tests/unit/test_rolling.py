import sys
from pathlib import Path

import pytest

from opsbook.core.deployment import HostSpec
from opsbook.core.exceptions import RunError
from opsbook.core.redact import Redactor
from opsbook.core.results import HostResult, State
from opsbook.runner import rolling

SPEC = HostSpec("10.0.0.7", 2222, "ops")


def result(host: str, state: State, stage: str = "diagnose") -> HostResult:
    return HostResult(host, stage, state, f"{state.value} message")


def test_on_failure_takes_leave_or_rollback_only() -> None:
    assert rolling.check_on_failure("rollback") == "rollback"
    with pytest.raises(RunError, match="'undo' is not one of: leave, rollback") as e:
        rolling.check_on_failure("undo")
    assert "-p on_failure rollback" in (e.value.remedy or "")


def test_the_hosts_staying_up_leave_out_the_batch_and_the_failed() -> None:
    staying = rolling.hosts_staying_up(["a", "b", "c", "d"], ["b"], {"c"})
    assert staying == ["a", "d"]


def test_a_host_staying_up_that_is_not_ok_stops_a_batch_that_serves() -> None:
    checked = [result("a", State.OK), result("b", State.OK), result("c", State.FAILED)]
    unhealthy = rolling.unhealthy_before(checked, ["a"], ["b", "c"])
    assert [r.host for r in unhealthy] == ["c"]
    reason = rolling.stop_reason(2, 4, unhealthy)
    assert reason.startswith("before batch 2 of 4, not every host staying up was healthy")
    assert "c failed: failed message" in reason
    assert reason.endswith("batch 2 and later ones were not taken down")


def test_a_batch_that_serves_nothing_takes_nothing_down() -> None:
    # A first deploy: no server anywhere yet, so no batch waits for the others.
    checked = [result("a", State.FAILED), result("b", State.FAILED)]
    assert rolling.unhealthy_before(checked, ["a"], ["b"]) == []


def test_an_unreachable_host_staying_up_stops_the_batch() -> None:
    checked = [result("a", State.OK), result("b", State.UNREACHABLE)]
    assert [r.state for r in rolling.unhealthy_before(checked, ["a"], ["b"])] == [State.UNREACHABLE]


def test_a_hook_gets_the_host_and_its_address_and_a_relative_program_from_the_file(
    tmp_path: Path,
) -> None:
    argv = rolling.hook_argv(["./lb.sh", "drain", "{address}", "name={host}"], SPEC, tmp_path)
    assert argv == [str(tmp_path / "lb.sh"), "drain", "10.0.0.7", "name=ops@10.0.0.7:2222"]
    # A program without a slash is looked up on PATH, as a shell would.
    assert rolling.hook_argv(["curl", "{x}"], SPEC, tmp_path) == ["curl", "{x}"]


def hook(
    tmp_path: Path, code: str, *args: str, timeout: float = 20, secret: str = ""
) -> HostResult:
    return rolling.run_hook(
        rolling.PRE_HOST,
        [sys.executable, "-c", code, *args],
        SPEC,
        folder=tmp_path,
        timeout=timeout,
        redactor=Redactor([secret] if secret else []),
    )


def test_a_hook_that_exits_0_is_changed_with_its_output_kept(tmp_path: Path) -> None:
    done = hook(tmp_path, "import sys; print('drained', sys.argv[1])", "{host}")
    assert done.state is State.CHANGED
    assert done.stage == "pre-host" and done.host == SPEC.name
    assert done.message.endswith("exited 0")
    assert [f.message for f in done.findings] == [f"output: drained {SPEC.name}\n"]


def test_a_hook_that_fails_fails_the_host_naming_its_exit_and_output(tmp_path: Path) -> None:
    done = hook(tmp_path, "import sys; sys.stderr.write('no such backend'); sys.exit(3)")
    assert done.state is State.FAILED
    assert done.message.endswith("exited 3")
    assert done.findings[0].severity == "error" and "fix the hook" in done.findings[0].remedy
    assert done.findings[1].message == "output: no such backend"


def test_a_hook_that_runs_too_long_is_stopped(tmp_path: Path) -> None:
    done = hook(tmp_path, "import time; time.sleep(30)", timeout=0.5)
    assert done.state is State.FAILED
    assert "did not end within 0.5 s" in done.message
    assert done.duration < 10


def test_a_hook_that_cannot_start_says_so(tmp_path: Path) -> None:
    done = rolling.run_hook(
        rolling.POST_HOST,
        ["./missing.sh", "{host}"],
        SPEC,
        folder=tmp_path,
        timeout=5,
        redactor=Redactor([]),
    )
    assert done.state is State.FAILED
    assert "could not run: No such file or directory" in done.message


def test_a_hooks_output_and_arguments_are_masked(tmp_path: Path) -> None:
    done = hook(
        tmp_path, "import sys; print('token', sys.argv[1])", "s3cr3t-v4lue", secret="s3cr3t-v4lue"
    )
    text = done.message + " ".join(f.message for f in done.findings)
    assert "s3cr3t-v4lue" not in text
    assert "token" in text


def test_a_dry_run_says_which_hook_an_apply_would_run(tmp_path: Path) -> None:
    said = rolling.hook_not_run(rolling.POST_HOST, ["lb", "add", "{address}"], SPEC, tmp_path)
    assert said.state is State.SKIPPED
    assert said.message == "dry run: an apply would run lb add 10.0.0.7"


def test_a_host_without_a_snapshot_or_a_previous_script_is_not_rolled_back() -> None:
    class Host:
        name = SPEC.name

    unread = rolling._roll_back_one(Host(), None, OSError("gone"), False)  # type: ignore[arg-type]
    assert unread.state is State.FAILED
    assert unread.message == "not rolled back: what it ran before could not be read: gone"
    none = rolling._roll_back_one(Host(), None, rolling.Snapshot(None), False)  # type: ignore[arg-type]
    assert none.message == "not rolled back: it had no launch script before this run"


def test_the_recap_notes_say_rolled_back_or_why_not() -> None:
    notes = rolling.recap_notes(
        [
            result("a", State.FAILED, "launch"),
            result("a", State.CHANGED, rolling.ROLLBACK),
            HostResult("b", rolling.ROLLBACK, State.FAILED, "rollback failed: disk full"),
            result("c", State.OK),
        ]
    )
    assert notes == {"a": "rolled back", "b": "rollback failed: disk full"}
