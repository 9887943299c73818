"""The simulated nvidia-smi answers in the layout of real output (tests/data/nvidia-smi/)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsbook.rehearsal.sim import nvidia_smi, simgpu

SIM = Path(nvidia_smi.__file__).resolve().parent
REAL = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
H200, RTX, B200 = REAL / "h200", REAL / "rtxpro6000", REAL / "b200"
SYSTEM_PYTHON = "/usr/bin/python3"


def sim_dir(tmp_path: Path, profile: str = "rtxpro6000", count: int = 8) -> Path:
    folder = tmp_path / "sim"
    simgpu.write_config(folder, profile, count)
    return folder


def smi(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the script the way the rehearsal host does: system python, stdlib only."""
    env = {**os.environ, "OPSBOOK_SIM_DIR": str(folder)}
    return subprocess.run(
        [SYSTEM_PYTHON, str(SIM / "nvidia_smi.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


def real(path: Path) -> str:
    return path.read_text()


def test_h200_table_is_the_real_one_but_for_the_clock(tmp_path) -> None:
    out = smi(sim_dir(tmp_path, "h200", 1)).stdout.splitlines(keepends=True)
    reference = real(H200 / "nvidia-smi.txt").splitlines(keepends=True)
    assert out[1:] == reference[1:]
    assert len(out[0]) == len(reference[0])


@pytest.mark.parametrize(
    "args, reference",
    [
        (["-L"], "list.txt"),
        (["topo", "-m"], "topo.txt"),
        (
            [
                "--query-gpu=index,name,uuid,compute_cap,memory.total,memory.used,memory.free,"
                "driver_version,pci.bus_id,temperature.gpu,utilization.gpu",
                "--format=csv",
            ],
            "query-gpu.csv",
        ),
        (
            ["--query-gpu=index,name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            "query-gpu-noheader.csv",
        ),
        (["--query-compute-apps=pid,process_name,used_memory", "--format=csv"], "apps.csv"),
    ],
)
def test_h200_answers_are_byte_identical(tmp_path, args: list[str], reference: str) -> None:
    done = smi(sim_dir(tmp_path, "h200", 1), *args)
    assert done.returncode == 0
    assert done.stdout == real(H200 / reference)


def test_eight_gpu_topology_matches_the_real_box_with_its_ansi_codes(tmp_path) -> None:
    out = smi(sim_dir(tmp_path), "topo", "-m").stdout
    assert out == real(RTX / "topo-rtxpro6000-1.txt")
    assert out.startswith("\t\x1b[4mGPU0\t") and "GPU NUMA ID\x1b[0m\n" in out


def test_h200_machine_of_eight_is_all_nvlink(tmp_path) -> None:
    out = smi(sim_dir(tmp_path, "h200", 8), "topo", "-m").stdout
    rows = [line.split("\t") for line in out.splitlines()[1:9]]
    assert all(
        row[1 + j] == ("NV18" if i != j else " X ") for i, row in enumerate(rows) for j in range(8)
    )


def test_b200_table_is_the_real_eight_gpu_one(tmp_path) -> None:
    out = smi(sim_dir(tmp_path, "b200", 8)).stdout.splitlines(keepends=True)
    reference = real(B200 / "nvidia-smi-8gpu.txt").splitlines(keepends=True)
    # The published table starts at the banner (no clock line) and stops before the processes.
    assert out[1 : 1 + len(reference)] == reference
    assert out[1 + len(reference)] == "\n"
    assert "|  No running processes found" in out[-2]


def test_b200_answers_its_compute_capability_and_nvlink(tmp_path) -> None:
    folder = sim_dir(tmp_path, "b200", 8)
    query = "--query-gpu=index,name,compute_cap,memory.total,pci.bus_id,power.limit"
    rows = smi(folder, query, "--format=csv,noheader").stdout.splitlines()
    assert rows[0] == "0, NVIDIA B200, 10.0, 183359 MiB, 00000000:51:00.0, 1000.00 W"
    assert len(rows) == 8 and all(", 10.0, 183359 MiB, " in row for row in rows)
    topo = [line.split("\t") for line in smi(folder, "topo", "-m").stdout.splitlines()[1:9]]
    assert all(
        row[1 + j] == ("NV18" if i != j else " X ") for i, row in enumerate(topo) for j in range(8)
    )
    assert [row[9] for row in topo] == ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4
    assert len({row[0] for row in topo}) == 8


def test_default_table_has_the_real_header_and_eight_gpus(tmp_path) -> None:
    out = smi(sim_dir(tmp_path)).stdout.splitlines()
    reference = real(RTX / "nvidia-smi-rtxpro6000-6gpu-mixed.txt").splitlines()
    assert out[1] == reference[1] and out[3:8] == reference[3:8]
    assert out[2] == "| NVIDIA-SMI 595.58.03" + " " * 14 + "Driver Version: 595.58.03" + " " * 6 + (
        "CUDA Version: 13.2     |"
    )
    assert len([line for line in out if "NVIDIA RTX PRO 6000 Blac...    On  |" in line]) == 8
    assert out[-8:-2] == reference[-9:-3]
    assert "|  No running processes found" in out[-2]
    assert {len(line) for line in out[1:]} <= {0, 91}


def test_gpu_rows_lay_out_like_the_real_four_gpu_server() -> None:
    gpu = simgpu.build_config("rtxpro6000-server", 1)["gpus"][0]
    gpu.update(pci_bus_id="00000000:21:00.0", temperature_c=31, perf="P0", power_draw_w=90.2)
    machine = nvidia_smi.Machine(
        {"driver_version": "580.126.20", "cuda_version": "13.0", "gpus": [gpu]},
        [{"pid": 3055949, "name": "sglang::scheduler", "gpu": 0, "used_mib": 84283}],
    )
    rows = nvidia_smi._gpu_rows(machine, gpu)
    reference = real(RTX / "nvidia-smi-rtxpro6000-4gpu-server.txt").splitlines()
    assert rows == reference[8:11]


def test_process_rows_lay_out_like_the_real_ones() -> None:
    reference = real(RTX / "nvidia-smi-rtxpro6000-6gpu-mixed.txt").splitlines()
    row = {"pid": 2292996, "name": "VLLM::EngineCore", "gpu": 4, "used_mib": 88282}
    assert nvidia_smi._process_row(row) == reference[-3]
    long_name = {"pid": 7, "name": "/opt/" + "x" * 60 + "/bin/python3", "gpu": 0, "used_mib": 1}
    assert len(nvidia_smi._process_row(long_name)) == 91
    assert "...x" in nvidia_smi._process_row(long_name)


def test_csv_headers_are_the_real_ones(tmp_path) -> None:
    folder = sim_dir(tmp_path)
    fields = "name,memory.total,memory.used,driver_version,compute_cap"
    out = smi(folder, f"--query-gpu={fields}", "--format=csv").stdout.splitlines()
    assert out[0] == real(RTX / "query-gpu-rtxpro6000-1.csv").splitlines()[0]
    assert (
        out[1]
        == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887 MiB, 0 MiB, 595.58.03, 12.0"
    )
    assert len(out) == 9
    out = smi(folder, "-i", "0", "--query-gpu=index,name,mig.mode.current", "--format=csv")
    assert out.stdout.splitlines()[0] == real(RTX / "query-gpu-rtxpro6000-4.txt").splitlines()[1]


def test_list_names_each_gpu_in_the_real_form(tmp_path) -> None:
    out = smi(sim_dir(tmp_path), "-L").stdout.splitlines()
    reference = real(RTX / "nvidia-smi-L-rtxpro6000-8gpu.txt").splitlines()[1:]
    assert len(out) == len(reference) == 8
    for mine, theirs in zip(out, reference, strict=True):
        assert mine.split(": ")[0] == theirs.split(": ")[0]
        assert mine.endswith(")") and "(UUID: GPU-" in mine


def test_memory_is_idle_usage_plus_live_processes(tmp_path) -> None:
    folder = sim_dir(tmp_path)
    simgpu.register_process(folder, os.getpid(), "VLLM::Worker_TP0", 3, 90000)
    # Above the kernel's pid_max limit: certainly not a live process.
    simgpu.register_process(folder, 2**22 + 12345, "gone", 3, 5000)
    assert simgpu.used_mib(folder, 3) == 90000
    assert simgpu.used_mib(folder, 2) == 0
    assert [p["pid"] for p in simgpu.live_processes(folder)] == [os.getpid()]
    assert not (folder / "procs" / f"{2**22 + 12345}.json").exists()
    out = smi(folder, "--query-gpu=index,memory.used,memory.free", "--format=csv,noheader")
    assert out.stdout.splitlines()[3] == "3, 90000 MiB, 7252 MiB"
    apps = smi(
        folder,
        "--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
        "--format=csv,noheader,nounits",
    ).stdout
    assert apps == (
        f"{os.getpid()}, VLLM::Worker_TP0, 90000, GPU-546805a9-3012-6e47-b753-aa1d031b6d14, "
        "00000000:76:00.0\n"
    )
    assert f"{os.getpid():>16}      C   VLLM::Worker_TP0" in smi(folder).stdout
    simgpu.release_process(folder, os.getpid())
    assert simgpu.used_mib(folder, 3) == 0


def test_a_reused_pid_does_not_inherit_memory(tmp_path) -> None:
    folder = sim_dir(tmp_path)
    simgpu.register_process(folder, os.getpid(), "old", 0, 100)
    record = folder / "procs" / f"{os.getpid()}.json"
    record.write_text(record.read_text().replace('"start_time": ', '"start_time": 1'))
    assert simgpu.live_processes(folder) == []


@pytest.mark.parametrize(
    "args, text",
    [
        (["--bogus"], "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'.\n"),
        (
            ["--query-gpu=cuda_version", "--format=csv"],
            'Field "cuda_version" is not a valid field to query.\n\n',
        ),
        (["-L", "--format=csv"], nvidia_smi.INVALID_COMBINATION + "\n"),
        (["--query-gpu=name"], nvidia_smi.INVALID_COMBINATION + "\n"),
        (["topo"], nvidia_smi.INVALID_COMBINATION + "\n"),
    ],
)
def test_bad_command_lines_get_the_real_error_and_exit_2(
    tmp_path, args: list[str], text: str
) -> None:
    done = smi(sim_dir(tmp_path), *args)
    assert (done.returncode, done.stdout) == (2, text)


def test_unknown_gpu_id_and_missing_driver(tmp_path) -> None:
    folder = sim_dir(tmp_path)
    assert smi(folder, "-i", "9", "-L").returncode == 6
    (folder / "gpus.json").unlink()
    done = smi(folder)
    assert done.returncode == 9 and "couldn't communicate with the NVIDIA driver" in done.stdout


def test_query_and_version_forms(tmp_path) -> None:
    folder = sim_dir(tmp_path)
    q = smi(folder, "-q", "-i", "1").stdout
    assert "Attached GPUs                                          : 8\n" in q
    assert "        Free                                           : 97252 MiB\n" in q
    assert smi(folder, "--version").stdout.startswith("NVIDIA-SMI version  : 595.58.03\n")


def test_deployed_copy_runs_isolated_and_finds_its_sim_dir(tmp_path) -> None:
    """As on the host: bin/nvidia-smi and sim/simgpu.py, no opsbook, no OPSBOOK_SIM_DIR."""
    (tmp_path / "bin").mkdir()
    shutil.copy(SIM / "nvidia_smi.py", tmp_path / "bin" / "nvidia-smi")
    simgpu.write_config(tmp_path / "sim", "rtxpro6000", 2)
    shutil.copy(SIM / "simgpu.py", tmp_path / "sim" / "simgpu.py")
    env = {k: v for k, v in os.environ.items() if k != "OPSBOOK_SIM_DIR"}
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", str(tmp_path / "bin" / "nvidia-smi"), "-L"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2


def test_sim_dir_comes_from_env_then_venv_marker_then_own_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPSBOOK_SIM_DIR", str(tmp_path / "from-env"))
    assert simgpu.sim_dir() == tmp_path / "from-env"
    monkeypatch.delenv("OPSBOOK_SIM_DIR")
    (tmp_path / "opsbook-sim.json").write_text('{"sim_dir": "/srv/sim"}')
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert simgpu.sim_dir() == Path("/srv/sim")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "nowhere"))
    assert simgpu.sim_dir() == SIM


def test_profiles_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown GPU profile"):
        simgpu.build_config("a100")
    with pytest.raises(ValueError, match="at least one GPU"):
        simgpu.build_config("h200", 0)
    gpus = simgpu.build_config("rtxpro6000", 12)["gpus"]
    assert len({g["uuid"] for g in gpus}) == len({g["pci_bus_id"] for g in gpus}) == 12
