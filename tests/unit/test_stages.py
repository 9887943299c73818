"""A stage over a set of hosts: bounded fan-out, per-host results, live recording."""

import ast
import dataclasses
import json
import os
import threading
import time
import typing
from collections.abc import Callable

import pytest

from opsbook import stages, widgets
from opsbook.core import channel
from opsbook.core.deployment import parse_deployment
from opsbook.core.exceptions import HostUnreachable, ProbeError, RunError
from opsbook.core.results import TOOL_FAILED, Result, State
from opsbook.remote.hosts import HostGroup
from opsbook.remote.testing import Answer, FakeHost
from opsbook.runner.parameters import NOTEBOOKS_DIR
from opsbook.stages.base import HOOK, Report, Stage, concurrently, run_stage
from opsbook.steps.shard_check import format_bytes

DOC = {"model": {"path": "/models/m"}, "server": {"port": 8000}}


def deployment(*addresses: str, **vars_by_address):
    hosts = [
        {
            "address": a,
            "user": "ops",
            **({"vars": vars_by_address[a]} if a in vars_by_address else {}),
        }
        for a in addresses
    ]
    return parse_deployment({**DOC, "hosts": hosts})


def probe_stage(host, dep, options) -> Report:
    answer = host.probe("check", {"path": dep.model_path})
    return Report(State.OK if answer["ok"] else State.FAILED, Result(answer["ok"], answer["msg"]))


CHECK = Stage("check", "99_check", False, probe_stage)


def ok(args):
    return {"ok": True, "msg": f"fine at {args['path']}"}


def test_each_host_gets_a_result_and_an_unreachable_one_is_a_result_not_an_error(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv(channel.OUTCOME_ENV, str(tmp_path / "out.jsonl"))
    dep = deployment("a", "b", "c")
    hosts = [
        FakeHost("a", probes={"check": ok}),
        FakeHost("b", probes={"check": {"ok": False, "msg": "shard 3 truncated"}}),
        FakeHost("c", unreachable=True),
    ]
    seen = []
    run = run_stage(CHECK, dep, group=HostGroup(hosts), on_result=seen.append)
    assert [(r.host, r.state) for r in run.results] == [
        ("ops@a", State.OK),
        ("ops@b", State.FAILED),
        ("ops@c", State.UNREACHABLE),
    ]
    assert run.results[1].message == "shard 3 truncated"
    assert "refused" in run.results[2].message
    assert sorted(r.host for r in seen) == ["ops@a", "ops@b", "ops@c"]
    assert sorted(channel.read(tmp_path / "out.jsonl"), key=lambda r: r.host) == run.results
    assert run.going_on == ["ops@a"]


def test_each_host_sees_the_deployment_through_its_own_vars() -> None:
    dep = deployment("a", "b", b={"model": {"path": "/other/m"}})
    hosts = [FakeHost("a", probes={"check": ok}), FakeHost("b", probes={"check": ok})]
    run = run_stage(CHECK, dep, group=HostGroup(hosts), on_result=None)
    assert [r.message for r in run.results] == ["fine at /models/m", "fine at /other/m"]


def test_a_slow_host_delays_no_other(tmp_path) -> None:
    dep = deployment("slow", "a", "b", "c")
    hosts = [FakeHost("slow", probes={"check": ok}, delay=1.5)]
    hosts += [FakeHost(n, probes={"check": ok}) for n in "abc"]
    finished = {}
    started = time.monotonic()
    run_stage(
        CHECK,
        dep,
        group=HostGroup(hosts, forks=2),
        on_result=lambda r: finished.setdefault(r.host, time.monotonic() - started),
    )
    assert finished["ops@slow"] >= 1.5
    assert max(finished[f"ops@{n}"] for n in "abc") < 0.5


def test_forks_bound_how_many_hosts_are_worked_on_at_once() -> None:
    lock, busy, peak = threading.Lock(), [0], [0]

    def counting(args):
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.1)
        with lock:
            busy[0] -= 1
        return {"ok": True, "msg": "fine"}

    names = [f"h{i}" for i in range(9)]
    hosts = [FakeHost(n, probes={"check": counting}) for n in names]
    run_stage(CHECK, deployment(*names), group=HostGroup(hosts, forks=3), on_result=None)
    assert peak[0] == 3


