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
