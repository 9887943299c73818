"""The deploy lock's pure parts: who holds it, and when a holder is gone."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from opsbook.core.deployment import HostSpec, parse_deployment
from opsbook.remote.testing import LocalHost
from opsbook.runner import lock


def test_a_holder_survives_the_lock_file_and_describes_itself(tmp_path: Path) -> None:
    mine = lock.me(tmp_path / "run")
    again = lock.Holder.parse(mine.line() + "\n")
    assert again == mine
    text = mine.describe()
    for part in (mine.user, mine.machine, f"PID {os.getpid()}", str(tmp_path / "run"), "since"):
        assert part in text


def test_a_lock_file_opsbook_did_not_write_has_no_holder() -> None:
    assert lock.Holder.parse("") is None
    assert lock.Holder.parse("busy\n") is None
    assert lock.Holder.parse('{"user": "x"}') is None


def test_a_live_holder_is_not_stale_and_a_gone_one_is(tmp_path: Path) -> None:
    mine = lock.me(tmp_path)
    assert not mine.is_stale()
    child = subprocess.Popen(["true"])
    child.wait()
    gone = lock.Holder(mine.user, mine.machine, child.pid, "1", str(tmp_path), mine.since)
    assert gone.is_stale()
    # A reused PID (another start time) is not the holder either.
    reused = lock.Holder(mine.user, mine.machine, os.getpid(), "1", str(tmp_path), mine.since)
    assert reused.is_stale()


def test_a_holder_on_another_machine_is_never_taken_as_stale(tmp_path: Path) -> None:
    mine = lock.me(tmp_path)
    elsewhere = lock.Holder(mine.user, "other-box", 1, "", str(tmp_path), mine.since)
    assert not elsewhere.is_stale()


def test_the_lock_lives_next_to_each_hosts_state() -> None:
    dep = parse_deployment(
        {
            "name": "d",
            "hosts": [{"address": "127.0.3.1"}],
            "model": {"path": "/m"},
            "paths": {"state": "/srv/opsbook/state"},
        }
    )
    spec: HostSpec = dep.hosts[0]
    assert lock.lock_path(dep, spec.name) == "/srv/opsbook/state/deploy.lock"


# -- taking the lock, with this machine's bash as the host ------------------------------------


def lock_at(tmp_path: Path) -> Path:
    return tmp_path / "state" / "deploy.lock"


def test_a_free_lock_is_taken_and_holds_the_holder_whole(tmp_path: Path) -> None:
    path, mine = lock_at(tmp_path), lock.me(tmp_path / "run")
    answer = lock._take(LocalHost(), str(path), mine)
    assert answer == lock.Taken(True)
    assert lock.Holder.parse(path.read_text()) == mine
    assert sorted(p.name for p in path.parent.iterdir()) == ["deploy.lock", "deploy.lock.guard"]


def test_a_live_holder_refuses_the_take(tmp_path: Path) -> None:
    path, mine = lock_at(tmp_path), lock.me(tmp_path / "run")
    path.parent.mkdir()
    path.write_text(mine.line() + "\n")
    answer = lock._take(LocalHost(), str(path), lock.me(tmp_path / "other"))
    assert not answer.taken and not answer.unwritable
    assert f"PID {os.getpid()}" in answer.note and str(path) in answer.note


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "an empty deploy lock"),
        ("\n", "an empty deploy lock"),
        ('{"user": "x", "pid": 12', "names no holder"),
        ("\0\0\0\0", "names no holder"),
    ],
)
def test_an_empty_or_garbled_lock_is_named_and_taken_over(
    tmp_path: Path, text: str, named: str
) -> None:
    # As a deploy on a full disk left it before the lock was written whole: every later
    # deploy then exited 5 "unknown holder ('')".
    path, mine = lock_at(tmp_path), lock.me(tmp_path / "run")
    path.parent.mkdir()
    path.write_text(text)
    answer = lock._take(LocalHost(), str(path), mine)
    assert answer.taken, answer
    assert named in answer.note and "took over" in answer.note
    assert lock.Holder.parse(path.read_text()) == mine


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda state: state.write_text("a file where the folder should be"), "not a directory"),
        (lambda state: state.symlink_to("/proc/version"), "not a directory"),
    ],
)
def test_a_lock_that_cannot_be_written_says_why_and_leaves_nothing(
    tmp_path: Path, make: Callable[[Path], object], reason: str
) -> None:
    state = tmp_path / "state"
    make(state)
    answer = lock._take(LocalHost(address="gpu-01"), str(state / "deploy.lock"), lock.me(tmp_path))
    assert not answer.taken and answer.unwritable
    assert answer.note.startswith(f"{reason} on host ")
    assert "gpu-01" in answer.note and str(state / "deploy.lock") in answer.note


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ("printf: write error: No space left on device", "disk full"),
        ("mkdir: cannot create directory '/s': Read-only file system", "read-only file system"),
        ("bash: /s/deploy.lock.guard: Permission denied", "permission denied"),
        ("Disk quota exceeded", "disk quota exceeded"),
        ("something else", "cannot write"),
        ("", "cannot write"),
    ],
)
def test_a_write_error_is_said_in_the_operators_words(error: str, said: str) -> None:
    note = lock._unwritable_note("gpu-01", "/s/deploy.lock", error)
    assert note.startswith(f"{said} on host gpu-01: /s/deploy.lock")
    if error:
        assert f"({error})" in note
    else:
        assert "(" not in note


def test_the_refusal_of_an_unwritable_lock_says_why_and_what_to_do() -> None:
    error = lock._refusal([], ["disk full on host gpu-01: /s/deploy.lock"])
    assert "cannot take the deploy lock: disk full on host gpu-01: /s/deploy.lock" in str(error)
    assert "paths.state" in (error.remedy or "")
    both = lock._refusal(["gpu-02 is locked by someone"], ["disk full on host gpu-01: /s"])
    assert "another deploy holds the host" in str(both) and "disk full" in str(both)
