"""Pinning the engine in the deployment file after an upgrade passed: comments kept, the file
as it was kept beside it, the result checked by the schema."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.steps import upgrade_pin as pins

FILE = """# Kimi on one box.
name: kimi
hosts: [gpu-01]  # the only one
model: {path: /m}
python: /opt/v15/bin/python
server:
  port: 8000
"""
NOW = datetime(2026, 12, 6, 13, 0, tzinfo=timezone.utc)


def test_the_engine_is_pinned_with_comments_kept_and_the_old_file_beside_it(tmp_path) -> None:
    path = tmp_path / "kimi.yml"
    path.write_text(FILE)
    path.chmod(0o640)
    pinned = pins.pin_engine(path, "0.18.0", "/opt/v18/bin/python", now=NOW)
    assert pinned.backup.name == "kimi.yml.before-upgrade-20261206T130000Z"
    assert pinned.backup.read_text() == FILE
    text = path.read_text()
    assert "# Kimi on one box." in text and "# the only one" in text
    assert "python: /opt/v15" not in text
    assert text.endswith('engine:\n  version: "0.18.0"\n  python: "/opt/v18/bin/python"\n')
    assert path.stat().st_mode & 0o777 == 0o640
    dep = load_deployment(path)
    assert (dep.python, dep.engine_version) == ("/opt/v18/bin/python", "0.18.0")
    assert dep.server_port == 8000


def test_pinning_again_replaces_the_pin_and_keeps_each_backup(tmp_path) -> None:
    path = tmp_path / "kimi.yml"
    path.write_text(FILE)
    first = pins.pin_engine(path, "0.18.0", "/opt/v18/bin/python", now=NOW)
    second = pins.pin_engine(path, "0.19.1", "/opt/v19/bin/python", now=NOW)
    assert second.backup != first.backup and first.backup.read_text() == FILE
    text = path.read_text()
    assert text.count("engine:") == 1 and text.count(pins.PIN_COMMENT) == 1
    assert load_deployment(path).engine_version == "0.19.1"


def test_a_file_whose_host_sets_its_own_python_is_not_pinned(tmp_path) -> None:
    path = tmp_path / "kimi.yml"
    text = FILE.replace("hosts: [gpu-01]  # the only one",
                        "hosts: [{address: gpu-01, vars: {python: /x/bin/python}}]")  # fmt: skip
    path.write_text(text)
    with pytest.raises(DeploymentError):
        pins.pin_engine(path, "0.18.0", "/opt/v18/bin/python", now=NOW)
    assert path.read_text() == text
    assert not list(tmp_path.glob("*.before-upgrade-*")) and not list(tmp_path.glob(".*"))
