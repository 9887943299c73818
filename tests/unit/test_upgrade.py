"""07_upgrade's stage: what it refuses before it touches the host (its paths on a rehearsal
host are tests/integration/test_upgrade.py)."""

from __future__ import annotations

from opsbook.core.deployment import parse_deployment
from opsbook.core.results import State
from opsbook.remote.testing import FakeHost
from opsbook.stages import upgrade

DEP = parse_deployment({"hosts": ["gpu-01"], "model": {"path": "/m"}})


def test_without_a_new_engine_nothing_is_asked_of_the_host() -> None:
    host = FakeHost("gpu-01")
    report = upgrade.run(host, DEP, upgrade.Options())
    assert report.state is State.FAILED
    assert report.verdict.message == (
        "refused before the stop, nothing stopped: new engine: no new engine named"
    )
    assert report.verdict.findings[0].remedy == "-p to /path/to/env/bin/python"
    assert host.calls == []


def test_a_dry_run_knows_the_version_a_pinned_requirement_installs() -> None:
    assert upgrade._planned_version("vllm==0.18.0") == "0.18.0"
    assert upgrade._planned_version(" VLLM == 0.19.1rc1 ") == "0.19.1rc1"
    assert upgrade._planned_version("/wheels/vllm-0.18.0-cp38-abi3.whl") is None


def test_the_stage_is_found_by_its_names_and_is_no_stage_of_a_deploy() -> None:
    from opsbook import stages

    assert stages.get("07_upgrade") is stages.get("upgrade") is stages.UPGRADE
    assert stages.for_notebook("07_upgrade") is stages.UPGRADE
    assert stages.UPGRADE not in stages.STAGES and stages.UPGRADE not in stages.DEPLOY


def test_an_env_changed_in_place_since_the_pin_is_said() -> None:
    [drift] = upgrade.pinned_drift("0.18.0", "0.18.1")
    assert drift.severity == "warning" and "pins vLLM 0.18.0 but its interpreter has 0.18.1" in (
        drift.message
    )
    assert upgrade.pinned_drift("0.18.0", "0.18.0") == upgrade.pinned_drift(None, "0.18.0") == []
