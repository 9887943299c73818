"""03_launch_script over real SSH: upload, bash -n on the host, unchanged re-upload, a diff
for a changed argument, a folder whose name holds spaces and quotes, and the secrets file."""

from __future__ import annotations

import dataclasses
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.remote.hosts import Host
from opsbook.steps.script import NEW_FILE, render_script, upload_script, upload_secrets

pytestmark = pytest.mark.integration


@pytest.fixture
def place(sandbox: Any) -> Iterator[tuple[Host, Deployment, str]]:
    """The sandbox's host and deployment, with the script in a fresh folder (relative to the
    remote home) whose name holds spaces and quotes; the folder is removed afterwards."""
    deployment = load_deployment(sandbox.deployment_path)
    folder = f'opsbook-test {uuid.uuid4().hex[:8]}/it\'s a "dir"'
    moved = dataclasses.replace(deployment, script_path=f"{folder}/launch.sh")
    with Host.from_deployment(deployment) as host:
        try:
            yield host, moved, folder
        finally:
            top = folder.split("/")[0]
            host.run(f'rm -rf -- "$HOME"/{shlex.quote(top)}', check=True)


def test_upload_check_reupload_and_diff(place: tuple[Host, Deployment, str]) -> None:
    host, deployment, folder = place
    home = host.run('printf %s "$HOME"', check=True).stdout
    text = render_script(deployment)

    first = upload_script(host, deployment, text)
    assert first.ok, str(first)
    assert first.path == f"{home}/{folder}/launch.sh"
    assert first.diff == NEW_FILE and first.syntax_ok
    assert host.read_text(first.path) == text
    mode = host.run(f"stat -c %a -- {shlex.quote(first.path)}", check=True)
    assert mode.stdout.strip() == "755"

    again = upload_script(host, deployment, render_script(deployment))
    assert again.ok and again.unchanged and again.diff == ""
    assert not again.written

    args = {**deployment.serve_args, "max-model-len": 4096}
    changed = dataclasses.replace(deployment, serve_args=args)
    third = upload_script(host, changed, render_script(changed))
    assert third.ok and not third.unchanged
    assert "-  --max-model-len 32768 \\\n" in third.diff
    assert "+  --max-model-len 4096 \\\n" in third.diff
    assert host.read_text(third.path) == render_script(changed)


def test_a_broken_script_is_reported_by_bash_n(place: tuple[Host, Deployment, str]) -> None:
    host, deployment, _ = place
    result = upload_script(host, deployment, "#!/bin/bash\nif then fi\n")
    assert not result.ok and not result.syntax_ok
    assert "syntax error" in result.findings[0].message


def test_secrets_file_is_private_and_stays_out_of_the_journal(
    place: tuple[Host, Deployment, str],
) -> None:
    host, deployment, _ = place
    secret = f"hf_{uuid.uuid4().hex} $(touch /tmp/opsbook-pwned)"
    upload_script(host, deployment, render_script(deployment))
    written = upload_secrets(host, deployment, environ={"HF_TOKEN": secret})
    path = written.path
    assert written.ok and written.names == ["HF_TOKEN"]
    assert host.run(f"stat -c %a -- {shlex.quote(path)}", check=True).stdout.strip() == "600"
    sourced = host.run(f'source {shlex.quote(path)} && printf %s "$HF_TOKEN"', check=True)
    assert sourced.stdout == secret
    journal = " ".join(e.command + e.stdout_tail for e in host.journal.entries[:-1])
    assert secret not in journal
    assert not Path("/tmp/opsbook-pwned").exists()
