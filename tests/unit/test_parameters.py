"""`-p` values held to the limits their stage declares (opsbook.stages.base.Limits), before a
kernel starts or a host is touched: exit 2 with the range and an example, never exit 3."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from opsbook import cli, stages
from opsbook.core.exceptions import RunError
from opsbook.runner import run
from opsbook.runner.parameters import check_limits, find_notebook, typed_parameters
from opsbook.stages.base import LIMITS, Limits, Targets

# (notebook, -p pairs, what the message says)
OUT_OF_RANGE = [
    ("00_preflight", [("forks", "0")], "-p forks 0: must be at least 1"),
    ("00_preflight", [("forks", "-3")], "-p forks -3: must be at least 1"),
    ("05_diagnose", [("forks", "0")], "must be at least 1"),
    ("01_download_check", [("forks", "-1")], "must be at least 1"),
    ("04_launch", [("ready_timeout", "-5")], "-p ready_timeout -5: must be at least 1"),
    ("04_launch", [("ready_timeout", "0")], "must be at least 1"),
    ("04_launch", [("stop_grace", "-1")], "-p stop_grace -1: must be at least 0"),
    ("04_launch", [("stop_grace", "-99999999999")], "must be at least 0"),
    ("01_download_check", [("watch_timeout", "0")], "-p watch_timeout 0: must be at least 1"),
    ("01_download_check", [("watch_timeout", "-600")], "must be at least 1"),
    ("02_config_patch", [("gpu_memory_utilization", "1.5")], "must be above 0 and at most 1"),
    ("02_config_patch", [("gpu_memory_utilization", "1.0001")], "must be above 0 and at most 1"),
    ("02_config_patch", [("gpu_memory_utilization", "0")], "must be above 0 and at most 1"),
    ("02_config_patch", [("gpu_memory_utilization", "-0.5")], "must be above 0 and at most 1"),
    ("02_config_patch", [("gpu_memory_utilization", "90")], "must be above 0 and at most 1"),
    ("02_config_patch", [("gpu_memory_utilization", "1e9")], "must be above 0 and at most 1"),
    ("02_config_patch", [("apply", "true"), ("restore", "true")], "cannot be given with apply"),
    ("02_config_patch", [("restore", "TRUE"), ("apply", "True")], "cannot be given with apply"),
    ("03_launch_script", [("entrypoint", "foo")], "must be one of serve, module"),
    ("03_launch_script", [("entrypoint", "")], "must be one of serve, module"),
    ("03_launch_script", [("entrypoint", "Serve")], "must be one of serve, module"),
    ("03_launch_script", [("entrypoint", "serve; rm -rf /")], "must be one of serve, module"),
]


@pytest.mark.parametrize(("notebook", "pairs", "message"), OUT_OF_RANGE)
def test_a_value_outside_its_declared_limits_is_refused_as_typed(
    notebook: str, pairs: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(RunError) as refused:
        typed_parameters(find_notebook(notebook), pairs)
    assert message in str(refused.value)
    assert "remedy:" in str(refused.value)


@pytest.mark.parametrize(("notebook", "pairs", "message"), OUT_OF_RANGE)
def test_a_value_outside_its_limits_exits_2_before_a_kernel_or_a_host(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    notebook: str,
    pairs: list[tuple[str, str]],
    message: str,
) -> None:
    dep = tmp_path / "d.yml"
    # An address nothing answers on: a run that got as far as a host would exit 4, not 2.
    dep.write_text("hosts: [{address: 127.0.2.250, port: 42250}]\nmodel: {path: /m}\n")
    argv = ["run", notebook, "-f", str(dep), "--runs-dir", str(tmp_path / "runs")]
    for name, value in pairs:
        argv += ["-p", name, value]
    assert cli.main(argv) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and "remedy:" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("notebook", "pairs"),
    [
        ("00_preflight", [("forks", "1")]),
        ("04_launch", [("ready_timeout", "1"), ("stop_grace", "0")]),
        ("02_config_patch", [("gpu_memory_utilization", "1")]),
        ("02_config_patch", [("gpu_memory_utilization", "0.01")]),
        ("02_config_patch", [("restore", "true"), ("apply", "false")]),
        ("02_config_patch", [("apply", "true")]),
        ("03_launch_script", [("entrypoint", "module")]),
    ],
)
def test_values_at_the_edges_of_their_limits_are_taken(
    notebook: str, pairs: list[tuple[str, str]]
) -> None:
    values = typed_parameters(find_notebook(notebook), pairs)
    assert set(values) == {name for name, _ in pairs}


def test_every_number_a_stage_takes_declares_its_limits() -> None:
    # A new count or timeout without limits would reach the kernel with 0 or -1 again.
    fields = list(dataclasses.fields(Targets))
    for stage in (*stages.STAGES, stages.UPGRADE):
        fields += dataclasses.fields(stage.options_type)
    numbers = [f for f in fields if type(f.default) in (int, float)]
    assert numbers
    assert [f.name for f in numbers if LIMITS not in f.metadata] == []


def test_limits_are_read_from_the_fields_and_nan_is_in_no_range() -> None:
    @dataclasses.dataclass
    class Some:
        share: float = dataclasses.field(default=0.5, metadata={LIMITS: Limits(low=0, high=1)})

    check_limits(dataclasses.fields(Some), {"share": 1.0})
    with pytest.raises(RunError, match="must be at least 0 and at most 1"):
        check_limits(dataclasses.fields(Some), {"share": float("nan")})


def test_a_notebooks_parameter_names_read_from_its_cell_are_its_stages_options() -> None:
    from opsbook.runner.parameters import parameter_names

    stages.import_runbook()
    for stage in stages.STAGES:
        declared = {p.name for p in stages.parameters_of(stage)}
        assert parameter_names(find_notebook(stage.notebook)) == declared, stage.name


def test_a_notebooks_parameter_names_are_read_without_importing_its_stage() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from opsbook.runner.parameters import find_notebook, parameter_names\n"
        "assert 'apply' in parameter_names(find_notebook('04_launch'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opsbook.stages.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