def test_a_tool_failure_on_one_host_is_that_hosts_failure() -> None:
    dep = deployment("a", "b")
    hosts = [
        FakeHost("a", probes={"check": ProbeError("probe check failed: no python3", host="ops@a")}),
        FakeHost("b", probes={"check": lambda args: {"msg": "no ok key"}}),
    ]
    run = run_stage(CHECK, dep, group=HostGroup(hosts), on_result=None)
    assert [r.state for r in run.results] == [State.FAILED, State.FAILED]
    assert [r.failure_id for r in run.results] == [TOOL_FAILED, TOOL_FAILED]
    assert "KeyError" in run.results[1].message


def test_hosts_not_in_the_deployment_are_refused() -> None:
    with pytest.raises(RunError, match="not a host"):
        run_stage(CHECK, deployment("a"), hosts=["ops@z"])


def test_the_registry_lists_the_runbook_in_order() -> None:
    assert [s.notebook for s in stages.STAGES] == [
        "00_preflight",
        "01_download_check",
        "02_config_patch",
        "03_launch_script",
        "04_launch",
        "05_diagnose",
        "06_qualify",
    ]
    assert stages.get("download") is stages.get("01_download_check")
    assert [s.name for s in stages.DEPLOY if s.changes_host] == [
        "config-patch",
        "launch-script",
        "launch",
    ]
    assert stages.QUALIFY not in stages.DEPLOY and stages.DIAGNOSE.name == "diagnose"
    with pytest.raises(RunError):
        stages.get("nope")


def test_the_launch_script_stage_knows_ok_would_change_and_changed() -> None:
    dep = deployment("a")
    path = "/home/ops/opsbook/launch.sh"
    host = FakeHost("a", commands={r"^bash -n": Answer(), r"^mkdir -p": Answer()})
    dry = stages.launch_script.run(host, dep, stages.launch_script.Options(apply=False))
    assert dry.state is State.WOULD_CHANGE and len(dry.script_sha256) == 64
    done = stages.launch_script.run(host, dep, stages.launch_script.Options(apply=True))
    assert done.state is State.CHANGED and path in host.files
    again = stages.launch_script.run(host, dep, stages.launch_script.Options(apply=False))
    assert again.state is State.OK and again.script_sha256 == dry.script_sha256


def test_the_download_stage_names_the_failure_vllm_would_meet(tmp_path) -> None:
    from opsbook.rehearsal.checkpoint import make_checkpoint
    from opsbook.remote.testing import local_probe

    model = tmp_path / "m"
    make_checkpoint(model)
    dep = parse_deployment({"hosts": ["a"], "model": {"path": str(model)}})
    host = FakeHost("a", probes={"download": local_probe("download")})
    assert stages.download_check.run(host, dep, stages.download_check.Options()).state is State.OK
    shard = sorted(model.glob("*.safetensors"))[0]
    os.truncate(shard, shard.stat().st_size - 4096)
    report = stages.download_check.run(host, dep, stages.download_check.Options())
    assert report.state is State.FAILED and report.failure_id == "safetensors-corrupt"
    shard.unlink()
    assert (
        stages.download_check.run(host, dep, stages.download_check.Options()).failure_id
        == "weights-missing"
    )


def test_the_hosts_of_a_group_share_one_journal() -> None:
    group = HostGroup.from_deployment(deployment("a", "b", "c"))
    journals = {id(h.journal) for h in group.hosts}
    assert len(journals) == 1


def test_concurrent_reads_run_at_once_and_answer_in_order() -> None:
    met = threading.Barrier(3, timeout=10)  # sequential reads would break it

    def read(answer: str) -> Callable[[], str]:
        def go() -> str:
            met.wait()
            return answer

        return go

    assert concurrently(read("facts"), read("configs"), read("download")) == [
        "facts",
        "configs",
        "download",
    ]


def test_a_failed_concurrent_read_is_raised_after_the_others_end() -> None:
    ended: list[str] = []

    def fails() -> None:
        raise HostUnreachable("the connection dropped", host="ops@a")

    def slow() -> str:
        time.sleep(0.2)
        ended.append("slow")
        return "slow"

    with pytest.raises(HostUnreachable, match="the connection dropped"):
        concurrently(fails, slow)
    assert ended == ["slow"]


def test_the_launch_script_stage_refuses_a_file_it_did_not_write_and_shows_none_of_it() -> None:
    dep = deployment("a")
    path = "/home/ops/opsbook/launch.sh"
    mine = b"#!/bin/bash\n# the operator's own\nexport TOKEN=hf_not_for_the_record\n"
    host = FakeHost("a", commands={r"^bash -n": Answer(), r"^mkdir -p": Answer()})
    host.files[path] = mine
    for apply in (False, True):
        report = stages.launch_script.run(host, dep, stages.launch_script.Options(apply=apply))
        assert report.state is State.FAILED and "left as it is" in report.verdict.message
        assert report.shows == []
        assert host.files[path] == mine


