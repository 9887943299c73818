"""The sections of a run's facts built from what the stages learn, and noted for the run."""

import json
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from opsbook.core.channel import OUTCOME_ENV
from opsbook.core.deployment import parse_deployment
from opsbook.core.facts_schema import read_notes
from opsbook.knowledge.logscan import Phase
from opsbook.remote.testing import FakeHost
from opsbook.steps import record_facts
from opsbook.steps.host_facts import HostFacts, OsInfo, PythonInfo
from opsbook.steps.shard_check import ShardRow
from opsbook.steps.smi_parse import Gpu, Topology

DEP = parse_deployment(
    {
        "model": {"path": "/models/m"},
        "server": {
            "port": 8000,
            "args": {
                "api-key": "sk-verysecretvalue",
                "max-model-len": 32768,
                "enforce-eager": True,
            },
            "env": {"VLLM_API_KEY": "sk-othersecret", "NCCL_P2P_LEVEL": "PHB"},
        },
        "hosts": [{"address": "a", "user": "ops"}],
    }
)


def facts() -> HostFacts:
    return HostFacts(
        host="ops@a",
        gpus=[Gpu(1, "B200", "10.0"), Gpu(0, "H200", "9.0")],
        processes=[],
        topology=Topology(devices=["GPU0", "GPU1"], links={"GPU0": {"GPU1": "NV18"}}),
        driver="575.57.08",
        cuda="12.9",
        os=OsInfo(kernel="6.8.0-60-generic"),
        python=PythonInfo("python3", "/venv/bin/python", "3.11.9 (main, ...)"),
        vllm_version="0.15.1",
        disk_free_bytes=None,
        shm_total=None,
        shm_free=None,
        listening=[],
        servers=[],
        cpu_count=64,
    )


def test_the_fingerprint_and_engine_come_from_preflights_facts() -> None:
    fp = record_facts.fingerprint_section(facts())
    assert fp.gpus == ["H200", "B200"]  # in index order
    assert (fp.driver, fp.cuda, fp.kernel, fp.cpu) == (
        "575.57.08",
        "12.9",
        "6.8.0-60-generic",
        "64",
    )
    assert fp.topology_digest and len(fp.topology_digest) == 16
    engine = record_facts.engine_section(facts())
    assert (engine.vllm, engine.interpreter, engine.python) == (
        "0.15.1",
        "/venv/bin/python",
        "3.11.9",
    )


def test_the_shard_manifest_digest_follows_names_and_sizes() -> None:
    def check(*rows: tuple[str, int]) -> Any:
        return SimpleNamespace(shards=[ShardRow(f, "ok", s, s, 8, 1, None) for f, s in rows])

    one = record_facts.model_section(DEP, check(("a", 1), ("b", 2)))
    assert one.shards == 2 and one.path == "/models/m"
    assert one == record_facts.model_section(DEP, check(("b", 2), ("a", 1)))
    assert (
        one.manifest_digest
        != record_facts.model_section(DEP, check(("a", 1), ("b", 3))).manifest_digest
    )


def test_the_launch_keeps_flags_with_secrets_masked_and_env_names_only() -> None:
    launch = record_facts.launch_section(DEP, "ab12")
    assert launch.flags == {"api-key": "***", "max-model-len": "32768", "enforce-eager": ""}
    assert launch.env_names == ["NCCL_P2P_LEVEL", "VLLM_API_KEY"]
    assert "sk-" not in launch.model_dump_json()
    assert launch.script_digest == "ab12"


def test_startup_figures_come_from_the_logs_phases() -> None:
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    phases = [
        Phase("args", 1, t0),
        Phase("weights", 5, t0 + timedelta(seconds=10)),
        Phase("compile", 9, t0 + timedelta(seconds=210)),
        Phase("kv-cache", 12, t0 + timedelta(seconds=260.5)),
        Phase("ready", 20, t0 + timedelta(seconds=300)),
    ]
    diagnosis = SimpleNamespace(state="ready", phases=phases)
    got = record_facts.startup_section(diagnosis)  # type: ignore[arg-type]
    assert (got.state, got.load_s, got.compile_s, got.ready_s) == ("ready", 200.0, 50.5, 300.0)
    assert record_facts.startup_section(None).ready_s is None


