import pytest

from opsbook.core.deployment import ClusterSpec, is_secret_flag, load_deployment, parse_deployment
from opsbook.core.exceptions import DeploymentError

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


BASE = "hosts: [gpu-01]\nmodel: {path: /m}\n"

# Each bad deployment: the YAML, then what the error must name: the key path, the problem and
# expectation, and the remedy. Every one of them was accepted, or gave a traceback, before the
# strict schema (issue 13).
BAD = [
    ("hosts: []\nmodel: {path: /m}", "hosts:", "at least one entry", "hosts: [{address"),
    ("hosts: [a]", "model:", "is required", "model: {path:"),
    ("hosts: [a]\nmodel: {}", "model.path:", "is required", "path: /data/models"),
    (
        "hosts: [{address: a, colour: red}]\nmodel: {path: /m}",
        "hosts[0].colour:",
        "unknown key 'colour'",
        "valid keys under hosts[0]: address, port",
    ),
    ("hosts: [{address: a, port: x}]\nmodel: {path: /m}", "hosts[0].port:", "integer", "port: 22"),
    (
        "hosts: [a, {address: b, port: 70000}]\nmodel: {path: /m}",
        "hosts[1].port:",
        "from 1 to 65535, got 70000",
        "port: 22",
    ),
    ("hosts: [{address: a, port: 0}]\nmodel: {path: /m}", "hosts[0].port:", "from 1 to", ""),
    (
        "hosts: [{address: a, port: '22'}]\nmodel: {path: /m}",
        "hosts[0].port:",
        "expected an integer, got a string '22'",
        "port: 22",
    ),
    (
        "hosts: [{address: a, trust_on_first_use: 'false'}]\nmodel: {path: /m}",
        "hosts[0].trust_on_first_use:",
        "expected true or false, got a string 'false'",
        "without quotes",
    ),
    (
        "hosts: [{address: a, trust_on_first_use: yes}]\nmodel: {path: /m}",
        "hosts[0].trust_on_first_use:",
        "expected true or false, got a string 'yes'",
        "without quotes",
    ),
    (
        "hosts: [{address: a, trust_on_first_use: yes please}]\nmodel: {path: /m}",
        "trust_on_first_use",
        "expected true or false",
        "without quotes",
    ),
    (
        "hosts: [{address: a, connect_timeout: 0}]\nmodel: {path: /m}",
        "hosts[0].connect_timeout:",
        "greater than 0",
        "connect_timeout: 10",
    ),
    (
        "hosts: [{address: a, command_timeout: -5}]\nmodel: {path: /m}",
        "hosts[0].command_timeout:",
        "greater than 0",
        "",
    ),
    ("hosts: [{address: a, keepalive: -1}]\nmodel: {path: /m}", "keepalive", "at least 0", ""),
    (
        "hosts: [{address: a, connect_timeout: .inf}]\nmodel: {path: /m}",
        "hosts[0].connect_timeout:",
        "finite number",
        "connect_timeout: 10",
    ),
    ("hosts: [{address: a, connect_timeout: .nan}]\nmodel: {path: /m}", "connect_timeout", "", ""),
    ("hosts: [null]\nmodel: {path: /m}", "hosts[0]:", "expected a mapping", "hosts: [{address"),
    (BASE + "secrets: [null]", "secrets[0]:", "got nothing (null)", "secrets: [HF_TOKEN]"),
    (BASE + "server: {args: {x: !!binary aGVsbG8=}}", "server.args.x:", "got bytes", "no tags"),
    (BASE + "server: {env: {A: 2024-01-01}}", "server.env.A:", "got date", "quote the value"),
    ("a: &a [*a]\n" + BASE, "", "nested more than", "remove the nesting"),
    (BASE + "---\n" + BASE, "", "single document", "fix the YAML"),
    ("hosts: [{port: 22}]\nmodel: {path: /m}", "hosts[0].address:", "is required", "address:"),
    ("hosts: [{address: ''}]\nmodel: {path: /m}", "hosts[0].address:", "non-empty", ""),
    ("hosts: gpu-01\nmodel: {path: /m}", "hosts:", "expected a list", "hosts: [gpu-01]"),
    ("hosts: [[a]]\nmodel: {path: /m}", "hosts[0]:", "expected a mapping", ""),
    ("hosts: [{address: 12}]\nmodel: {path: /m}", "hosts[0].address:", "expected a string", ""),
    (BASE + "sever: {port: 8001}", "sever:", "unknown key 'sever'", "did you mean 'server'?"),
    (BASE + "secret: [X]", "secret:", "unknown key", "did you mean 'secrets'?"),
    (BASE + "server: {prot: 8001}", "server.prot:", "unknown key", "did you mean 'port'?"),
    (BASE + "server: {port: 70000}", "server.port:", "from 1 to 65535", "port: 8000"),
    (BASE + "server: {port: 8000.5}", "server.port:", "expected an integer", "port: 8000"),
    (BASE + "server: {port: true}", "server.port:", "expected an integer", ""),
    (BASE + "server: {args: [ab, cd]}", "server.args:", "expected a mapping", "args: {tensor"),
    (BASE + "server: {args: x}", "server.args:", "expected a mapping", ""),
    (BASE + "server: [port, 8000]", "server:", "expected a mapping", ""),
    (BASE + "server: {env: [A=1]}", "server.env:", "expected a mapping", "env: {NCCL"),
    (BASE + "server: {env: {'A-B': 1}}", "server.env", "not a valid environment", "MY_TOKEN"),
    (BASE + "server: {env: {A: [1, 2]}}", "server.env.A:", "expected a string or a number", ""),
    (BASE + "server: {env: {A: {b: 1}}}", "server.env.A:", "expected a string or a number", ""),
    (BASE + "server: {env: {A: true}}", "server.env.A:", "got a boolean", "quote the value"),
    (BASE + "server: {env: {A: null}}", "server.env.A:", "got nothing (null)", "quote the value"),
    (BASE + "server: {args: {1: x}}", "server.args", "expected a string", ""),
    (BASE + "server: {args: {model: /x}}", "server.args", "set by the deployment", "model.path"),
    (BASE + "server: {args: {port: 1}}", "server.args", "set by the deployment", "server.port"),
    (BASE + "server: {args: {Tensor_Parallel: 8}}", "server.args", "not a valid flag", "tensor"),
    (BASE + "server: {args: {'--x; rm -rf /': 1}}", "server.args", "not a valid flag", ""),
    (BASE + "server: {args: {x: {1: y}}}", "server.args.x:", "keys must be strings", ""),
    (BASE + "secrets: MY_SECRET", "secrets:", "expected a list", "secrets: [MY_SECRET]"),
    (BASE + "secrets: {A: 1}", "secrets:", "expected a list", "secrets: [HF_TOKEN]"),
    (BASE + "secrets: [1]", "secrets[0]:", "expected a string", ""),
    (BASE + "secrets: ['MY-SECRET']", "secrets[0]:", "not a valid environment variable", ""),
    (BASE + "python: 3", "python:", "expected a string", "quote it"),
    (BASE + "python: ''", "python:", "empty string", ""),
    (BASE + "paths: {script: ''}", "paths.script:", "empty string", "leave the key out"),
    (BASE + "paths: {scirpt: x}", "paths.scirpt:", "unknown key", "did you mean 'script'?"),
    (BASE + "paths: opsbook", "paths:", "expected a mapping", ""),
    (BASE + "name: [a]", "name:", "expected a string", ""),
    ('hosts: [a]\nmodel: {path: "/m\\nrm -rf /"}', "model.path:", "line break", "one line"),
    ("hosts: [a]\nmodel: /data/m", "model:", "expected a mapping", "model: {path:"),
    (
        "hosts: [{address: a, vars: [1]}]\nmodel: {path: /m}",
        "hosts[0].vars:",
        "expected a mapping",
        "vars: {server",
    ),
    (
        "hosts: [{address: a, vars: {hosts: [b]}}]\nmodel: {path: /m}",
        "hosts[0].vars.hosts:",
        "unknown key",
        "valid keys under hosts[0].vars",
    ),
    (
        "hosts: [{address: a, vars: {server: {port: x}}}]\nmodel: {path: /m}",
        "hosts[0].vars.server.port:",
        "expected an integer",
        "",
    ),
    (
        BASE + "cluster: {tensor_parallel_size: 8}",
        "cluster.pipeline_parallel_size:",
        "required",
        "",
    ),
    (
        BASE + "cluster: {tensor_parallel_size: 0, pipeline_parallel_size: 1}",
        "cluster.tensor_parallel_size:",
        "at least 1",
        "",
    ),
    (
        BASE + "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2, head: gpu-02}",
        "cluster.head",
        "'gpu-02' is none of the hosts (did you mean 'gpu-01'?)",
        "set cluster.head to one of gpu-01",
    ),
    (
        BASE + "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2, ray_port: 0}",
        "cluster.ray_port:",
        "from 1 to 65535",
        "",
    ),
    (BASE + "server: {port: 1}\nserver: {port: 2}", "", "'server' is written twice", "keep one"),
    (
        "hosts: [{address: -oProxyCommand=id}]\nmodel: {path: /m}\n",
        "hosts[0].address",
        "'-oProxyCommand=id' is not a host name or address",
        "not starting with '-'",
    ),
    (
        "hosts: [{address: 'gpu-01; id'}]\nmodel: {path: /m}\n",
        "hosts[0].address",
        "is not a host name or address",
        "a DNS name",
    ),
    (
        "hosts: [{address: gpu-01, user: 'root$(id)'}]\nmodel: {path: /m}\n",
        "hosts[0].user",
        "'root$(id)' is not a login name",
        "as the host knows it",
    ),
    (
        "hosts: [gpu-01, gpu-02, {address: gpu-01, port: 22}]\nmodel: {path: /m}\n",
        "hosts[2]",
        "gpu-01 is listed twice (also hosts[0])",
        "list each host once",
    ),
    # `address: local` is this machine without SSH (issue 36, item 5).
    (
        "hosts: [{address: local, user: ops, port: 2222}]\nmodel: {path: /m}\n",
        "hosts[0]",
        "address: local runs on this machine without SSH, and port, user are read only by SSH",
        "remove port, user from this host",
    ),
    (
        "hosts: [local, gpu-01, local]\nmodel: {path: /m}\n",
        "hosts[2]",
        "address local is given twice (also hosts[0])",
        "keep one `local` host",
    ),
    (
        "hosts: [local, gpu-02]\nmodel: {path: /m}\n"
        "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2}\n",
        "hosts[0]",
        "a node of a model served across hosts cannot be `local`",
        "its address on the network between the nodes",
    ),
    # Contradictions and words the launch script cannot carry (issue 32, item 3).
    (
        "hosts: [a, b]\nmodel: {path: /m}\nserver: {args: {tensor-parallel-size: 4}}\n"
        "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2}\n",
        "server.args.tensor-parallel-size",
        "is 4 but the cluster sets it to 8",
        "set the size once, in cluster.tensor_parallel_size",
    ),
    (
        "hosts: [a, {address: b, vars: {server: {args: {--pipeline-parallel-size: 1}}}}]\n"
        "model: {path: /m}\ncluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2}\n",
        "hosts[1].vars.server.args.pipeline-parallel-size",
        "is 1 but the cluster sets it to 2",
        "leave pipeline-parallel-size out of hosts[1].vars.server.args",
    ),
    (
        "hosts: [a]\nmodel: {path: /m}\nserver: {args: {middleware: [x, --enforce-eager]}}\n",
        "server.args",
        "'--enforce-eager' begins with '-': vLLM's parser would read it as a flag",
        "give a flag its own key",
    ),
    (
        "hosts: [a]\nmodel: {path: /m}\nserver: {args: {served-model-name: -x}}\n",
        "server.args",
        "'-x' begins with '-'",
        "its own key",
    ),
    (
        "hosts: [a]\nmodel: {path: /m}\n"
        "server: {args: {--trust-remote-code: true, trust-remote-code: true}}\n",
        "server.args",
        "the flag --trust-remote-code is given twice",
        "keep one of the two keys",
    ),
    (
        'hosts: [a]\nmodel: {path: /m}\nserver: {args: {served-model-name: "k\\0x"}}\n',
        "server.args",
        "NUL byte",
        "remove the NUL byte",
    ),
    (
        'hosts: [a]\nmodel: {path: /m}\nserver: {env: {X: "a\\0b"}}\n',
        "server.env",
        "NUL byte",
        "remove the NUL byte",
    ),
    (
        BASE + "python: /a/bin/python\nengine: {version: 0.18.0, python: /b/bin/python}",
        "",
        "engine.python is '/b/bin/python' but python is '/a/bin/python'",
        "give the interpreter once",
    ),
    (
        BASE + "engine: {version: latest, python: /b/bin/python}",
        "engine.version:",
        "'latest' is not a vLLM version",
        "e.g. 0.18.0",
    ),
    ("hosts: [a\n", "", "not valid YAML", "fix the YAML syntax"),
    ("- a", "", "mapping at the top level, not a list", "start it with"),
    ("", "", "mapping at the top level, not nothing", "start it with"),
    ("just words", "", "mapping at the top level, not a string", ""),
    ("hosts: !!python/object/apply:os.system [id]", "", "not valid YAML", ""),
]