def test_the_config_patch_stage_reads_only_what_its_prediction_needs(tmp_path) -> None:
    # The GPUs and the interpreter's vLLM, the configs with the weights' size: the download
    # check is its own stage's work, and no /proc walk or disk look is needed to predict.
    from opsbook.rehearsal.checkpoint import make_checkpoint
    from opsbook.remote.testing import local_probe
    from tests.unit.test_host_facts import (
        RTX,
        RTX_COMPUTE_APPS,
        RTX_QUERY_GPU,
        fake_nvidia_smi,
        probe_env,
    )

    smi = fake_nvidia_smi(
        tmp_path,
        RTX_QUERY_GPU,
        RTX_COMPUTE_APPS,
        (RTX / "topo-rtxpro6000-1.txt").read_text(),
        (RTX / "nvidia-smi-rtxpro6000-8gpu-doc-illustrative.txt").read_text(),
    )
    model = make_checkpoint(tmp_path / "m", shards=3)
    doc = {"hosts": ["a"], "model": {"path": str(model)}, "python": "/usr/bin/python3"}
    env = probe_env(smi, XDG_CACHE_HOME=str(tmp_path / "cache"))
    read = ("facts", "configs", "backends", "weight_table", "launch")
    answers = {name: local_probe(name, env=env) for name in read}
    host = FakeHost("a", probes=answers)
    report = stages.config_patch.run(host, parse_deployment(doc), stages.config_patch.Options())
    asked = dict(host.probe_args)
    # The capacity plan adds the shard headers (weight_table) and the last launch's log.
    assert sorted(asked) == ["backends", "configs", "facts", "launch", "weight_table"]
    assert asked["facts"]["parts"] == ["nvidia_smi", "python"]
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    [budget] = [s for s in report.shows if str(s).startswith("KV-cache budget")]
    assert f"the 3 shard(s)' {format_bytes(weights)} on disk" in budget


def test_the_run_s_readings_reach_the_stages_that_take_them(monkeypatch) -> None:
    from opsbook.stages import base
    from opsbook.steps.host_facts import RunReadings

    seen = []

    def record(host, dep, options) -> Report:
        seen.append(options.readings)
        return Report(State.OK, Result(True, "fine"))

    dep = deployment("a")
    preflight_like = Stage("check", "99_check", False, record, module="preflight")
    monkeypatch.setattr(base, "_shared_readings", None)
    run_stage(preflight_like, dep, group=HostGroup([FakeHost("a")]), on_result=None)
    readings = RunReadings()
    base.share_readings(readings)  # as the deploy's shared kernel does when it starts
    run_stage(preflight_like, dep, group=HostGroup([FakeHost("a")]), on_result=None)
    # A stage without readings among its options runs as before.
    done = run_stage(CHECK, dep, group=HostGroup([FakeHost("a", probes={"check": ok})]))
    assert seen == [None, readings] and done.ok
    # Preflight keeps its reading there, and 02_config_patch takes the GPUs and vLLM from it;
    # neither is a notebook parameter.
    for stage in (stages.get("preflight"), stages.get("config-patch")):
        field = {f.name: f for f in dataclasses.fields(stage.options_type)}["readings"]
        assert field.metadata.get(HOOK), stage.name


def parameters_cell(notebook: str) -> list[ast.Assign]:
    """The assignments of the notebook's ``parameters`` cell, in order."""
    nb = json.loads((NOTEBOOKS_DIR / f"{notebook}.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", [])]
    tree = ast.parse("".join(cell["source"]))
    return [node for node in tree.body if isinstance(node, ast.Assign)]


@pytest.mark.parametrize(
    "stage", [*stages.STAGES, stages.STOP, stages.UPGRADE], ids=lambda s: s.name
)
def test_a_stage_notebooks_parameters_cell_declares_its_options_with_their_defaults(stage) -> None:
    assigned = parameters_cell(stage.notebook)
    names = [node.targets[0].id for node in assigned]  # type: ignore[attr-defined]
    expected = stages.parameters_of(stage)
    assert names == ["deployment", *(p.name for p in expected)]
    deployment, *values = assigned
    # The runner sets it; in JupyterLab it comes from the variable opsbook.core.channel names.
    assert channel.DEPLOYMENT_ENV in ast.unparse(deployment.value)
    for node, parameter in zip(values, expected, strict=True):
        literal = ast.literal_eval(node.value)  # papermill needs plain literals
        assert (literal, type(literal)) == (parameter.default, type(parameter.default)), (
            parameter.name
        )


