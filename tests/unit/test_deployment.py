import pytest

from opsbook.deployment import is_secret_flag, load_deployment, parse_deployment
from opsbook.exceptions import DeploymentError

GOOD = """
name: t
hosts:
  - {address: gpu-01, port: 2222, user: ops, key: keys/id, known_hosts: kh}
model: {path: /models/m}
server: {port: 8001, args: {tensor-parallel-size: 8}, env: {NCCL_P2P_LEVEL: SYS}}
secrets: [MY_TOKEN]
"""


def test_a_deployment_is_read_with_paths_relative_to_it(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(GOOD)
    dep = load_deployment(f, {"server.port": 9000})
    assert dep.host.name == "ops@gpu-01:2222"
    assert dep.host.key == str(tmp_path / "keys/id")
    assert dep.server_port == 9000
    assert dep.env == {"NCCL_P2P_LEVEL": "SYS"}
    assert "MY_TOKEN" in dep.secrets and "HF_TOKEN" in dep.secrets


@pytest.mark.parametrize(
    "text, message",
    [
        ("hosts: []\nmodel: {path: /m}", "'hosts' must be a non-empty list"),
        ("hosts: [a]", "'model.path' is required"),
        ("hosts: [{address: a, colour: red}]\nmodel: {path: /m}", "unknown keys"),
        ("hosts: [{address: a, port: x}]\nmodel: {path: /m}", "port must be an integer"),
        ("hosts: [a]\nmodel: {path: /m}\nserver: {env: {'A-B': 1}}", "not a valid environment"),
        ("hosts: [a\n", "not valid YAML"),
        ("- a", "mapping at the top level"),
    ],
)
def test_bad_deployments_name_the_problem(tmp_path, text: str, message: str) -> None:
    f = tmp_path / "d.yml"
    f.write_text(text)
    with pytest.raises(DeploymentError, match=message):
        load_deployment(f)


def test_missing_file_says_so(tmp_path) -> None:
    with pytest.raises(DeploymentError, match="does not exist") as e:
        load_deployment(tmp_path / "nope.yml")
    assert e.value.remedy


@pytest.mark.parametrize(
    "flag, secret",
    [
        ("api-key", True),
        ("hf-token", True),
        ("ssl-password", True),
        ("client-secret-file", True),
        ("max-num-batched-tokens", False),
        ("tokenizer", False),
        ("tokenizer-mode", False),
        ("ssl-keyfile", False),
        ("tensor-parallel-size", False),
    ],
)
def test_secret_flags_are_told_by_whole_words(flag: str, secret: bool) -> None:
    assert is_secret_flag(flag) is secret


def test_secret_serve_args_are_secret_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "from-the-environment")
    args = {"api-key": "written-by-mistake", "hf-token": True, "max-num-batched-tokens": 8192}
    dep = parse_deployment(
        {
            "hosts": ["a"],
            "model": {"path": "/m"},
            "server": {"args": args},
            "secrets": ["MY_TOKEN"],
        }
    )
    assert dep.secret_args() == {"api-key": ["written-by-mistake"]}
    assert set(dep.secret_values()) >= {"from-the-environment", "written-by-mistake"}


def test_a_host_sees_the_deployment_through_its_own_vars() -> None:
    dep = parse_deployment(
        {
            "hosts": [
                {"address": "gpu-01", "vars": {"model": {"path": "/m1"}, "server": {"port": 9001}}},
                "gpu-02",
            ],
            "model": {"path": "/models/m"},
            "server": {"port": 8000, "args": {"tensor-parallel-size": 8}},
        }
    )
    first, second = (dep.for_host(h) for h in dep.hosts)
    assert (first.model_path, first.server_port, first.hosts) == ("/m1", 9001, [dep.hosts[0]])
    assert first.serve_args == {"tensor-parallel-size": 8}
    assert (second.model_path, second.server_port, second.hosts) == (
        "/models/m",
        8000,
        [dep.hosts[1]],
    )


def test_a_single_host_file_is_its_own_view() -> None:
    dep = parse_deployment({"hosts": ["gpu-01"], "model": {"path": "/m"}})
    assert dep.for_host(dep.host) == dep and not dep.host_views


def test_host_vars_must_be_a_mapping() -> None:
    with pytest.raises(DeploymentError, match="vars must be a mapping"):
        parse_deployment({"hosts": [{"address": "a", "vars": [1]}], "model": {"path": "/m"}})


def test_the_example_deployments_load() -> None:
    from pathlib import Path

    examples = sorted((Path(__file__).parents[2] / "deployments").glob("*.yml"))
    assert examples
    fleet = load_deployment(examples[[p.name for p in examples].index("fleet-example.yml")])
    assert [fleet.for_host(h).server_port for h in fleet.hosts] == [8000, 8000, 8001]
    for path in examples:
        assert load_deployment(path).hosts
