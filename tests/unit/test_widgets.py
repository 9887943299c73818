from pathlib import Path
from typing import Any

import pytest

from opsbook import stages, widgets
from opsbook.core.results import HostResult, Result, State
from opsbook.remote.hosts import HostGroup
from opsbook.stages import config_patch, launch_server
from opsbook.stages.base import Note, StageRun, while_busy
from opsbook.steps import patch
from opsbook.steps.launch_answers import ProcessInfo
from opsbook.steps.triage import ServerState
from opsbook.widgets import first_contact, page_state


def test_headless_gate_runs_the_step_only_with_apply() -> None:
    calls: list[int] = []

    def step() -> Result:
        calls.append(1)
        return Result(True, "patched")

    skipped = widgets.confirm("Apply the patch", step, apply=False)
    assert calls == [] and skipped.result is None
    assert skipped.outcome.message == "dry run: 'Apply the patch' not done (apply=False)"
    done = widgets.confirm("Apply the patch", step, apply=True)
    assert calls == [1] and done.outcome.message == "patched"


def test_overrides_are_key_value_pairs_read_as_yaml() -> None:
    assert widgets.parse_overrides("server.port=8001, model.path=/data/m, x.flag=true") == {
        "server.port": 8001,
        "model.path": "/data/m",
        "x.flag": True,
    }
    assert widgets.parse_overrides("  ") == {}
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        widgets.parse_overrides("server.port")


def test_the_form_loads_the_deployment_with_its_overrides(tmp_path) -> None:
    path = tmp_path / "d.yml"
    path.write_text("hosts: [gpu-01]\nmodel: {path: /m}\nserver: {port: 8000}\n")
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "deployment.yml").write_text(path.read_text())
    form = widgets.DeploymentForm(str(path), folders=[str(tmp_path)])
    assert form.choices == [str(path), str(tmp_path / "box" / "deployment.yml")]
    assert form.load().server_port == 8000
    form._overrides = "server.port=8001"
    assert form.load().server_port == 8001


# -- first contact: no deployment, a relative OPSBOOK_DEPLOYMENT, a typo, the example outputs -----

DEPLOYMENT_YAML = "hosts: [gpu-01]\nmodel: {path: /m}\nserver: {port: 8000}\n"


@pytest.fixture
def lab(monkeypatch, tmp_path) -> list[Any]:
    """A kernel as JupyterLab runs it, no deployment named, its displays collected."""
    import IPython.display

    shown_now: list[Any] = []
    monkeypatch.setattr(page_state, "has_frontend", lambda: True)
    monkeypatch.setattr(page_state, "SESSION", None)
    monkeypatch.setattr(page_state, "GATES", [])
    monkeypatch.setattr(IPython.display, "display", lambda obj, **_: shown_now.append(obj))
    for name in ("OPSBOOK_DEPLOYMENT", "JPY_PARENT_PID", "PWD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPSBOOK_RUNS_DIR", str(tmp_path / "runs"))
    # A session points the process's journal and results at its folder: undone after the test.
    monkeypatch.setenv("OPSBOOK_JOURNAL", str(tmp_path / "journal.jsonl"))
    monkeypatch.setenv("OPSBOOK_OUTCOME", str(tmp_path / "results.json"))
    return shown_now


def kinds(shown_now: list[Any]) -> list[str]:
    return ["form" if isinstance(o, dict) else type(o).__name__.lstrip("_") for o in shown_now]


def test_without_a_deployment_the_form_shows_its_picker_and_says_what_to_do(lab, tmp_path):
    (tmp_path / "d.yml").write_text(DEPLOYMENT_YAML)
    form = widgets.DeploymentForm("", folders=[str(tmp_path)], notebook="04_launch")
    form._ipython_display_()
    assert kinds(lab) == ["form"]  # no traceback, no session yet
    picker, _, note, _ = form._widget.children
    assert picker.options == (str(tmp_path / "d.yml"),) and picker.value is None
    problem = form.problem()
    assert problem.startswith("No deployment file found (no deployment given)")
    assert "OPSBOOK_DEPLOYMENT=deployments/fleet-example.yml" in problem
    assert "-p deployment deployments/fleet-example.yml" in problem
    assert "No deployment file found" in note.value
    picker.value = str(tmp_path / "d.yml")  # the operator picks one
    assert note.value == "" and form.problem() == ""
    assert form.load().server_port == 8000  # the next cell: the session starts there
    assert kinds(lab) == ["form", "SessionHeader", "Gate"] and widgets.SESSION is not None