@pytest.mark.parametrize("stage", [*stages.STAGES, stages.UPGRADE], ids=lambda s: s.name)
def test_each_option_has_a_default_of_its_declared_type(stage) -> None:
    kind = stage.options_type
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        if f.metadata.get(HOOK):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert isinstance(default, typing.get_origin(hints[f.name]) or hints[f.name]), f.name


def test_the_form_shows_a_stage_notebooks_parameters_from_its_namespace() -> None:
    namespace = {"deployment": "d.yml", "hosts": ["ops@a"], "forks": 3, "apply": True}
    namespace |= {"ready_timeout": 60, "stop_grace": 5, "restart": "always"}
    namespace |= {"other": "not a parameter"}
    form = widgets.DeploymentForm("d.yml", [], notebook="04_launch", namespace=namespace)
    assert form.parameters == {
        "hosts": ["ops@a"],
        "forks": 3,
        "apply": True,
        "ready_timeout": 60,
        "stop_grace": 5,
        "restart": "always",
    }


def test_an_option_the_stage_does_not_have_is_refused_before_any_host_is_touched() -> None:
    host = FakeHost("a")
    with pytest.raises(RunError, match="the launch stage has no option.s. ready_timout") as e:
        run_stage(stages.get("launch"), deployment("a"), group=HostGroup([host]), ready_timout=5)
    assert "apply, ready_timeout, stop_grace, on_progress" in (e.value.remedy or "")
    assert host.calls == []


def test_the_options_run_stage_is_given_reach_the_stage_as_its_options_class() -> None:
    seen = []

    def record(host, dep, options) -> Report:
        seen.append(options)
        return Report(State.OK, Result(True, "fine"))

    script_like = Stage("check", "99_check", False, record, module="launch_script")
    run_stage(
        script_like, deployment("a"), group=HostGroup([FakeHost("a")]), on_result=None, apply=True
    )
    assert seen == [stages.launch_script.Options(entrypoint="serve", apply=True)]
    with pytest.raises(RunError, match="the check stage has no option.s. apply"):
        run_stage(CHECK, deployment("a"), group=HostGroup([FakeHost("a")]), apply=True)
    assert stages.STOP.options_type is stages.launch_server.Options


def side_answer(ray: str = "2.58.0", vllm: str = "0.15.1") -> str:
    versions = {"torch": "2.9.1", "ray": ray, "vllm": vllm}
    return json.dumps({"versions": versions, "script_sha256": "", "engine_lines": []})


def side_host(address: str, *, ray: str = "2.58.0", vllm: str = "0.15.1", **kwargs) -> FakeHost:
    """A host whose stage says "checked", whose facts probe does not answer (the GPUs are
    unknown), and whose deployment python answers the side-by-side command."""
    unanswered = ProbeError("the facts probe did not answer", host="")
    return FakeHost(
        address,
        commands={" -c ": side_answer(ray, vllm)},
        probes={"facts": unanswered, "check": {"ok": True, "msg": "checked"}},
        **kwargs,
    )


def test_a_stage_that_compares_its_hosts_amends_their_results_in_the_record(
    tmp_path, monkeypatch
) -> None:
    from opsbook.stages import preflight

    monkeypatch.setenv(channel.OUTCOME_ENV, str(tmp_path / "out.jsonl"))
    compared = Stage("check", "99_check", False, probe_stage, across=preflight.side_by_side)
    hosts = [side_host("a"), side_host("b", vllm="0.33.0"), side_host("c", unreachable=True)]
    seen = []
    group = HostGroup(hosts)
    run = run_stage(compared, deployment("a", "b", "c"), group=group, on_result=seen.append)
    a, b, c = run.results
    assert (a.state, b.state, c.state) == (State.OK, State.OK, State.UNREACHABLE)
    assert a.message == "checked; hosts differ: vLLM 0.15.1 (others 0.33.0)"
    assert b.findings[0].message == "hosts differ: vLLM: ops@a 0.15.1, ops@b 0.33.0"
    assert [f.code for f in b.findings] == ["hosts-differ", "hosts-side-by-side"]
    assert c.findings[0].severity == "error" and "hosts differ" not in c.message
    # Each host said as it finished, then the two whose line the comparison changed.
    assert sorted(r.message for r in seen if r.host == "ops@a") == ["checked", a.message]
    assert [r.state for r in seen if r.host == "ops@c"] == [State.UNREACHABLE]
    # In the record, the amended result in place of the first.
    recorded = channel.read(tmp_path / "out.jsonl")
    lines = sorted((r.host, r.state, r.message) for r in recorded)
    assert lines == [(r.host, r.state, r.message) for r in run.results]
    assert "<b>0.33.0</b>" in run.side_by_side()._repr_html_()


