"""The deploy lock's pure parts: who holds it, and when a holder is gone."""

import os
import subprocess
from pathlib import Path

from opsbook.core.deployment import HostSpec, parse_deployment
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
