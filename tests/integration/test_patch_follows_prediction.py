"""The config patch follows the prediction, end to end: `opsbook sandbox up` with a GPU type and
a vLLM release, then `opsbook run deploy -p apply True`, over the real sshd rehearsal host.

- vLLM 0.33.0 on compute capability 12.0 and vLLM 0.15.1 on 8 x B200 (10.0) serve the
  checkpoint's FP8 KV cache: the deploy leaves config.json and hf_quant_config.json
  byte-identical, makes no backup, and the server starts with an FP8 KV cache.
- vLLM 0.15.1 on compute capability 12.0 (the incident) cannot: the deploy patches both files
  (with backups) and the server starts with a 16-bit KV cache.
- The 0.33.0 case also serves with ``disable-log-requests: true`` in ``server.args``: 0.33.0
  accepts the flag again (the inverse of --enable-log-requests, vllm/utils/argparse_utils.py
  EnableDisableAction), so the compat check must not stop the deploy (issue 31, item 6).

Each case has a rehearsal host of its own on this module's loopback addresses.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from opsbook.core import channel
from opsbook.core.deployment import load_deployment
from opsbook.core.results import HostResult, State
from opsbook.remote.hosts import Host
from opsbook.steps import server
from opsbook.steps.patch import BACKUP_SUFFIX, PATCHABLE_FILES
from tests.integration.conftest import opsbook

pytestmark = pytest.mark.integration

MODEL = Path("models") / "Kimi-K2.5-NVFP4"


@dataclass(frozen=True)
class Case:
    gpus: str
    vllm: str
    address: str
    patched: bool
    kv_line: str
    args: dict[str, object] = field(default_factory=dict)  # added to server.args


CASES = {
    "0.33.0-on-sm120": Case(
        "rtx-pro-6000",
        "0.33.0",
        "127.0.0.30",
        False,
        "Using fp8_e4m3 data type to store kv cache",
        {"disable-log-requests": True},
    ),
    "0.15.1-on-b200": Case(
        "b200", "0.15.1", "127.0.0.31", False, "Using fp8 data type to store kv cache"
    ),
    "0.15.1-on-sm120": Case("rtx-pro-6000", "0.15.1", "127.0.0.32", True, "kv_cache_dtype=auto"),
}


@dataclass(frozen=True)
class Deployed:
    case: Case
    folder: Path
    before: dict[str, str]
    code: int
    output: str
    summary: dict[str, object]
    server_log: str
    launch_script: str


def digests(model: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((model / name).read_bytes()).hexdigest() for name in PATCHABLE_FILES
    }


@pytest.fixture(scope="module", params=list(CASES))
def deployed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    case = CASES[request.param]
    folder = Path(tempfile.mkdtemp(prefix="opsbook-patchfix-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    up = opsbook(
        "sandbox", "up", "--dir", str(folder), "--address", case.address,
        "--gpus", case.gpus, "--vllm-version", case.vllm, timeout=300,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    deployment = folder / "deployment.yml"
    try:
        add_server_args(deployment, case.args)
        before = digests(folder / MODEL)
        runs = tmp_path_factory.mktemp("runs")
        run = opsbook(
            "run", "deploy", "-f", str(deployment), "-p", "apply", "True",
            "--runs-dir", str(runs), "--stage-timeout", "300", timeout=1500,
        )  # fmt: skip
        run_folder = next(runs.iterdir())
        summary = json.loads((run_folder / "summary.json").read_text())
        dep = load_deployment(deployment)
        with Host.from_deployment(dep) as host:
            paths = server.resolve_paths(host, dep)
            server_log = host.read_bytes(paths.log).decode(errors="replace")
            script = host.read_bytes(paths.script).decode(errors="replace")
            yield Deployed(
                case, folder, before, run.returncode, run.stdout, summary, server_log, script
            )
            server.stop_server(host, paths)
    finally:
        opsbook("sandbox", "down", "--dir", str(folder), timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def add_server_args(deployment: Path, args: dict[str, object]) -> None:
    if not args:
        return
    data = yaml.safe_load(deployment.read_text())
    data["server"]["args"].update(args)
    deployment.write_text(yaml.safe_dump(data, sort_keys=False))


def verdicts(deployed: Deployed) -> dict[str, HostResult]:
    """The one host's result of each stage, read back typed from ``summary.json``."""
    found = deployed.summary["results"]
    assert isinstance(found, list)
    results = [channel.decode(json.dumps(entry)) for entry in found]
    return {r.stage: r for r in results}


