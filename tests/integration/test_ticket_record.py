"""A deploy's record is what a ticket takes (issue 29, item 5): on one rehearsal host, a deploy
and a second one with a changed ``server.args`` value leave run folders whose HTML notebooks
show the config patch's plan and the launch script's change as coloured diffs, hold no code of
the form or the buttons and no example banner, whose journal lists every command whole and in
time order (journal.html and ``opsbook records show``), and which ``records show --diff``
prints; the folders stay the operator's alone."""

from __future__ import annotations

import html
import json
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.steps import server
from tests.integration.conftest import opsbook

pytestmark = pytest.mark.integration

ADDRESS = "127.0.10.5"  # 127.0.10.0/24: no other test uses it
CHANGED_ARG = "max-model-len"


@dataclass(frozen=True)
class Deploys:
    """The two deploys' run folders: the first patches the config, the second changes the
    launch script."""

    first: Path
    second: Path


def deploy(deployment: Path, runs: Path) -> Path:
    before = set(runs.glob("*-deploy-*"))
    done = opsbook(
        "run", "deploy", "-f", str(deployment), "--runs-dir", str(runs), "-p", "apply", "True"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = set(runs.glob("*-deploy-*")) - before
    return folder


@pytest.fixture(scope="module")
def deploys(box: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deploys]:
    runs = tmp_path_factory.mktemp("runs")
    first = deploy(box.deployment_path, runs)
    doc = yaml.safe_load(box.deployment_path.read_text())
    args = doc["server"]["args"]
    args[CHANGED_ARG] = args.get(CHANGED_ARG, 0) // 2
    changed = tmp_path_factory.mktemp("changed") / "deployment.yml"
    changed.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        yield Deploys(first, deploy(changed, runs))
    finally:
        dep = load_deployment(changed)
        with Host.from_deployment(dep) as host:
            server.stop_server(host, server.resolve_paths(host, dep))


def pages(folder: Path) -> dict[str, str]:
    """The HTML copies of the run's notebooks by name."""
    return {
        path.name: path.read_text()
        for path in folder.rglob("*.html")
        if path.name not in ("index.html", "journal.html")
    }


def page_text(page: str) -> str:
    """What a page reads as (code is highlighted word by word)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_the_diffs_are_coloured_in_the_html_and_printed_by_records_show(deploys: Deploys) -> None:
    config = pages(deploys.first)["02_config_patch.html"]
    assert 'class="opsbook-diff"' in config
    removed = re.search(r'<span class="opsbook-diff-removed" style="[^"]*">([^<]*)</span>', config)
    assert removed is not None and "color:#82071e" in removed.group(0)
    assert "kv_cache" in html.unescape(removed.group(1))
    script = pages(deploys.second)["03_launch_script.html"]
    added = re.findall(r'<span class="opsbook-diff-added" style="[^"]*">([^<]*)</span>', script)
    assert any(f"--{CHANGED_ARG}" in html.unescape(line) for line in added), added

    first = opsbook("records", "show", str(deploys.first), "--diff")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("config-patch on ")
    assert re.search(r"^-.*kv_cache", first.stdout, re.M) and "\033[" not in first.stdout
    second = opsbook("records", "show", str(deploys.second), "--diff")
    assert second.stdout.startswith("launch-script on ") and f"--{CHANGED_ARG}" in second.stdout


def test_the_html_notebooks_hold_no_widget_code_and_no_example_banner(deploys: Deploys) -> None:
    shown = {name: page_text(page) for name, page in pages(deploys.first).items()}
    assert {"00_preflight.html", "04_launch.html", "05_diagnose.html"} <= set(shown)
    for name, text in shown.items():
        for code in ("DeploymentForm(", "widgets.live(", "form.load()", "stages.get("):
            assert code not in text, (name, code)
        assert "Example output from the rehearsal host" not in text, name
        assert "deployment = " in text, name  # the parameters the run gave stay
    for name in ("02_config_patch.html", "03_launch_script.html", "04_launch.html"):
        assert "apply = True" in shown[name], name


def test_the_journal_is_whole_and_in_time_order(deploys: Deploys) -> None:
    entries = [
        json.loads(line)
        for line in (deploys.first / "journal.jsonl").read_text().splitlines()
        if line.strip()
    ]
    ordered = sorted(entries, key=lambda e: e["started"])
    assert len(entries) > 10
    cut = [e["command"] for e in entries if e["command"].endswith("...")]
    assert cut == []  # probes' arguments whole (file texts as their length)
    page = (deploys.first / "journal.html").read_text()
    commands = re.findall(r"<pre class='command'>(.*?)</pre>", page, re.S)
    assert [html.unescape(c) for c in commands] == [e["command"] for e in ordered]
    assert f"{len(entries)} operation(s)" in page

    shown = opsbook("records", "show", str(deploys.first))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    start = lines.index(f"JOURNAL ({len(entries)} operation(s), in time order, UTC)")
    heads = [line for line in lines[start + 1 :] if re.match(r"\d\d:\d\d:\d\d\.\d{3}  ", line)]
    assert [line[:12] for line in heads] == [e["started"][11:23] for e in ordered]
    for entry in entries:
        assert "\n".join("    " + part for part in entry["command"].splitlines()) in shown.stdout


def test_each_html_notebook_s_journal_table_shows_its_commands_whole(deploys: Deploys) -> None:
    from opsbook.remote.journal import COMMAND_STYLE

    journal = (deploys.first / "journal.jsonl").read_text().splitlines()
    recorded = {json.loads(line)["command"] for line in journal if line.strip()}
    # The export writes the attribute's quotes its own way.
    cell = re.compile(r"<pre style=.?" + re.escape(COMMAND_STYLE) + r".?>(.*?)</pre>", re.S)
    shown = {
        name: [html.unescape(c) for c in cell.findall(page)]
        for name, page in pages(deploys.first).items()
    }
    assert shown["04_launch.html"], "04's journal table shows its commands"
    commands = [command for found in shown.values() for command in found]
    assert set(commands) <= recorded  # each as the run's journal holds it: whole, not cut
    assert max(map(len, commands)) > 120, max(commands, key=len)


def test_the_run_folders_stay_private(deploys: Deploys) -> None:
    for folder in (deploys.first, deploys.second):
        for path in [folder, *folder.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, (path, oct(mode))
