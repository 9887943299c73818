"""Records that remember, on rehearsal hosts: two real deploys (vLLM 0.15.1 and 0.33.0 on the
same simulated GPUs) each file ``facts.json``; ``records diff`` names the version, the config
02 patched and the KV-cache dtype; a deploy marked good is last good; a driver moved under the
host afterwards is named by 00_preflight as drift, and by ``opsbook diagnose`` since last good.

The hosts use 127.0.12.0/24, an address range of their own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.knowledge import capacity
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.rehearsal.sim import simgpu, vllm_install
from opsbook.remote.hosts import HostGroup
from opsbook.steps import capacity_facts, host_facts, plan
from tests.integration.conftest import opsbook, sandbox_folder

pytestmark = pytest.mark.integration

OLD_ADDRESS, NEW_ADDRESS = "127.0.12.1", "127.0.12.2"
MOVED_DRIVER = "600.10.01"


@pytest.fixture(scope="module")
def hosts() -> Iterator[tuple[Sandbox, Sandbox]]:
    """Two hosts of 8 RTX PRO 6000: one on vLLM 0.15.1, one on 0.33.0."""
    folder = sandbox_folder("records")
    boxes: list[Sandbox] = []
    try:
        boxes.append(sandboxes.up(folder / "old", address=OLD_ADDRESS, vllm_version="0.15.1"))
        boxes.append(sandboxes.up(folder / "new", address=NEW_ADDRESS, vllm_version="0.33.0"))
        for box in boxes:
            # Starts of 0.3 s instead of 3 (the phases and figures a record keeps are the same).
            settings = box.venv / vllm_install.SETTINGS_NAME
            doc = json.loads(settings.read_text())
            settings.write_text(json.dumps({**doc, "startup_seconds": 0.3}))
        yield boxes[0], boxes[1]
    finally:
        for box in boxes:
            sandboxes.down(box.dir)
        shutil.rmtree(folder, ignore_errors=True)


def run_folder(done: subprocess.CompletedProcess[str]) -> Path:
    line = next(x for x in done.stdout.splitlines() if x.startswith("run folder: "))
    return Path(line.split(": ", 1)[1])


def name(box: Sandbox) -> str:
    return f"{box.user}@{box.address}:{box.port}"


@pytest.fixture(scope="module")
def deploys(hosts, tmp_path_factory) -> tuple[Path, Path, Path]:
    """The runs folder, and the run folders of a deploy on each host (old first)."""
    runs = tmp_path_factory.mktemp("runs")
    # The two hosts are deployed at once: each run has its own folder and its host's lock.
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda box: opsbook(
            "run", "deploy", "-f", str(box.deployment_path), "-p", "apply", "True",
            "--runs-dir", str(runs),
        ), hosts))  # fmt: skip
    for one in done:
        assert one.returncode == 0, one.stdout + one.stderr
    return runs, run_folder(done[0]), run_folder(done[1])


def test_each_deploy_files_its_facts(hosts, deploys) -> None:
    _, old_run, _ = deploys
    facts = json.loads((old_run / "facts.json").read_text())
    assert facts["schema_version"] == 1
    host = facts["hosts"][name(hosts[0])]
    assert host["state"] == "ready"
    gpus = host["fingerprint"]["gpus"]
    assert len(gpus) == 8 and all("RTX PRO 6000" in gpu for gpu in gpus), gpus
    assert host["fingerprint"]["driver"] and host["fingerprint"]["kernel"]
    assert host["engine"]["vllm"] == "0.15.1"  # the simulated venv has no torch: unknown
    assert host["model"]["manifest_digest"] and host["model"]["shards"]
    assert host["launch"]["script_digest"] and "config.json" in host["model"]["configs"]
    assert host["startup"]["ready_s"] is not None and host["startup"]["kv_tokens"] > 0
    # Sealed with the rest of the record.
    assert (old_run / "facts.json").stat().st_mode & 0o777 == 0o400


def test_records_diff_names_the_version_the_patched_config_and_the_kv_dtype(deploys) -> None:
    runs, old_run, new_run = deploys
    done = opsbook("records", "diff", old_run.name, new_run.name, "--runs-dir", str(runs))
    assert done.returncode == 0, done.stderr
    said = done.stdout
    head, *_ = said.splitlines()
    assert "changed" in head, said
    lines = said.splitlines()
    [vllm] = [x for x in lines if " engine.vllm " in x]
    assert "0.15.1" in vllm and "0.33.0" in vllm, said
    [kv] = [x for x in lines if " engine.kv_cache_dtype " in x]
    assert "auto" in kv and "fp8_e4m3" in kv, said
    assert any(" model.configs.config.json " in x for x in lines), said
    # Facts the two hosts share are not listed.
    assert not any(" fingerprint.gpus " in x for x in lines), said


def test_a_deploy_marked_good_is_last_good_and_searchable(hosts, deploys) -> None:
    runs, old_run, _ = deploys
    assert "no last good" not in opsbook("records", "last-good", "--runs-dir", str(runs)).stdout
    marked = opsbook("records", "mark-good", old_run.name, "--runs-dir", str(runs))
    assert marked.returncode == 0, marked.stderr
    assert f"marked {old_run.name} good on {name(hosts[0])}" in marked.stdout
    # The mark lives beside the run folders; the sealed folder is unchanged.
    assert (runs / ".good-marks.jsonl").is_file()
    table = opsbook("records", "last-good", "--runs-dir", str(runs)).stdout
    assert old_run.name in table and "marked good" in table, table
    found = opsbook("records", "search", "--fact", "vllm=0.15.1", "--runs-dir", str(runs))
    assert old_run.name in found.stdout and "0.33.0" not in found.stdout, found.stdout
    listed = opsbook("records", "list", "--host", OLD_ADDRESS, "--runs-dir", str(runs)).stdout
    assert old_run.name in listed and NEW_ADDRESS not in listed, listed


def test_each_deploy_keeps_its_plan_beside_vllm_s_figures_and_the_next_plan_learns(
    hosts, deploys
) -> None:
    """02 notes the capacity plan, 04 what the simulated vLLM logged beside it with the error
    in %; planned from that record alone, the next plan on the host learns the overhead."""
    runs, old_run, _ = deploys
    old, _ = hosts
    facts = json.loads((old_run / "facts.json").read_text())
    kept = facts["hosts"][name(old)]["capacity"]
    low, high = kept["predicted_tokens"]
    assert kept["vllm"] == "0.15.1" and kept["utilization"] == 0.9  # 0.15.1's default
    assert kept["observed_tokens"] > 0 and kept["observed_kv_memory"] > 0, kept
    assert kept["tokens_error_pct"] is not None and kept["overhead"] > 0, kept
    error, gib = kept["tokens_error_pct"], kept["overhead"] / 2**30
    print(f"\n[records] plan {low:,}-{high:,} tokens, vLLM {kept['observed_tokens']:,}: {error:+}%")
    print(f"[records] overhead measured {gib:.2f} GiB")
    deployment = load_deployment(old.deployment_path)
    [entry] = capacity_facts.run_history(runs, deployment.source, name(old))
    group = HostGroup.from_deployment(deployment)
    try:
        [host] = group.hosts
        found = host_facts.gather_facts(host, deployment, host_facts.PATCH_FACTS)
        checkpoint = plan.read_host_checkpoint(host, deployment.model_path)
    finally:
        group.close()
    parallel = capacity.Parallel.from_args(deployment.serve_args)
    gpus = plan.gpus_of(found.gpus, parallel.gpus, checkpoint.cpu_amx, found.vllm_version)
    learned = plan.plan_capacity(
        checkpoint, deployment.serve_args, gpus, vllm_version="0.15.1", history=[entry]
    )
    assert learned.overhead_source.startswith("learned: median of 1"), learned.overhead_source
    assert learned.tokens[0] <= kept["observed_tokens"] <= learned.tokens[1], learned.tokens


@pytest.fixture(scope="module")
def drifted(hosts, deploys) -> subprocess.CompletedProcess[str]:
    """00_preflight on the 0.15.1 host, its deploy marked good, run with its simulated driver
    moved (put back afterwards)."""
    runs, old_run, _ = deploys
    old, _ = hosts
    marked = opsbook("records", "mark-good", old_run.name, "--runs-dir", str(runs))
    assert marked.returncode == 0, marked.stderr
    config = old.sim_dir / simgpu.CONFIG_FILE
    original = config.read_text()
    doc = json.loads(original)
    doc["driver_version"] = MOVED_DRIVER
    config.write_text(json.dumps(doc))
    try:
        return opsbook(
            "run", "00_preflight", "-f", str(old.deployment_path), "--runs-dir", str(runs)
        )
    finally:
        config.write_text(original)


def test_a_driver_moved_since_last_good_is_named_by_preflight(deploys, drifted) -> None:
    _, old_run, _ = deploys
    said = drifted.stdout + drifted.stderr
    assert drifted.returncode == 0, said  # a warning: the host can still be launched on
    assert "moved since last good: driver" in said, said
    summary = json.loads((run_folder(drifted) / "run.json").read_text())
    [result] = [r for r in summary["results"] if r["stage"] == "preflight"]
    [finding] = [f for f in result["findings"] if f["subject"] == "driver"]
    assert finding["severity"] == "warning"
    assert f"595.58.03 -> {MOVED_DRIVER}" in finding["message"]
    assert old_run.name in finding["source"] and "apt-mark hold" in finding["remedy"]
    # Nothing else moved: the engine, the kernel and the checkpoint (read again: the good run
    # knew its manifest) are as they were.
    unmoved = ("vLLM", "torch", "kernel", "CUDA", "GPUs", "model manifest")
    assert not [f for f in result["findings"] if f["subject"] in unmoved]
    assert "probe download" in (run_folder(drifted) / "journal.jsonl").read_text()


def test_diagnose_of_a_failed_log_says_what_changed_since_last_good(
    hosts, deploys, drifted
) -> None:
    runs, old_run, _ = deploys
    old, _ = hosts
    log = Path(__file__).parents[1] / "data" / "logs" / "fp8kv-mla-1.log"
    done = opsbook(
        "diagnose", "--log", str(log), "-f", str(old.deployment_path), "--runs-dir", str(runs)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    _, since = done.stdout.split("SINCE LAST GOOD\n", 1)
    # The newest run of the host is the preflight that found the driver moved.
    assert f"{name(old)}: since last good ({old_run.name}, marked good)" in since, since
    assert f"fingerprint.driver 595.58.03 -> {MOVED_DRIVER}" in since, since