@pytest.mark.parametrize("text, path, problem, remedy", BAD)
def test_bad_deployments_name_the_key_the_problem_and_the_remedy(
    tmp_path, text: str, path: str, problem: str, remedy: str
) -> None:
    f = tmp_path / "d.yml"
    f.write_text(text)
    with pytest.raises(DeploymentError) as e:
        load_deployment(f)
    assert str(f) in e.value.message
    assert path in e.value.message and problem in e.value.message, e.value.message
    assert remedy in (e.value.remedy or ""), e.value.remedy
    if path or remedy:
        assert e.value.remedy, "every schema error says what to write instead"


def test_a_local_host_beside_ssh_hosts_keeps_its_command_timeout(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text("hosts: [{address: local, command_timeout: 30}, gpu-02]\nmodel: {path: /m}\n")
    local, remote = load_deployment(f).hosts
    assert (local.name, local.command_timeout, remote.name) == ("local", 30.0, "gpu-02")


def test_values_that_agree_or_read_as_numbers_are_accepted(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(
        "hosts: [a, b]\nmodel: {path: /m}\n"
        "server: {args: {tensor-parallel-size: '8', seed: -1, temperature: -.5}}\n"
        "cluster: {tensor_parallel_size: 8, pipeline_parallel_size: 2}\n"
    )
    dep = load_deployment(f)
    assert dep.serve_args["seed"] == -1 and dep.serve_args["tensor-parallel-size"] == "8"


def test_yes_no_on_off_are_text_not_booleans(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(BASE + "server: {env: {NCCL_DEBUG: off, COUNTRY: NO}, args: {x: True}}\n")
    dep = load_deployment(f)
    assert dep.env == {"NCCL_DEBUG": "off", "COUNTRY": "NO"} and dep.serve_args == {"x": True}


def test_several_problems_are_named_at_once(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text("hosts: [{address: a, port: 0}]\nmodel: {path: /m}\nsever: {}\n")
    with pytest.raises(DeploymentError, match="2 problems") as e:
        load_deployment(f)
    assert "hosts[0].port" in e.value.message and "sever" in e.value.message


def test_a_quoted_false_never_trusts_an_unknown_key(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text("hosts: [{address: a, trust_on_first_use: 'false'}]\nmodel: {path: /m}\n")
    with pytest.raises(DeploymentError):
        load_deployment(f)
    f.write_text("hosts: [{address: a, trust_on_first_use: false}]\nmodel: {path: /m}\n")
    assert load_deployment(f).host.trust_on_first_use is False


BILLION_LAUGHS = """
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
hosts: [gpu-01]
model: {path: /m}
server: {env: {X: *i}}
"""


def _bounded(call) -> tuple[float, int]:
    import time
    import tracemalloc

    tracemalloc.start()
    began = time.monotonic()
    try:
        call()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return time.monotonic() - began, peak


def test_a_billion_laughs_is_refused_fast_with_bounded_memory(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(BILLION_LAUGHS)
    caught: list[DeploymentError] = []

    def load() -> None:
        try:
            load_deployment(f)
        except DeploymentError as e:
            caught.append(e)

    seconds, peak = _bounded(load)
    assert caught and "aliases" in caught[0].message and caught[0].remedy
    assert seconds < 5 and peak < 50_000_000, (seconds, peak)


@pytest.mark.parametrize("opener, closer", [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_deeply_nested_yaml_is_refused_not_a_recursion_error(tmp_path, opener, closer) -> None:
    f = tmp_path / "d.yml"
    if opener == "- ":
        text = "hosts: [a]\nmodel: {path: /m}\nname:\n" + "".join(
            "  " * (i + 1) + "-\n" for i in range(200)
        )
    else:
        text = "hosts: [a]\nmodel: {path: /m}\nname: " + opener * 100_000 + closer * 100_000
    f.write_text(text)
    with pytest.raises(DeploymentError, match="nested more than") as e:
        load_deployment(f)
    assert e.value.remedy


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(BASE + "# " + "x" * 2_000_000 + "\n")
    with pytest.raises(DeploymentError, match="larger than"):
        load_deployment(f)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00bad", b"hosts: [a]\x00"])
def test_binary_files_are_refused_clearly(tmp_path, content: bytes) -> None:
    f = tmp_path / "d.yml"
    f.write_bytes(content)
    with pytest.raises(DeploymentError, match="not UTF-8|not valid YAML"):
        load_deployment(f)


def test_a_folder_is_not_a_deployment_file(tmp_path) -> None:
    with pytest.raises(DeploymentError, match="is a folder"):
        load_deployment(tmp_path)


def test_a_cluster_section_is_parsed_with_its_defaults() -> None:
    dep = parse_deployment(
        {
            "hosts": ["gpu-01", {"address": "gpu-02", "user": "ops"}],
            "model": {"path": "/m"},
            "cluster": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2},
        }
    )
    assert dep.cluster == ClusterSpec("gpu-01", 8, 2, 6379, None)
    named = parse_deployment(
        {
            "hosts": ["gpu-01", {"address": "gpu-02", "user": "ops"}],
            "model": {"path": "/m"},
            "cluster": {
                "head": "ops@gpu-02",
                "tensor_parallel_size": 4,
                "pipeline_parallel_size": 1,
                "ray_port": 6380,
                "interface": "eth0",
            },
        }
    )
    assert named.cluster == ClusterSpec("ops@gpu-02", 4, 1, 6380, "eth0")
    assert parse_deployment({"hosts": ["a"], "model": {"path": "/m"}}).cluster is None


def test_the_readme_reference_table_is_the_schema() -> None:
    from pathlib import Path

    from opsbook.core.deployment_text import reference_table

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert reference_table() in readme


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


def test_the_example_deployments_load() -> None:
    from pathlib import Path

    examples = sorted((Path(__file__).parents[2] / "deployments").glob("*.yml"))
    assert examples
    fleet = load_deployment(examples[[p.name for p in examples].index("fleet-example.yml")])
    assert [fleet.for_host(h).server_port for h in fleet.hosts] == [8000, 8000, 8001]
    for path in examples:
        assert load_deployment(path).hosts


def test_rolling_hooks_are_argument_lists_naming_only_the_host_and_its_address() -> None:
    doc = {
        "hosts": ["a"],
        "model": {"path": "/m"},
        "rolling": {
            "pre_host": ["./lb.sh", "drain", "{address}", '{"json": 1}'],
            "post_host": ["lb", "add", "name={host}"],
            "hook_timeout": 5,
        },
    }
    rolling = parse_deployment(doc).rolling
    assert rolling.pre_host == ("./lb.sh", "drain", "{address}", '{"json": 1}')
    assert rolling.post_host == ("lb", "add", "name={host}")
    assert rolling.hook_timeout == 5.0
    assert parse_deployment({"hosts": ["a"], "model": {"path": "/m"}}).rolling.pre_host == ()


@pytest.mark.parametrize(
    "rolling, message",
    [
        ({"pre_host": "lb drain {host}"}, "rolling.pre_host"),  # a shell line, not a list
        ({"pre_host": []}, "expected a command as a list of arguments"),
        ({"post_host": ["lb", "{hostname}"]}, "names {hostname}, which a hook is not given"),
        ({"pre_host": ["lb", 3]}, "rolling.pre_host[1]"),
        ({"hook_timeout": 0}, "rolling.hook_timeout"),
        ({"pre_hosts": ["lb"]}, "pre_host"),
    ],
)
def test_bad_rolling_hooks_are_refused_naming_the_key(rolling, message: str) -> None:
    with pytest.raises(DeploymentError) as e:
        parse_deployment({"hosts": ["a"], "model": {"path": "/m"}, "rolling": rolling})
    assert message in str(e.value), str(e.value)


def test_a_pinned_engine_is_the_deployments_interpreter_and_version(tmp_path) -> None:
    f = tmp_path / "d.yml"
    f.write_text(BASE + "engine: {version: 0.18.0, python: /opt/v18/bin/python}\n")
    dep = load_deployment(f)
    assert (dep.python, dep.engine_version) == ("/opt/v18/bin/python", "0.18.0")
    f.write_text(BASE)
    assert load_deployment(f).engine_version is None