def test_hosts_that_agree_are_said_once_and_their_rows_are_in_the_record(
    tmp_path, monkeypatch
) -> None:
    from opsbook.stages import preflight

    monkeypatch.setenv(channel.OUTCOME_ENV, str(tmp_path / "out.jsonl"))
    compared = Stage("check", "99_check", False, probe_stage, across=preflight.side_by_side)
    seen = []
    group = HostGroup([side_host("a"), side_host("b")])
    run = run_stage(compared, deployment("a", "b"), group=group, on_result=seen.append)
    assert [r.message for r in seen] == ["checked", "checked"]
    recorded = channel.read(tmp_path / "out.jsonl")
    assert [[f.subject for f in r.findings] for r in recorded] == [["hosts side by side"]] * 2
    assert "Ray 2.58.0" in recorded[0].findings[0].message
    assert "agree" in repr(run.side_by_side())


def test_a_run_told_not_to_compare_reads_no_host_again() -> None:
    """The scheduled health check: one status probe per host, no side by side after."""
    from opsbook.stages import preflight

    compared = Stage("check", "99_check", False, probe_stage, across=preflight.side_by_side)
    hosts = [side_host("a"), side_host("b", vllm="0.33.0")]
    run = run_stage(
        compared, deployment("a", "b"), group=HostGroup(hosts), on_result=None, compare=False
    )
    assert [r.message for r in run.results] == ["checked", "checked"]
    # Each host was asked for its stage's probe only: no facts probe, no python command after.
    asked = [[call for call in h.calls if call[0] != "close"] for h in hosts]
    assert asked == [[("probe", "check")]] * 2


def test_one_host_has_nothing_to_compare_and_a_failed_comparison_costs_no_result() -> None:
    from opsbook.stages import preflight

    compared = Stage("check", "99_check", False, probe_stage, across=preflight.side_by_side)
    host = side_host("a")
    one = run_stage(compared, deployment("a"), group=HostGroup([host]), on_result=None)
    assert "nothing to compare" in one.side_by_side()
    assert [kind for kind, _ in host.calls if kind != "close"] == ["probe"]  # nothing more

    def broken(hosts, dep, reports):
        raise KeyError("side")

    failing = Stage("check", "99_check", False, probe_stage, across=broken)
    hosts = [side_host(n) for n in ("a", "b")]
    run = run_stage(failing, deployment("a", "b"), group=HostGroup(hosts), on_result=None)
    assert [r.state for r in run.results] == [State.OK, State.OK]
    assert "not compared: KeyError" in run.side_by_side()


def test_a_clusters_nodes_are_read_again_after_its_stage_and_a_ray_upgrade_fails_them() -> None:
    from opsbook.stages import diagnose

    def all_ready(hosts, dep, options):
        return {h.name: Report(State.OK, Result(True, "ready")) for h in hosts}

    doc = {
        **DOC,
        "hosts": [{"address": a, "user": "ops"} for a in ("head", "worker")],
        "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
    }
    hosts = [side_host("head"), side_host("worker", ray="2.59.0")]
    checked = Stage(
        "diagnose",
        "05_diagnose",
        False,
        probe_stage,
        run_cluster=all_ready,
        across=diagnose.nodes_side_by_side,
    )
    run = run_stage(checked, parse_deployment(doc), group=HostGroup(hosts), on_result=None)
    assert [r.state for r in run.results] == [State.FAILED, State.FAILED]
    assert {r.failure_id for r in run.results} == {"ray-version-mismatch"}
    [ray] = [f for f in run.results[1].findings if f.severity == "error"]
    assert ray.message == "hosts differ: Ray: ops@head 2.58.0, ops@worker 2.59.0"
    assert "<b>2.59.0</b>" in run.side_by_side()._repr_html_()
