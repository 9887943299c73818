"""Tests for opsbook.steps.host_facts and the facts probe: parsers on real nvidia-smi output, the
probe run
locally (with and without a stand-in nvidia-smi on PATH), and the findings."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.deployment import Deployment, HostSpec
from opsbook.remote.probes import run_local
from opsbook.remote.testing import FakeHost, local_probe
from opsbook.steps.host_facts import (
    PATCH_FACTS,
    QUERY_GPU_FIELDS,
    START_FACTS,
    HostFacts,
    RunReadings,
    check_facts,
    facts_from_probe,
    gather_facts,
    gpu_table,
    parse_compute_apps,
    parse_cuda_version,
    parse_driver_version,
    parse_query_gpu,
    parse_topology,
    port_table,
    process_table,
    server_table,
    summary_table,
)
from tests.unit.conftest import spans, timed_stand_in

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
H200 = DATA / "h200"
RTX = DATA / "rtxpro6000"
NVIDIA_SMI_FALLBACKS = ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi")

RTX_UUIDS = re.findall(
    r"UUID: (GPU-[0-9a-f-]+)", (RTX / "nvidia-smi-L-rtxpro6000-8gpu.txt").read_text()
)
RTX_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
# The query the probe makes, answered for the 8-GPU box of the reference: names and UUIDs from
# its `nvidia-smi -L`, compute capability and memory from its CSV answers.
RTX_QUERY_GPU = "".join(
    f"{i}, {RTX_NAME}, 12.0, 97887, {88292 if i < 2 else 0}, {9595 if i < 2 else 97887}, "
    f"595.58.03, {uuid}\n"
    for i, uuid in enumerate(RTX_UUIDS)
)
RTX_COMPUTE_APPS = (
    f"2292996, VLLM::EngineCore, 88282, {RTX_UUIDS[0]}\n"
    f"2292840, VLLM::EngineCore, 88282, {RTX_UUIDS[1]}\n"
)
# Same layout as the real topo -m (tabs, ANSI underline on the header), for an NVLinked box;
# neither reference machine has NVLink between GPUs.
NVLINK_TOPO = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tPXB\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tPXB\t0-47\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tSYS\t48-95\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tSYS\t48-95\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \t\t\t\t\n"
    "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def command_output(path: Path) -> tuple[str, tuple[str, ...]]:
    """A captured CSV answer without the shell line that ran it, and the fields it asked for."""
    fields = QUERY_GPU_FIELDS
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        asked = re.search(r"--query-gpu=(\S+)", line)
        if asked:
            fields = tuple(asked.group(1).split(","))
        else:
            kept.append(line)
    return "".join(kept), fields


# --- parsers on the real reference files -------------------------------------------------


def test_query_gpu_h200_with_header_units_and_extra_columns() -> None:
    [gpu] = parse_query_gpu((H200 / "query-gpu.csv").read_text())
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.compute_cap == "9.0"
    assert (gpu.memory_total_mib, gpu.memory_used_mib, gpu.memory_free_mib) == (143771, 0, 143156)
    assert gpu.driver_version == "580.159.04"
    assert gpu.uuid == "GPU-d02cf7f0-62cd-35e9-8294-3c350cfb105c"


def test_query_gpu_h200_noheader_reads_a_prefix_of_the_fields() -> None:
    [gpu] = parse_query_gpu((H200 / "query-gpu-noheader.csv").read_text())
    assert (gpu.index, gpu.name, gpu.compute_cap, gpu.memory_total_mib) == (
        0,
        "NVIDIA H200",
        "9.0",
        143771,
    )
    assert gpu.uuid is None and gpu.memory_used_mib is None


def test_query_gpu_rtx_workstation_header_without_index() -> None:
    [gpu] = parse_query_gpu((RTX / "query-gpu-rtxpro6000-1.csv").read_text())
    assert gpu.index == 0
    assert gpu.name == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (97887, 96401)
    assert gpu.compute_cap == "12.0"
    assert gpu.driver_version == "596.59"


def test_query_gpu_rtx_noheader_with_its_own_fields() -> None:
    text, fields = command_output(RTX / "query-gpu-rtxpro6000-2.txt")
    assert fields == ("name", "driver_version", "compute_cap")
    [gpu] = parse_query_gpu(text, fields)
    assert (gpu.name, gpu.driver_version, gpu.compute_cap) == (RTX_NAME, "580.126.09", "12.0")


def test_query_gpu_rtx_four_gpus_memory_with_units() -> None:
    text, fields = command_output(RTX / "query-gpu-rtxpro6000-3.txt")
    gpus = parse_query_gpu(text, fields)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert {(g.name, g.memory_total_mib, g.memory_free_mib) for g in gpus} == {
        (RTX_NAME, 97887, 97250)
    }


def test_query_gpu_rtx_header_with_unqueried_column() -> None:
    text, _ = command_output(RTX / "query-gpu-rtxpro6000-4.txt")
    [gpu] = parse_query_gpu(text)
    assert (gpu.index, gpu.name, gpu.compute_cap) == (0, RTX_NAME, None)


def test_query_gpu_tolerates_not_available_values() -> None:
    [gpu] = parse_query_gpu(
        "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0, 97887, "
        "[N/A], [Not Supported], 610.43.02, GPU-1\n"
    )
    assert gpu.memory_used_mib is None and gpu.memory_free_mib is None
    assert gpu.driver_version == "610.43.02"


def test_query_gpu_eight_rtx_pro_6000() -> None:
    gpus = parse_query_gpu(RTX_QUERY_GPU)
    assert len(gpus) == 8
    assert {(g.compute_cap, g.memory_total_mib) for g in gpus} == {("12.0", 97887)}
    assert [g.uuid for g in gpus] == RTX_UUIDS


def test_compute_apps_header_only_is_empty() -> None:
    assert parse_compute_apps((H200 / "apps.csv").read_text()) == []


def test_compute_apps_rows_units_and_commas() -> None:
    text = (
        "pid, process_name, used_gpu_memory [MiB]\n"
        "3055949, sglang::scheduler, 84260 MiB\n"
        "1, python3, [N/A]\n"
        "42, /opt/a,b/python, 10 MiB\n"
    )
    apps = parse_compute_apps(text, ("pid", "process_name", "used_memory"))
    assert [(a.pid, a.process_name, a.used_memory_mib) for a in apps] == [
        (3055949, "sglang::scheduler", 84260),
        (1, "python3", None),
        (42, "/opt/a, b/python", 10),
    ]


def test_compute_apps_noheader_and_no_processes_message() -> None:
    apps = parse_compute_apps(RTX_COMPUTE_APPS)
    assert [(a.pid, a.used_memory_mib, a.gpu_uuid) for a in apps] == [
        (2292996, 88282, RTX_UUIDS[0]),
        (2292840, 88282, RTX_UUIDS[1]),
    ]
    assert parse_compute_apps("No running processes found\n") == []


def test_topology_rtx_eight_gpus_pcie_only() -> None:
    topo = parse_topology((RTX / "topo-rtxpro6000-1.txt").read_text())
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.link("GPU0", "GPU1") == "PIX"
    assert topo.link("GPU0", "GPU2") == "NODE"
    assert topo.link("GPU0", "GPU4") == "SYS"
    assert topo.link("GPU3", "GPU3") == "X"
    assert topo.cpu_affinity["GPU5"] == "64-127,192-238"
    assert topo.numa_affinity["GPU5"] == "1"
    assert topo.gpu_link_kinds == ["NODE", "PIX", "SYS"]
    assert topo.interconnect == "PCIe-only"
    assert len(topo.table()) == 8


def test_topology_h200_strips_ansi_and_has_one_gpu() -> None:
    text = (H200 / "topo.txt").read_text()
    assert "\x1b[4m" in text
    topo = parse_topology(text)
    assert topo.devices == ["GPU0"]
    assert topo.cpu_affinity == {"GPU0": "0-15"}
    assert topo.interconnect == "single GPU"


def test_topology_nvlink_and_nics() -> None:
    topo = parse_topology(NVLINK_TOPO)
    assert topo.devices == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0"]
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.link("GPU2", "NIC0") == "SYS"
    assert topo.gpu_link_kinds == ["NV18"]
    assert topo.interconnect == "NVLink"


def test_topology_of_an_error_message_is_empty() -> None:
    topo = parse_topology("Failed to initialize NVML: Driver/library version mismatch\n")
    assert topo.devices == [] and topo.interconnect == "unknown"


@pytest.mark.parametrize(
    ("path", "cuda", "driver"),
    [
        (H200 / "nvidia-smi.txt", "13.0", "580.159.04"),
        (RTX / "nvidia-smi-rtxpro6000-1gpu-server.txt", "12.8", "570.172.08"),
        (RTX / "nvidia-smi-rtxpro6000-1gpu-workstation.txt", "13.0", "580.95.05"),
        (RTX / "nvidia-smi-rtxpro6000-2gpu-maxq-300w.txt", "13.2", "595.71.05"),
        (RTX / "nvidia-smi-rtxpro6000-4gpu-server.txt", "13.0", "580.126.20"),
        (RTX / "nvidia-smi-rtxpro6000-6gpu-mixed.txt", "13.1", "590.48.01"),
        (RTX / "nvidia-smi-rtxpro6000-8gpu-doc-illustrative.txt", "13.0", "580.65.06"),
        (RTX / "nvidia-smi-rtxpro6000-mig-pod-610.txt", "13.3", "610.43.02"),
    ],
)
def test_cuda_and_driver_from_every_table(path: Path, cuda: str, driver: str) -> None:
    text = path.read_text()
    assert parse_cuda_version(text) == cuda
    assert parse_driver_version(text) == driver


def test_cuda_version_absent() -> None:
    assert parse_cuda_version("NVIDIA-SMI has failed because it couldn't communicate") is None


# --- the probe, run locally ---------------------------------------------------------------


def fake_nvidia_smi(folder: Path, query_gpu: str, apps: str, topo: str, table: str) -> Path:
    """A stand-in nvidia-smi that answers the probe's four commands with the given texts."""
    answers = folder / "answers"
    answers.mkdir()
    for name, text in (("query", query_gpu), ("apps", apps), ("topo", topo), ("table", table)):
        (answers / name).write_text(text)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f"cd '{answers}'\n"
        'case "$1" in\n'
        "  --query-gpu=*) cat query ;;\n"
        "  --query-compute-apps=*) cat apps ;;\n"
        "  topo) cat topo ;;\n"
        '  "") cat table ;;\n'
        '  *) echo "unknown option $1" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return folder