def test_a_deployment_path_that_does_not_exist_names_where_it_was_looked_for(
    lab, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    form = widgets.DeploymentForm("missing.yml", folders=[], notebook="04_launch")
    form._ipython_display_()
    assert kinds(lab) == ["form"]
    looked = f"looked for\n  {tmp_path}/missing.yml\n"
    assert form.problem().startswith(
        f"No deployment file found (deployment='missing.yml'): {looked}"
    )
    (tmp_path / "here.yml").write_text(DEPLOYMENT_YAML)
    found = widgets.DeploymentForm("here.yml", folders=[], notebook="04_launch")
    assert found.path == "here.yml" and found.problem() == ""  # spelled as the notebook has it


def test_a_relative_opsbook_deployment_is_read_from_where_jupyterlab_was_started(
    lab, tmp_path, monkeypatch
):
    started = tmp_path / "ops"
    (started / "deployments").mkdir(parents=True)
    (started / "notebooks").mkdir()
    (started / "deployments" / "x.yml").write_text(DEPLOYMENT_YAML)
    monkeypatch.chdir(started / "notebooks")  # JupyterLab starts the kernel in this folder
    monkeypatch.setenv("PWD", str(started))
    monkeypatch.setenv("OPSBOOK_DEPLOYMENT", "deployments/x.yml")
    form = widgets.DeploymentForm("deployments/x.yml", folders=[], notebook="04_launch")
    assert form.path == str(started / "deployments" / "x.yml")
    assert form.located is not None and form.located.tried == (form.path,)
    form._ipython_display_()
    assert kinds(lab) == ["SessionHeader", "form", "Gate"]

    monkeypatch.setenv("OPSBOOK_DEPLOYMENT", "deployments/y.yml")
    lost = widgets.DeploymentForm("deployments/y.yml", folders=[], notebook="04_launch")
    problem = lost.problem()
    assert problem.startswith("No deployment file found (OPSBOOK_DEPLOYMENT=deployments/y.yml)")
    for base in (started, started / "notebooks", tmp_path):
        assert f"\n  {base}/deployments/y.yml\n" in problem


def test_the_folder_jupyterlab_was_started_from_is_the_server_process_s_then_pwd() -> None:
    env = {"JPY_PARENT_PID": "4242", "PWD": "/home/op"}
    assert first_contact.server_start_dirs(env, lambda pid: f"/srv/{pid}") == [
        Path("/srv/4242"),
        Path("/home/op"),
    ]

    def gone(pid: str) -> str:
        raise FileNotFoundError(pid)

    assert first_contact.server_start_dirs(env, gone) == [Path("/home/op")]
    assert first_contact.server_start_dirs({}, gone) == []


def test_headless_the_form_reads_the_path_as_given(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(page_state, "has_frontend", lambda: False)
    monkeypatch.setenv("OPSBOOK_DEPLOYMENT", "deployments/x.yml")
    form = widgets.DeploymentForm("deployments/x.yml", folders=[])
    assert form.path == "deployments/x.yml" and form.located is None


def test_a_typo_in_the_overrides_is_shown_at_the_field_and_keeps_the_buttons(lab, tmp_path):
    path = tmp_path / "d.yml"
    path.write_text(DEPLOYMENT_YAML)
    form = widgets.DeploymentForm(str(path), folders=[], notebook="04_launch")
    form._ipython_display_()
    gate = widgets.confirm("Apply the patch", lambda: Result(True, "patched"), apply=False)
    gate._ipython_display_()
    gate.click()
    button, history, drawn = gate._button, list(gate.history), form._widget
    _, overrides, note, _ = form._widget.children
    overrides.value = "servr.port=8001"
    assert "'servr.port' is not a deployment key; did you mean 'server.port'?" in note.value
    overrides.value = "server.prot=8001, server.args.max-model-len=4096"
    assert "did you mean 'server.port'?" in note.value and "max-model-len" not in note.value
    overrides.value = "server.port"
    assert "not KEY=VALUE" in note.value
    overrides.value = "server.port=8001, server.env.HF_HOME=/data/hf"
    assert note.value == "" and form.load().server_port == 8001
    assert gate._button is button and gate.history == history and form._widget is drawn
    assert widgets.GATES == [gate]


def test_the_example_note_is_in_the_form_in_jupyterlab_only(lab, tmp_path, monkeypatch) -> None:
    path = tmp_path / "d.yml"
    path.write_text(DEPLOYMENT_YAML)
    form = widgets.DeploymentForm(str(path), folders=[], notebook="04_launch")
    form._ipython_display_()
    note = form._widget.children[3].value
    assert "<b>Example output below</b>" in note
    assert "EXAMPLE stored with the runbook, from the rehearsal host" in note
    # The saved notebook keeps the widget's stand-in only, not the note.
    assert lab[1]["text/plain"] == f"[form: deployment {path}]"
    lab.clear()
    monkeypatch.setattr(page_state, "has_frontend", lambda: False)
    headless = widgets.DeploymentForm(str(path), folders=[], notebook="04_launch")
    headless._ipython_display_()
    assert kinds(lab) == ["SessionHeader", "HTML"] and headless._widget is None


def test_the_form_has_the_session_record_every_cell_and_deployment_in_jupyterlab_only(
    lab, tmp_path, monkeypatch
) -> None:
    import IPython
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    first, second = tmp_path / "d.yml", tmp_path / "fleet.yml"
    first.write_text(DEPLOYMENT_YAML)
    second.write_text(DEPLOYMENT_YAML.replace("[gpu-01]", "[gpu-02, gpu-03]"))
    try:
        headless = widgets.DeploymentForm(str(first), folders=[], notebook="04_launch")
        monkeypatch.setattr(page_state, "has_frontend", lambda: False)
        headless._ipython_display_()
        headless.load()
        assert widgets.SESSION is None and shell.events.callbacks["post_run_cell"] == []
        monkeypatch.setattr(page_state, "has_frontend", lambda: True)
        form = widgets.DeploymentForm(str(first), folders=[str(tmp_path)], notebook="04_launch")
        form._ipython_display_()
        session = widgets.SESSION
        assert session is not None and session.recorder is not None
        assert session.recorder.post_run_cell in shell.events.callbacks["post_run_cell"]
        form._widget.children[0].value = str(second)  # the operator switches deployment
        assert [h.name for h in form.load().hosts] == ["gpu-02", "gpu-03"]
        assert session.deployments == [str(first), str(second)]
        assert session.hosts == ["gpu-01", "gpu-02", "gpu-03"]
    finally:
        if widgets.SESSION is not None:
            widgets.SESSION.stop_recording_cells()
        InteractiveShell.clear_instance()


# -- fleet buttons: hosts chosen, confirmed by name, acted on exactly ----------------------------

READY, CRASHED, NEVER, GONE = (
    "ops@10.0.0.1:22",
    "ops@10.0.0.2:22",
    "ops@10.0.0.3:22",
    "ops@10.0.0.4:22",
)


def launch_dry_run() -> StageRun:
    """A launch dry run over four hosts: one ready and unchanged, one whose server crashed
    (processes left), one never started, one unreachable."""

    def found(host: str, state: State, message: str, server: str, pids: list[int]) -> Any:
        verdict = Result(True, message)
        found = ServerState(server, message, None, processes=[ProcessInfo(p) for p in pids])
        report = launch_server.LaunchReport(
            state, verdict, [Note(f"{host} pids {pids}")], server=found
        )
        return HostResult(host, "launch", state, message), report

    rows = [
        found(READY, State.OK, "ok, already running and ready", "ready", [101]),
        found(
            CRASHED,
            State.WOULD_CHANGE,
            "would (re)start the server (now crashed)",
            "crashed",
            [202],
        ),
        found(
            NEVER, State.WOULD_CHANGE, "would (re)start the server (now never started)", "none", []
        ),
    ]
    results = [r for r, _ in rows] + [HostResult(GONE, "launch", State.UNREACHABLE, "no route")]
    reports = {r.host: report for r, report in rows}
    return StageRun(stages.get("launch"), results, reports, HostGroup([]))


def test_restart_offers_reachable_hosts_and_chooses_those_not_ready_or_changed() -> None:
    choice = launch_server.restart_choice(launch_dry_run())
    assert list(choice.offered) == [READY, CRASHED, NEVER]
    assert choice.default == (CRASHED, NEVER)  # the ready, unchanged server only when ticked
    assert choice.offered[READY] == "ok: ok, already running and ready"


def test_stop_offers_hosts_with_a_server_and_chooses_the_broken_ones() -> None:
    choice = launch_server.stop_choice(launch_dry_run())
    assert list(choice.offered) == [READY, CRASHED]
    assert choice.default == (CRASHED,)


def restart_gate(acted: list[list[str]], busy_seen: list[dict[str, str]]) -> widgets.FleetGate:
    run = launch_dry_run()

    def restart(names: list[str]) -> Result:
        acted.append(names)
        busy_seen.append(dict(widgets.BUSY))
        return Result(True, f"restarted {len(names)}")

    return widgets.FleetGate(
        "Restart the server", restart, choice=lambda: launch_server.restart_choice(run),
        doing="restarting",
    )  # fmt: skip


def test_a_fleet_button_confirms_by_name_and_acts_on_exactly_the_chosen_hosts() -> None:
    acted: list[list[str]] = []
    busy: list[dict[str, str]] = []
    gate = restart_gate(acted, busy)
    assert gate.label == "Restart the server on 2 host(s)"
    assert gate.ask() == f"Confirm: restart the server on {CRASHED}, {NEVER}"
    assert acted == []  # asking runs nothing
    gate.choose([READY, CRASHED, NEVER])  # ticks changed after asking do not widen the step
    entry = gate.click()
    assert acted == [[CRASHED, NEVER]]
    assert entry.label == "Restart the server on 2 host(s)" and entry.hosts == (CRASHED, NEVER)
    assert f"on {CRASHED}, {NEVER}: done" in entry.line()
    assert busy == [{CRASHED: "restarting", NEVER: "restarting"}]
    assert widgets.BUSY == {} and gate.pending is None


def test_a_healthy_host_is_acted_on_only_when_ticked() -> None:
    acted: list[list[str]] = []
    gate = restart_gate(acted, [])
    gate.choose([READY])
    assert gate.ask() == f"Confirm: restart the server on {READY}"
    gate.click()
    assert acted == [[READY]]
    gate.choose([GONE])  # not offered: unreachable
    assert gate.ticked == [] and gate.label == "Restart the server on 0 host(s)"
    assert gate.unavailable() == "no host chosen: tick the hosts to act on above"


def test_a_cancelled_confirmation_runs_nothing() -> None:
    acted: list[list[str]] = []
    gate = restart_gate(acted, [])
    gate.ask()
    gate.cancel()
    assert gate.pending is None and acted == []
    assert gate.acting_on() == (CRASHED, NEVER)


def test_headless_fleet_button_runs_on_the_default_hosts_only_with_apply() -> None:
    acted: list[list[str]] = []
    run = launch_dry_run()

    def gate(apply: bool) -> widgets.FleetGate:
        return widgets.confirm_on_hosts(
            "Stop the server", lambda names: acted.append(names) or Result(True, "stopped"),
            choice=lambda: launch_server.stop_choice(run), doing="stopping", apply=apply,
        )  # fmt: skip

    assert gate(False).result is None and acted == []
    assert gate(True).outcome.message == "stopped" and acted == [[CRASHED]]


def test_while_a_step_runs_its_hosts_sections_say_so_and_drop_what_is_stale() -> None:
    run = launch_dry_run()
    busy = {CRASHED: "restarting: loading weights"}
    shown_now = while_busy(run.sections(), busy)
    text = "\n".join(repr(item) for item in shown_now)
    assert f"### {CRASHED}\nrestarting: loading weights" in text
    assert "pids [202]" not in text  # the old processes are no longer true
    assert "pids [101]" in text and "ok, already running and ready" in text
    table = repr(while_busy(run, busy))
    assert f"{CRASHED}  busy  restarting: loading weights" in table
    assert f"{READY}  ok  ok, already running and ready" in table
    assert while_busy(run, {}) is run


def restore_run(prediction_ok: bool, put_back: bool) -> StageRun:
    evidence = patch.RestoreEvidence(restored=["config.json"] if put_back else [])
    message = "restored config.json" if put_back else "could not restore config.json"
    restored = patch.Restored(put_back, message, evidence=evidence)
    prediction = Result(prediction_ok, "FP8 KV cache has no MLA backend on 12.0")
    state = State.CHANGED if prediction_ok and put_back else State.FAILED
    report = config_patch.RestoreReport(
        state, restored, [], restored=restored, prediction=prediction if put_back else None
    )
    results = [HostResult(CRASHED, "config-patch", state, message)]
    return StageRun(stages.get("config-patch"), results, {CRASHED: report}, HostGroup([]))


def test_a_restore_that_worked_is_no_failure_and_its_prediction_is_a_line_of_its_own() -> None:
    outcome = config_patch.restore_outcome(restore_run(prediction_ok=False, put_back=True))
    assert outcome.ok and outcome.message == "restored the original config on 1 of 1 host(s)"
    lines = [(f.severity, f.message) for f in outcome.findings]
    assert lines == [
        ("ok", "restored config.json"),
        (
            "warning",
            "the restored config is predicted to fail: FP8 KV cache has no MLA backend on 12.0",
        ),
    ]
    failed = config_patch.restore_outcome(restore_run(prediction_ok=True, put_back=False))
    assert not failed.ok and failed.findings[0].severity == "error"
