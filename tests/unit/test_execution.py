"""--limit: which hosts of a deployment a pattern picks (names, addresses, globs, indices)."""

import pytest

from opsbook.core.deployment import parse_deployment
from opsbook.core.exceptions import RunError
from opsbook.runner.execution import limit_hosts

FLEET = parse_deployment(
    {
        "name": "fleet",
        "hosts": [
            {"address": "gpu-01", "user": "ops"},
            {"address": "gpu-02", "user": "ops"},
            {"address": "gpu-03", "user": "ops", "port": 2222},
            {"address": "10.0.0.4"},
        ],
        "model": {"path": "/m"},
    }
)


@pytest.mark.parametrize(
    "limit, picked",
    [
        ("ops@gpu-02", ["ops@gpu-02"]),  # a host's name
        ("gpu-03", ["ops@gpu-03:2222"]),  # its address
        ("gpu-0*", ["ops@gpu-01", "ops@gpu-02", "ops@gpu-03:2222"]),  # a glob of addresses
        ("*:2222", ["ops@gpu-03:2222"]),  # a glob of names
        ("3", ["10.0.0.4"]),  # an index, from 0
        ("[0]", ["ops@gpu-01"]),  # Ansible's spelling
        ("1:2", ["ops@gpu-02", "ops@gpu-03:2222"]),  # an inclusive range
        ("[2:9]", ["ops@gpu-03:2222", "10.0.0.4"]),  # past the end: up to the last
        ("10.0.0.4, 0", ["ops@gpu-01", "10.0.0.4"]),  # several, in the deployment's order
        ("gpu-01,ops@gpu-01", ["ops@gpu-01"]),  # a host picked twice is one host
    ],
)
def test_a_limit_picks_hosts_in_the_deployments_order(limit: str, picked: list[str]) -> None:
    assert limit_hosts(FLEET, limit) == picked


@pytest.mark.parametrize("limit", ["gpu-09", "4", "[7:9]", "gpu-01,nope", " , "])
def test_a_limit_that_picks_no_host_is_refused_listing_them(limit: str) -> None:
    with pytest.raises(RunError) as e:
        limit_hosts(FLEET, limit)
    assert "picks no host" in e.value.message or "--limit is empty" in e.value.message
    assert e.value.remedy == (
        "the hosts are: [0] ops@gpu-01, [1] ops@gpu-02, [2] ops@gpu-03:2222, [3] 10.0.0.4"
    )


def test_a_cluster_is_limited_whole_or_not_at_all() -> None:
    cluster = parse_deployment(
        {
            "hosts": ["gpu-01", "gpu-02"],
            "model": {"path": "/m"},
            "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        }
    )
    assert limit_hosts(cluster, "gpu-*") == ["gpu-01", "gpu-02"]
    with pytest.raises(RunError, match="picks 1 of the 2 nodes") as e:
        limit_hosts(cluster, "gpu-02")
    assert "leave --limit out" in (e.value.remedy or "")