def probe_env(path_first: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{path_first}:/usr/bin:/bin" if path_first else "/usr/bin:/bin"
    env.update(extra)
    return env


def probe(tmp_path: Path, env: dict[str, str], **args: Any) -> dict[str, Any]:
    full = {"python": "/usr/bin/python3", "model_path": str(tmp_path / "model"), "ports": [8000]}
    full.update(args)
    answer = run_local("facts", full, env=env)
    assert isinstance(answer, dict)
    return answer


def test_probe_without_nvidia_smi_gives_a_finding(tmp_path: Path) -> None:
    if any(os.path.exists(p) for p in NVIDIA_SMI_FALLBACKS):
        pytest.skip("this machine has an nvidia-smi")
    answer = probe(tmp_path, probe_env())
    facts = facts_from_probe(answer, host="local")
    assert facts.nvidia_smi_path is None and facts.gpus == []
    [finding] = [f for f in facts.findings() if f.subject == "nvidia-smi"]
    assert finding.severity == "error"
    assert "nvidia-smi not found" in finding.message
    assert "install the NVIDIA driver" in finding.remedy
    result = check_facts(facts)
    assert not result.ok and "nvidia-smi not found" in result.message


def test_probe_reports_the_machine(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    facts = facts_from_probe(probe(tmp_path, probe_env()), host="local")
    assert facts.os.kernel == os.uname().release
    assert facts.cpu_count and facts.cpu_count >= 1
    assert facts.memory_total and facts.memory_total > 0
    assert facts.model_path_exists and facts.disk_checked_path == str(tmp_path / "model")
    assert facts.disk_free_bytes is not None and facts.disk_free_bytes > 0
    assert facts.shm_total is not None and facts.shm_free is not None
    assert facts.python.found and facts.python.executable == "/usr/bin/python3"
    assert facts.python.version and facts.python.version.startswith("3.")


def test_probe_disk_of_a_missing_model_path_is_its_nearest_parent(tmp_path: Path) -> None:
    answer = probe(tmp_path, probe_env(), model_path=str(tmp_path / "a" / "b" / "model"))
    facts = facts_from_probe(answer)
    assert not facts.model_path_exists
    assert facts.disk_checked_path == str(tmp_path)
    assert any(f.subject == "model path" and f.severity == "info" for f in facts.findings())


def test_probe_with_fake_nvidia_smi_h200(tmp_path: Path) -> None:
    bin_dir = fake_nvidia_smi(
        tmp_path,
        (H200 / "query-gpu.csv").read_text(),
        (H200 / "apps.csv").read_text(),
        (H200 / "topo.txt").read_text(),
        (H200 / "nvidia-smi.txt").read_text(),
    )
    facts = facts_from_probe(probe(tmp_path, probe_env(bin_dir)), host="h200")
    assert facts.nvidia_smi_path == str(bin_dir / "nvidia-smi")
    assert [(g.name, g.compute_cap, g.memory_total_mib) for g in facts.gpus] == [
        ("NVIDIA H200", "9.0", 143771)
    ]
    assert facts.processes == []
    assert (facts.driver, facts.cuda) == ("580.159.04", "13.0")
    assert facts.topology.interconnect == "single GPU"
    assert not [f for f in facts.findings() if f.subject.startswith(("GPU", "nvidia-smi"))]


def test_probe_with_fake_nvidia_smi_eight_rtx_pro_6000(tmp_path: Path) -> None:
    bin_dir = fake_nvidia_smi(
        tmp_path,
        RTX_QUERY_GPU,
        RTX_COMPUTE_APPS,
        (RTX / "topo-rtxpro6000-1.txt").read_text(),
        (RTX / "nvidia-smi-rtxpro6000-6gpu-mixed.txt").read_text(),
    )
    facts = facts_from_probe(probe(tmp_path, probe_env(bin_dir)), host="rtx")
    assert len(facts.gpus) == 8
    assert {(g.compute_cap, g.memory_total_mib) for g in facts.gpus} == {("12.0", 97887)}
    assert facts.driver == "595.58.03" and facts.cuda == "13.1"
    assert facts.topology.interconnect == "PCIe-only"
    assert [(p.pid, p.gpu_index) for p in facts.processes] == [(2292996, 0), (2292840, 1)]
    held = [f for f in facts.findings() if f.subject in ("GPU 0", "GPU 1")]
    assert [f.severity for f in held] == ["warning", "warning"]
    assert "88282 MiB held by pid 2292996 (VLLM::EngineCore)" in held[0].message
    table = gpu_table(facts)
    assert len(table) == 8 and "2292996 VLLM::EngineCore (88282 MiB)" in table.rows[0][-1]
    assert len(process_table(facts)) == 2
    summary = dict(summary_table(facts).rows)
    assert summary["gpus"] == f"8 × {RTX_NAME} (compute capability 12.0, 97887 MiB)"
    assert summary["interconnect"] == "PCIe-only (NODE, PIX, SYS)"


def test_probe_runs_nvidia_smi_and_the_interpreter_side_by_side(tmp_path: Path) -> None:
    # Each nvidia-smi start costs a GPU host a fraction of a second: the two live queries and
    # the interpreter's run wait together, so every run of one starts before any has ended.
    bins = fake_nvidia_smi(
        tmp_path,
        (H200 / "query-gpu.csv").read_text(),
        (H200 / "apps.csv").read_text(),
        (H200 / "topo.txt").read_text(),
        (H200 / "nvidia-smi.txt").read_text(),
    )
    (bins / "nvidia-smi").rename(bins / "real-nvidia-smi")
    timed_stand_in(bins / "nvidia-smi", f'"{bins / "real-nvidia-smi"}" "$@"')
    python = timed_stand_in(tmp_path / "python", '/usr/bin/python3 "$@"')
    env = probe_env(bins, XDG_CACHE_HOME=str(tmp_path / "cache"))
    facts = facts_from_probe(probe(tmp_path, env, python=str(python)), host="h200")
    assert [g.name for g in facts.gpus] == ["NVIDIA H200"] and facts.python.found
    # The first probe also reads the static outputs (topology, banner) after the query: two
    # rounds of two nvidia-smi runs each, the first round beside the interpreter.
    runs = spans(bins / "nvidia-smi.log") + spans(python.with_suffix(".log"))
    first_round = sorted(runs)[:3]
    assert len(runs) == 5
    assert max(start for start, _ in first_round) < min(end for _, end in first_round)
    # Once the static outputs are kept on the host, the next probe runs only the two queries.
    (bins / "nvidia-smi.log").unlink()
    facts_from_probe(probe(tmp_path, env, python=str(python)), host="h200")
    again = spans(bins / "nvidia-smi.log")
    assert len(again) == 2 and max(s for s, _ in again) < min(e for _, e in again)


def test_probe_with_failing_nvidia_smi(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the "
        'NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."\n'
        "exit 9\n"
    )
    script.chmod(0o755)
    facts = facts_from_probe(probe(tmp_path, probe_env(tmp_path)))
    [finding] = [f for f in facts.findings() if f.subject == "nvidia-smi"]
    assert finding.severity == "error"
    assert "exit code 9" in finding.message and "couldn't communicate" in finding.message


def test_probe_with_nvidia_smi_listing_no_gpus(tmp_path: Path) -> None:
    bin_dir = fake_nvidia_smi(tmp_path, "", "", "", "")
    facts = facts_from_probe(probe(tmp_path, probe_env(bin_dir)))
    [finding] = [f for f in facts.findings() if f.subject == "gpus"]
    assert finding.severity == "error" and "lists no GPUs" in finding.message


def test_probe_missing_python_is_an_error(tmp_path: Path) -> None:
    for python in (str(tmp_path / "venv" / "bin" / "python"), "no-such-python3"):
        facts = facts_from_probe(probe(tmp_path, probe_env(), python=python))
        assert not facts.python.found
        [finding] = [f for f in facts.findings() if f.subject == "python"]
        assert finding.severity == "error" and python in finding.message
        assert "python:" in finding.remedy


def test_probe_python_without_vllm_is_a_warning(tmp_path: Path) -> None:
    facts = facts_from_probe(probe(tmp_path, probe_env()))
    assert facts.vllm_version is None
    [finding] = [f for f in facts.findings() if f.subject == "vllm"]
    assert finding.severity == "warning"
    assert "vLLM is not installed in /usr/bin/python3" in finding.message


def test_probe_reads_vllm_version_without_importing_it(tmp_path: Path) -> None:
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    (package / "_version.py").write_text("__version__ = version = '0.11.2'\n")
    env = probe_env(PYTHONPATH=str(tmp_path / "site"))
    assert facts_from_probe(probe(tmp_path, env)).vllm_version == "0.11.2"
    dist = tmp_path / "site" / "vllm-0.12.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.12.0\n")
    assert facts_from_probe(probe(tmp_path, env)).vllm_version == "0.12.0"


def test_probe_names_the_process_on_the_server_port(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        answer = probe(tmp_path, probe_env(), ports=[port])
    facts = facts_from_probe(answer)
    assert facts.server_port == port
    [holder] = facts.port_holders()
    assert (holder.pid, holder.address) == (os.getpid(), "127.0.0.1")
    [finding] = [f for f in facts.findings() if f.subject == f"port {port}"]
    assert finding.severity == "error"
    assert f"in use by pid {os.getpid()}" in finding.message
    assert any(row[0] == port for row in port_table(facts).rows)


def test_probe_finds_running_model_servers(tmp_path: Path) -> None:
    sleeper = "import sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)"
    renamed = (
        "import sys, time; open('/proc/self/comm', 'w').write('VLLM::EngineCore');"
        f"{sleeper.split(';', 1)[1]}"
    )
    commands = [
        [sys.executable, "-c", sleeper, "vllm.entrypoints.openai.api_server", "--port", "1"],
        [sys.executable, "-c", sleeper, "vllm", "serve", str(tmp_path / "model")],
        [sys.executable, "-c", renamed],
    ]
    started = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    try:
        for proc in started:
            assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        facts = facts_from_probe(probe(tmp_path, probe_env()))
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    found = {s.pid: s for s in facts.servers}
    for proc in started:
        assert proc.pid in found
        assert found[proc.pid].started is not None
        assert found[proc.pid].user
    assert found[started[2].pid].comm.startswith("VLLM::")
    assert len(server_table(facts)) >= 3
    infos = [f for f in facts.findings() if f.subject == f"pid {started[1].pid}"]
    assert infos and infos[0].severity == "info" and "vllm serve" in infos[0].message


def test_gather_facts_makes_one_probe_call(tmp_path: Path) -> None:
    deployment = Deployment(
        name="t",
        hosts=[HostSpec(address="127.0.0.1", user="me")],
        model_path=str(tmp_path / "model"),
        python="/usr/bin/python3",
        server_port=8123,
    )
    host = FakeHost("127.0.0.1", user="me", probes={"facts": local_probe("facts", env=probe_env())})
    facts = gather_facts(host, deployment)
    assert host.calls == [("probe", "facts")]
    assert host.probe_args == [
        (
            "facts",
            {
                "python": "/usr/bin/python3",
                "model_path": str(tmp_path / "model"),
                "ports": [8123],
                "launch_record": "opsbook/state/launch.json",
            },
        )
    ]
    assert facts.host == "me@127.0.0.1" and facts.server_port == 8123


def _deployment(tmp_path: Path) -> Deployment:
    return Deployment(
        name="t",
        hosts=[HostSpec(address="127.0.0.1", user="me")],
        model_path=str(tmp_path / "model"),
        python="/usr/bin/python3",
        server_port=8123,
    )


def test_a_deploy_run_reads_a_hosts_facts_once(tmp_path: Path) -> None:
    deployment = _deployment(tmp_path)
    host = FakeHost("127.0.0.1", user="me", probes={"facts": local_probe("facts", env=probe_env())})
    readings = RunReadings()  # the run's, as its shared kernel holds them
    full = gather_facts(host, deployment, readings=readings)  # preflight's
    again = gather_facts(host, deployment, PATCH_FACTS, readings=readings)  # 02_config_patch's
    assert host.calls == [("probe", "facts")]
    assert again is full


def test_a_reading_is_not_reused_unless_asked_nor_for_parts_nor_in_another_run(
    tmp_path: Path,
) -> None:
    deployment = _deployment(tmp_path)
    host = FakeHost("127.0.0.1", user="me", probes={"facts": local_probe("facts", env=probe_env())})
    readings = RunReadings()
    gather_facts(host, deployment, START_FACTS, readings=readings)  # a partial one is not kept
    gather_facts(host, deployment, PATCH_FACTS, readings=readings)
    gather_facts(host, deployment, readings=readings)
    gather_facts(host, deployment, START_FACTS)  # what guards a start is always read anew
    gather_facts(host, deployment, PATCH_FACTS, readings=RunReadings())  # another run's own
    assert host.calls == [("probe", "facts")] * 5


def test_a_stage_run_alone_probes_every_time(tmp_path: Path) -> None:
    # A notebook run on its own (no shared kernel) has no readings: nothing is kept.
    deployment = _deployment(tmp_path)
    host = FakeHost("127.0.0.1", user="me", probes={"facts": local_probe("facts", env=probe_env())})
    gather_facts(host, deployment)
    gather_facts(host, deployment, PATCH_FACTS)
    assert host.calls == [("probe", "facts")] * 2


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def test_probe_knows_the_server_04_launch_recorded_and_its_group(tmp_path: Path) -> None:
    # A server in a session of its own (as 04_launch starts it) with a child in its group,
    # and an unrelated lookalike outside it.
    server = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print('up', flush=True); time.sleep(60)"
    )
    started = subprocess.Popen(
        [sys.executable, "-c", server, "vllm", "serve", "m"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert started.stdout is not None and started.stdout.readline() == "up\n"
        record = tmp_path / "launch.json"
        record.write_text(
            json.dumps({"pid": started.pid, "pgid": started.pid, "start": start_ticks(started.pid)})
        )
        own = probe(tmp_path, probe_env(), launch_record=str(record))["own_launch"]
        record.write_text(json.dumps({"pid": started.pid, "pgid": started.pid, "start": 1}))
        reused = probe(tmp_path, probe_env(), launch_record=str(record))["own_launch"]
    finally:
        os.killpg(started.pid, signal.SIGKILL)  # the group this test started
        started.wait()
        lookalike.kill()
        lookalike.wait()
    assert own["pid"] == own["pgid"] == started.pid
    assert started.pid in own["group"] and len(own["group"]) == 2
    assert lookalike.pid not in own["group"]
    assert reused is None  # same pid, another start time: not the recorded process


# --- findings from crafted probe answers ----------------------------------------------------


def answer_with(**parts: Any) -> dict[str, Any]:
    """A probe answer for a healthy single-GPU host, with ``parts`` replaced."""
    base: dict[str, Any] = {
        "nvidia_smi": {
            "path": "/usr/bin/nvidia-smi",
            "query_gpu": {"exit_code": 0, "stdout": (H200 / "query-gpu.csv").read_text()},
            "compute_apps": {"exit_code": 0, "stdout": ""},
            "topo": {"exit_code": 0, "stdout": (H200 / "topo.txt").read_text()},
            "table": {"exit_code": 0, "stdout": (H200 / "nvidia-smi.txt").read_text()},
        },
        "python": {
            "requested": "python3",
            "resolved": "/opt/venv/bin/python3",
            "run": {"found": True, "exit_code": 0},
            "info": {
                "version": "3.12.3 (main)",
                "executable": "/opt/venv/bin/python3",
                "vllm_dist": "0.11.0",
            },
        },
        "disk": {
            "path": "/models/k",
            "checked": "/models/k",
            "exists": True,
            "free_bytes": 600 << 30,
        },
        "shm": {"total_bytes": 64 << 30, "free_bytes": 64 << 30, "leftover_files": 0},
        "listening": [],
        "servers": [],
        "ports": [8000],
    }
    base.update(parts)
    return base


def test_healthy_host_is_ok() -> None:
    facts = facts_from_probe(answer_with(), host="gpu-01")
    result = check_facts(facts)
    assert result.ok, result
    assert result.findings == []
    assert result.message == (
        "gpu-01: 1 × NVIDIA H200 (compute capability 9.0, 143771 MiB); vLLM 0.11.0"
    )
    assert result.summary["vllm"] == "0.11.0"
    assert isinstance(result.facts, HostFacts)


def test_low_shm_and_leftovers() -> None:
    shm = {
        "total_bytes": 64 << 20,
        "free_bytes": 10 << 20,
        "leftover_files": 3,
        "leftover_bytes": 54 << 20,
    }
    findings = facts_from_probe(answer_with(shm=shm)).findings()
    low, leftovers = [f for f in findings if f.subject == "/dev/shm"]
    assert low.severity == "warning" and "0.0 GiB free" in low.message
    assert "--shm-size" in low.remedy
    assert leftovers.severity == "info" and "3 psm_*/sem.mp-* files" in leftovers.message


def test_port_held_by_a_model_server_is_a_warning_naming_it() -> None:
    cmdline = "/opt/venv/bin/python3 /opt/venv/bin/vllm serve /models/k --port 8000"
    answer = answer_with(
        listening=[
            {
                "port": 8000,
                "address": "0.0.0.0",
                "family": "tcp",
                "user": "ml",
                "pid": 4242,
                "process": "vllm",
                "cmdline": cmdline,
            },
            {
                "port": 8000,
                "address": "::",
                "family": "tcp6",
                "user": "ml",
                "pid": 4242,
                "process": "vllm",
                "cmdline": cmdline,
            },
        ],
        servers=[
            {
                "pid": 4242,
                "ppid": 1,
                "user": "ml",
                "started": 1.7e9,
                "comm": "vllm",
                "cmdline": cmdline,
            },
            {
                "pid": 4300,
                "ppid": 4242,
                "user": "ml",
                "started": 1.7e9,
                "comm": "VLLM::EngineCor",
                "cmdline": "VLLM::EngineCore",
            },
        ],
    )
    facts = facts_from_probe(answer)
    [port] = [f for f in facts.findings() if f.subject == "port 8000"]
    assert port.severity == "warning" and "pid 4242" in port.message
    servers = [f for f in facts.findings() if f.subject.startswith("pid ")]
    assert [f.subject for f in servers] == ["pid 4242"]
    assert "2023-11-14 22:13:20 UTC" in servers[0].message
    assert dict(summary_table(facts).rows)["server port"] == "8000 in use by pid 4242 (vllm)"


def test_port_held_by_an_invisible_process() -> None:
    answer = answer_with(
        listening=[
            {"port": 8000, "address": "0.0.0.0", "family": "tcp", "user": "alice", "pid": None}
        ]
    )
    [port] = [f for f in facts_from_probe(answer).findings() if f.subject == "port 8000"]
    assert port.severity == "error" and "user alice" in port.message


def test_gpu_memory_in_use_by_invisible_processes() -> None:
    smi = answer_with()["nvidia_smi"]
    smi["query_gpu"] = {
        "exit_code": 0,
        "stdout": "0, NVIDIA H200, 9.0, 143771, 90000, 53771, "
        "580.159.04, GPU-d02cf7f0-62cd-35e9-8294-3c350cfb105c\n",
    }
    [finding] = facts_from_probe(answer_with(nvidia_smi=smi)).findings()
    assert finding.subject == "GPU 0" and "90000 MiB in use" in finding.message


def test_python_that_does_not_run() -> None:
    python = {
        "requested": "/opt/venv/bin/python",
        "resolved": "/opt/venv/bin/python",
        "run": {
            "found": True,
            "exit_code": 127,
            "stderr": "error while loading shared libraries: libpython3.12.so.1.0\n",
        },
        "info": None,
    }
    facts = facts_from_probe(answer_with(python=python))
    [finding] = facts.findings()
    assert finding.severity == "error" and "libpython3.12" in finding.message
    assert not check_facts(facts).ok


# -- the static nvidia-smi outputs are kept on the host until reboot or a driver change -------

FAKE_SMI = """#!/bin/sh
echo "$*" >> {log}
case "$1" in
  --query-gpu*) cat {gpus} ;;
  --query-compute-apps*) ;;
  topo) echo "GPU0 X" ;;
  *) echo "| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: 13.0 |" ;;
esac
"""


def _fake_smi_host(tmp_path):
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log, gpus = tmp_path / "calls.log", tmp_path / "gpus.csv"
    gpus.write_text("0, NVIDIA B200, 10.0, 183359, 0, 183359, 580.95.05, GPU-aaaa\n")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(log=log, gpus=gpus))
    smi.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    return env, log, gpus, smi


def _preflight_probe(env: dict[str, str]) -> HostFacts:
    from opsbook.remote import probes

    answer = probes.run_local("facts", {"python": "python3", "ports": []}, env=env)
    return facts_from_probe(answer, host="gpu-01")


def test_topology_and_banner_are_asked_once_per_boot_and_driver(tmp_path):
    import os

    env, log, gpus, smi = _fake_smi_host(tmp_path)
    first = _preflight_probe(env)
    second = _preflight_probe(env)
    calls = log.read_text().splitlines()
    assert sum(c.startswith("topo") for c in calls) == 1
    assert len(calls) == 6  # 4 the first time, the 2 live queries the second
    assert not first.nvidia_smi_cached and second.nvidia_smi_cached
    assert second.topology == first.topology and second.topology.gpus
    assert second.cuda == "13.0"
    # Other GPUs, or a new nvidia-smi (a driver update), and the static outputs are asked again.
    gpus.write_text("0, NVIDIA H200, 9.0, 143771, 0, 143771, 580.95.05, GPU-bbbb\n")
    assert not _preflight_probe(env).nvidia_smi_cached
    assert _preflight_probe(env).nvidia_smi_cached
    os.utime(smi, ns=(1, 1))
    assert not _preflight_probe(env).nvidia_smi_cached


def test_opsbooks_own_server_is_one_info_not_a_warning_per_gpu_and_port() -> None:
    cmdline = "/opt/venv/bin/python3 /opt/venv/bin/vllm serve /models/k --port 8000"
    uuid = "GPU-d02cf7f0-62cd-35e9-8294-3c350cfb105c"  # the H200's
    apps = "\n".join(
        f"{pid}, VLLM::Worker_TP{i}, 88098 MiB, {uuid}" for i, pid in enumerate((4301, 4302))
    )
    smi = dict(answer_with()["nvidia_smi"])
    smi["compute_apps"] = {"exit_code": 0, "stdout": apps}
    listening = [
        {"port": 8000, "address": "0.0.0.0", "family": "tcp", "user": "ml", "pid": 4242,
         "process": "vllm", "cmdline": cmdline},
    ]  # fmt: skip
    servers = [
        {"pid": 4242, "ppid": 1, "user": "ml", "started": None, "comm": "vllm",
         "cmdline": cmdline},
    ]  # fmt: skip
    own = {"pid": 4242, "pgid": 4242, "group": [4242, 4300, 4301, 4302]}
    base = answer_with(nvidia_smi=smi, listening=listening, servers=servers)

    theirs = facts_from_probe(base).findings()
    ours = facts_from_probe({**base, "own_launch": own}).findings()

    assert {f.severity for f in theirs} >= {"warning"}
    assert [(f.severity, f.subject) for f in ours] == [("info", "pid 4242")]
    assert ours[0].message == (
        "opsbook's server (pid 4242, group 4242, 4 processes, started by 04_launch) is running "
        "and holds 1 GPU(s) (172.1 GiB in all) and port 8000"
    )


def test_a_start_asks_only_for_gpu_holders_and_listeners(tmp_path: Path) -> None:
    # The interpreter's identity costs a Python start on the host; a start does not need it.
    marker = tmp_path / "python-ran"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ntouch {marker}\nexec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    deployment = Deployment(
        name="t",
        hosts=[HostSpec(address="127.0.0.1", user="me")],
        model_path=str(tmp_path / "model"),
        python=str(python),
        server_port=8123,
    )
    host = FakeHost("127.0.0.1", user="me", probes={"facts": local_probe("facts", env=probe_env())})
    started = gather_facts(host, deployment, START_FACTS)
    assert not marker.exists()
    assert set(host.probe_args[0][1]["parts"]) == set(START_FACTS)
    assert started.server_port == 8123 and started.listening is not None
    gather_facts(host, deployment)
    assert marker.exists()
