"""What a start needs, checked before a running server is stopped (issue 32, item 1)."""

from __future__ import annotations

from typing import Any

import pytest

from opsbook.core.deployment import parse_deployment
from opsbook.knowledge import vllm_facts
from opsbook.steps.host_facts import HostFacts, ListeningSocket, OsInfo, PythonInfo
from opsbook.steps.smi_parse import Gpu, Topology
from opsbook.steps.start_checks import check_before_stop, gpus_needed

RELEASE = vllm_facts.releases()[-1]


def facts(
    gpus: int = 8, listening: tuple[ListeningSocket, ...] = (), vllm: str | None = RELEASE
) -> HostFacts:
    return HostFacts(
        host="gpu-01",
        gpus=[Gpu(i, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition") for i in range(gpus)],
        processes=[],
        topology=Topology(),
        driver="580.95.05",
        cuda="13.0",
        os=OsInfo(),
        python=PythonInfo(requested="python3"),
        vllm_version=vllm,
        disk_free_bytes=None,
        shm_total=None,
        shm_free=None,
        listening=list(listening),
        servers=[],
    )


def deployment(args: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    server: dict[str, Any] = {"port": 8000, "args": args}
    if env:
        server["env"] = env
    return parse_deployment({"hosts": ["gpu-01"], "model": {"path": "/m"}, "server": server})


def test_a_start_that_fits_is_ok() -> None:
    got = check_before_stop(facts(), deployment({"tensor-parallel-size": 8}), {})
    assert got.ok and not got.findings


def test_seven_gpus_for_tensor_parallel_eight_is_refused_before_the_stop() -> None:
    got = check_before_stop(facts(gpus=7), deployment({"tensor-parallel-size": 8}), {})
    assert not got.ok and "nothing was stopped" in got.message
    [finding] = got.findings
    assert "needs 8 GPU(s) (tensor-parallel-size 8) and would see 7" in finding.message


def test_cuda_visible_devices_bounds_what_the_server_sees() -> None:
    dep = deployment({"tensor-parallel-size": 4}, {"CUDA_VISIBLE_DEVICES": "0,1"})
    [finding] = check_before_stop(facts(), dep, {}).findings
    assert "would see 2" in finding.message


@pytest.mark.parametrize(
    ("args", "needed"),
    [
        ({}, 1),
        ({"tensor-parallel-size": 4, "pipeline-parallel-size": 2}, 8),
        ({"tensor-parallel-size": "2", "data-parallel-size": 4}, 8),
        ({"--tensor-parallel-size": 2}, 2),
    ],
)
def test_the_gpus_a_server_needs(args: dict[str, Any], needed: int) -> None:
    assert gpus_needed(args) == needed


def test_the_port_held_by_our_own_server_is_fine_and_by_another_is_not() -> None:
    ours = ListeningSocket(8000, "0.0.0.0", "ipv4", "ops", pid=4242, process="python3")
    other = ListeningSocket(8000, "0.0.0.0", "ipv4", "nobody", pid=None)
    dep = deployment({})
    assert check_before_stop(facts(listening=(ours,)), dep, {4242}).ok
    [finding] = check_before_stop(facts(listening=(ours, other)), dep, {4242}).findings
    assert "already taken by a process of user nobody" in finding.message


def test_a_flag_the_installed_release_does_not_accept_is_refused() -> None:
    accepted = vllm_facts.load(RELEASE).serve_flags
    assert "--tensor-parallel-size" in accepted
    got = check_before_stop(facts(), deployment({"no-such-flag-at-all": True}), {})
    [finding] = got.findings
    assert f"vLLM {RELEASE} on this host does not accept --no-such-flag-at-all" in finding.message


@pytest.mark.parametrize("version", [None, "0.0.1", f"{RELEASE}rc1", "99.0.0"])
def test_flags_are_not_judged_for_a_release_opsbook_has_not_read(version: str | None) -> None:
    assert check_before_stop(facts(vllm=version), deployment({"no-such-flag": True}), {}).ok
