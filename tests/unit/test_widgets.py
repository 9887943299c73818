import pytest

from opsbook import widgets
from opsbook.core.results import Result


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
