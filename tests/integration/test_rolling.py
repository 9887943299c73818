"""Rolling restarts over a rehearsal fleet of four hosts (real sshd, simulated vLLM): a batch
that fails within --max-fail-percentage does not stop the roll, the host whose new launch
crashed is rolled back to its previous script, the hooks run around each host, the hosts
staying up are checked before a batch is taken down, and --limit picks hosts.

The fleet uses 127.0.11.0/24, an address range no other test uses.
"""

import hashlib
import json
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from opsbook import stages
from opsbook.core.deployment import load_deployment
from opsbook.core.results import State
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal.fleet import Fleet
from opsbook.runner import run

pytestmark = pytest.mark.integration

# A hook that notes what it was asked, one line per call, in the file it is given.
HOOK = """\
import sys
with open(sys.argv[1], "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
"""


def name(box) -> str:
    return f"{box.user}@{box.address}:{box.port}"


def script_sha(box) -> str:
    return hashlib.sha256((box.home / "opsbook" / "launch.sh").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Four hosts, all serving the same launch script."""
    folder = Path(tempfile.mkdtemp(prefix="opsbook-rolling-", dir="/tmp"))
    folder.chmod(0o755)  # the sandbox keeps an existing folder's mode
    fleet = fleets.up(folder, hosts=4, address="127.0.11.1")
    try:
        first = run.run_deploy(fleet.deployment_path, tmp_path_factory.mktemp("runs"))
        assert first.exit_code == run.EXIT_OK, first.message
        yield fleet
    finally:
        fleets.down(folder)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


class Poller:
    """GETs each host's /health over loopback, over and over, on a thread of its own: the
    fewest hosts that answered 200 in one sweep."""

    def __init__(self, ports: list[int]):
        self.ports = ports
        self.fewest = len(ports)
        self.sweeps = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Poller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._done.is_set():
            serving = sum(self._serves(port) for port in self.ports)
            self.fewest = min(self.fewest, serving)
            self.sweeps += 1
            self._done.wait(0.1)

    @staticmethod
    def _serves(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False


def test_a_crash_within_the_threshold_rolls_on_and_the_host_is_rolled_back(
    fleet: Fleet, tmp_path: Path
) -> None:
    hosts = [name(box) for box in fleet.hosts]
    before = {name(box): script_sha(box) for box in fleet.hosts}
    crashing = fleet.hosts[2]
    doc = yaml.safe_load(fleet.deployment_path.read_text())
    doc["server"]["env"]["OPSBOOK_RELEASE"] = "2"  # a new launch script for every host
    # Only host 3's new script crashes its server (the simulator's fault, by its env).
    doc["hosts"][2]["vars"].setdefault("server", {})["env"] = {"OPSBOOK_SIM_FAULT": "oom"}
    (tmp_path / "hook.py").write_text(HOOK)
    calls = tmp_path / "calls.txt"
    hook = [sys.executable, "./hook.py", str(calls)]
    doc["rolling"] = {"pre_host": [*hook, "drain", "{host}"], "post_host": [*hook, "add", "{host}"]}
    upgrade = tmp_path / "upgrade.yml"
    upgrade.write_text(yaml.safe_dump(doc))
    seen = []
    with Poller([box.server_port for box in fleet.hosts]) as poller:
        record = run.run_deploy(
            upgrade,
            tmp_path / "runs",
            serial=1,
            max_fail_percentage=30,
            on_failure="rollback",
            on_result=seen.append,
        )
    assert record.exit_code == run.EXIT_PROBLEM, record.message
    assert poller.sweeps > 20
    assert poller.fewest >= 3, f"only {poller.fewest} of 4 hosts served at one moment"
    state = {(r.host, r.stage): r for r in record.results}
    # The roll went on past the crash: hosts 1, 2 and 4 run the new script.
    for box in (fleet.hosts[0], fleet.hosts[1], fleet.hosts[3]):
        assert state[(name(box), "launch")].state is State.CHANGED
        assert script_sha(box) != before[name(box)]
    failed = state[(name(crashing), "launch")]
    assert failed.state is State.FAILED and failed.failure_id == "oom"
    rolled = state[(name(crashing), "rollback")]
    assert rolled.state is State.CHANGED, rolled.message
    assert rolled.message.startswith("rolled back to the previous launch script")
    # Back on its previous script, and serving from it.
    assert script_sha(crashing) == before[name(crashing)]
    assert "OPSBOOK_SIM_FAULT" not in (crashing.home / "opsbook" / "launch.sh").read_text()
    assert state[(name(crashing), "diagnose")].message.startswith("ready")
    summary = json.loads((record.folder / "summary.json").read_text())
    assert summary["script_versions"][name(crashing)] == before[name(crashing)]
    assert summary["parameters"]["on_failure"] == "rollback"
    assert summary["parameters"]["max_fail_percentage"] == "30"
    assert summary["stages"][:2] == ["pre-host", "preflight"]
    assert "rollback" in summary["stages"] and "post-host" in summary["stages"]
    assert summary["recap"][name(crashing)]["failed"] == 1
    # The hooks ran around each host in turn; the rolled-back host was added back too.
    expected = [f"{verb} {host}" for host in hosts for verb in ("drain", "add")]
    assert calls.read_text().splitlines() == expected
    order = [(r.host, r.stage) for r in seen]
    assert order.index((hosts[2], "rollback")) < order.index((hosts[3], "pre-host"))
    assert order.index((hosts[0], "post-host")) < order.index((hosts[1], "pre-host"))


def test_the_cli_recap_says_rolled_back_and_limit_picks_hosts(fleet: Fleet, tmp_path: Path) -> None:
    doc = yaml.safe_load(fleet.deployment_path.read_text())
    doc["hosts"][1]["vars"].setdefault("server", {})["env"] = {"OPSBOOK_SIM_FAULT": "oom"}
    crashing = tmp_path / "crashing.yml"
    crashing.write_text(yaml.safe_dump(doc))
    target = name(fleet.hosts[1])
    deploy = subprocess.run(
        [sys.executable, "-m", "opsbook", "run", "deploy", "-f", str(crashing)]
        + ["--limit", fleet.hosts[1].address, "-p", "on_failure", "rollback"]
        + ["--runs-dir", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert deploy.returncode == 1, deploy.stdout + deploy.stderr
    recap = deploy.stdout.split("RECAP", 1)[1].splitlines()
    assert len([line for line in recap if "ok=" in line]) == 1  # the one host --limit picked
    assert any(line.startswith(target) and line.endswith("[rolled back]") for line in recap)
    check = subprocess.run(
        [sys.executable, "-m", "opsbook", "check", "-f", str(fleet.deployment_path)]
        + ["--limit", "[0],3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    checked = {line.split()[1] for line in check.stdout.splitlines() if line.startswith("diagnose")}
    assert checked == {name(fleet.hosts[0]), name(fleet.hosts[3])}
    unknown = subprocess.run(
        [sys.executable, "-m", "opsbook", "check", "-f", str(fleet.deployment_path)]
        + ["--limit", "gpu-99"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2
    assert "picks no host" in unknown.stderr and name(fleet.hosts[3]) in unknown.stderr


def test_a_batch_is_not_taken_down_while_a_host_staying_up_is_not_healthy(
    fleet: Fleet, tmp_path: Path
) -> None:
    dep = load_deployment(fleet.deployment_path)
    down = name(fleet.hosts[1])
    before = script_sha(fleet.hosts[0])
    stages.run_stage(stages.STOP, dep, hosts=[down], on_result=None)
    try:
        doc = yaml.safe_load(fleet.deployment_path.read_text())
        doc["server"]["env"]["OPSBOOK_RELEASE"] = "3"
        upgrade = tmp_path / "upgrade.yml"
        upgrade.write_text(yaml.safe_dump(doc))
        record = run.run_deploy(upgrade, tmp_path / "runs", serial=1, max_fail_percentage=50)
    finally:
        stages.run_stage(stages.get("launch"), dep, hosts=[down], on_result=None, apply=True)
    assert record.exit_code == run.EXIT_PROBLEM, record.message
    assert "before batch 1 of 4, not every host staying up was healthy" in record.message
    state = {(r.host, r.stage): r for r in record.results}
    assert state[(down, "health-check")].state is State.FAILED
    first = name(fleet.hosts[0])
    assert state[(first, "launch")].state is State.SKIPPED
    assert script_sha(fleet.hosts[0]) == before  # batch 1 was not touched
    assert not (record.folder / "batch-01").exists()