def test_deploy_reaches_ready(deployed: Deployed) -> None:
    assert deployed.code == 0, deployed.output
    diagnose = verdicts(deployed)["diagnose"]
    assert diagnose.state is State.OK and diagnose.message.startswith("ready"), diagnose
    assert "Application startup complete." in deployed.server_log
    assert f"Initializing a V1 LLM engine (v{deployed.case.vllm})" in deployed.server_log


def test_a_flag_the_release_accepts_is_passed_and_not_stopped(deployed: Deployed) -> None:
    """`--disable-log-requests` on 0.33.0: the compat check lets it through, the server is
    launched with it and reaches ready (test_deploy_reaches_ready)."""
    if not deployed.case.args:
        pytest.skip("this case adds no server argument")
    assert "disable-log-requests" not in verdicts(deployed)["config-patch"].message
    assert "unrecognized arguments" not in deployed.server_log
    assert "--disable-log-requests" in deployed.launch_script, deployed.launch_script


def test_the_patch_follows_the_prediction(deployed: Deployed) -> None:
    model = deployed.folder / MODEL
    after = digests(model)
    backups = {name: (model / (name + BACKUP_SUFFIX)).exists() for name in PATCHABLE_FILES}
    message = verdicts(deployed)["config-patch"].message
    if deployed.case.patched:
        assert all(after[n] != deployed.before[n] for n in PATCHABLE_FILES)
        assert all(backups.values())
        assert "FP8 KV cache with MLA on compute capability 12.x" in message
        config = json.loads((model / "config.json").read_text())
        assert "kv_cache_scheme" not in config["quantization_config"]
    else:
        assert after == deployed.before
        assert not any(backups.values())
        assert "nothing to change: no failure is predicted with the fp8_e4m3 KV cache" in message
        assert "tokens per GPU" in message


def test_the_server_keeps_the_kv_cache_the_prediction_allows(deployed: Deployed) -> None:
    log = deployed.server_log
    assert deployed.case.kv_line in log
    fp8 = not deployed.case.patched
    assert ("kv_cache_dtype=fp8_e4m3" in log) == fp8
    assert "GPU KV cache size:" in log


def test_an_up_host_switches_gpus_and_release_in_place() -> None:
    folder = Path(tempfile.mkdtemp(prefix="opsbook-patchfix-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    try:
        first = opsbook("sandbox", "up", "--dir", str(folder), "--address", "127.0.0.33",
                        timeout=300)  # fmt: skip
        assert first.returncode == 0, first.stderr
        again = opsbook(
            "sandbox", "up", "--dir", str(folder), "--address", "127.0.0.33",
            "--gpus", "b200", "--vllm-version", "0.33.0", timeout=300,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        assert "simulated: 8 x b200 GPUs, vLLM 0.33.0" in again.stdout
        state = json.loads((folder / "state.json").read_text())
        assert (state["gpu_profile"], state["vllm_version"]) == ("b200", "0.33.0")
        dep = load_deployment(folder / "deployment.yml")
        with Host.from_deployment(dep) as host:
            smi = host.run("nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader")
            assert smi.stdout.splitlines() == ["NVIDIA B200, 10.0"] * 8
            version = host.run(
                f"{shlex.quote(dep.python)} -c 'import vllm; print(vllm.__version__)'"
            )
            assert version.stdout.strip() == "0.33.0"
    finally:
        opsbook("sandbox", "down", "--dir", str(folder), timeout=120)
        shutil.rmtree(folder, ignore_errors=True)
