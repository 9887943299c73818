import pytest

from opsbook.deployment import load_deployment
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