def test_a_launch_notes_what_it_started_and_what_the_python_answers(
    tmp_path: Path, monkeypatch
) -> None:
    outcome = tmp_path / "04_launch.results.jsonl"
    answer = {
        "versions": {"vllm": "0.15.1", "torch": "2.9.1", "ray": None},
        "script_sha256": "ab",
        "engine_lines": [
            "INFO ... kv_cache_dtype=fp8, device_config=cuda",
            "INFO 11-28 15:28:09 [kv_cache_utils.py:1229] GPU KV cache size: 868,080 tokens",
        ],
        "configs": {"config.json": "{}"},
        "freeze_digest": "0123456789abcdef",
        "cmdline": "BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt quiet",
        "revision": None,
        "revision_source": None,
    }
    host = FakeHost("a", commands={"-c": json.dumps(answer)})
    monkeypatch.delenv(OUTCOME_ENV, raising=False)
    record_facts.note_launch(host, DEP, "ab", None)
    assert host.calls == []  # outside a run: not one command
    monkeypatch.setenv(OUTCOME_ENV, str(outcome))
    record_facts.note_launch(host, DEP, "ab", None)
    noted = read_notes([tmp_path / "04_launch.facts.jsonl"])[host.name]
    assert noted["engine"]["torch"] == "2.9.1" and noted["engine"]["kv_cache_dtype"] == "fp8_e4m3"
    assert set(noted["model"]["configs"]) == {"config.json"}
    assert noted["launch"]["script_digest"] == "ab"
    assert noted["startup"]["kv_tokens"] == 868080
    # In the same command: the IOMMU/ACS flags, the pip freeze digest, the revision or why not.
    assert noted["fingerprint"] == {"iommu": "intel_iommu=on iommu=pt", "acs": "not set"}
    assert noted["engine"]["pip_freeze_digest"] == "0123456789abcdef"
    assert noted["model"]["revision_source"] == record_facts.NO_REVISION
    assert len(host.calls) == 1


def test_the_kernels_iommu_and_acs_words_are_read_before_the_init_arguments() -> None:
    line = "ro amd_iommu=off iommu.passthrough=1 pcie_acs_override=downstream,multifunction -- x"
    assert record_facts.kernel_flags(line) == (
        "amd_iommu=off iommu.passthrough=1",
        "pcie_acs_override=downstream,multifunction",
    )
    assert record_facts.kernel_flags("ro quiet -- --iommu=on") == ("not set", "not set")
    assert record_facts.kernel_flags(None) == (None, None)


def test_a_launch_notes_the_answer_its_status_probe_brought_without_a_command(
    tmp_path: Path, monkeypatch
) -> None:
    answer = {
        "versions": {"vllm": "0.15.1", "torch": "2.9.1", "ray": None},
        "script_sha256": "ab",
        "engine_lines": ["INFO ... GPU KV cache size: 868,080 tokens"],
        "configs": {"config.json": "{}", "hf_quant_config.json": "{}"},
    }
    host = FakeHost("a")
    monkeypatch.delenv(OUTCOME_ENV, raising=False)
    assert record_facts.launch_side_command(DEP) == []  # outside a run: nothing to ask
    monkeypatch.setenv(OUTCOME_ENV, str(tmp_path / "04_launch.results.jsonl"))
    assert "-c" in record_facts.launch_side_command(DEP)
    record_facts.note_launch(host, DEP, "ab", None, (0, f"a banner\n{json.dumps(answer)}\n"))
    assert host.calls == []
    noted = read_notes([tmp_path / "04_launch.facts.jsonl"])[host.name]
    assert noted["engine"]["torch"] == "2.9.1" and noted["startup"]["kv_tokens"] == 868080
    assert set(noted["model"]["configs"]) == {"config.json", "hf_quant_config.json"}
    # A python that did not answer leaves the engine unknown, as a command of its own would.
    record_facts.note_launch(host, DEP, "ab", None, (1, "No module named importlib\n"))
    assert host.calls == []
