"""The simulated vLLM fails with the real texts: every failure it produces is diagnosed by the
catalogue as the right class, on a line whose exception type and message stem are those of the
real logs (tests/data/logs) or, where no real log exists, of the documented vLLM text.

Each scenario runs the simulator as a real process group from a scratch venv, as
test_vllm_sim.py does; cleanup only signals the groups these tests started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsbook.knowledge.logscan import PHASE_NAMES, LogDiagnosis, diagnose_log
from opsbook.rehearsal.checkpoint import make_checkpoint, truncate_shard
from opsbook.rehearsal.sim import simgpu
from opsbook.remote.probes.launch import group_members

SYSTEM_PYTHON = Path("/usr/bin/python3")
LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
STARTUP_SECONDS = "0.2"

pytestmark = pytest.mark.skipif(
    not SYSTEM_PYTHON.exists() or not Path("/dev/shm").is_dir(), reason="needs python3 and /dev/shm"
)


@dataclass(frozen=True)
class Scenario:
    """One failure the simulator produces and the real text it must carry.

    Args:
        failure: the catalogue id the log must be diagnosed as.
        stem: the identifying line (normalised) starts with it: exception type and message stem.
        shared: further fragments of the message the identifying line holds.
        real_log: a real log of the same class in tests/data/logs, whose identifying line must
            have the same stem and fragments; None where no public log was found and the text
            is the documented one (vllm-facts).
    """

    failure: str
    stem: str
    shared: tuple[str, ...] = ()
    real_log: str | None = None


@dataclass
class Box:
    """What a scenario runs in: the venv, the simulated GPUs and a scratch folder."""

    venv: Path
    sim: Path
    tmp: Path
    groups: list[subprocess.Popen[bytes]]


@pytest.fixture
def box(venv: Path, tmp_path: Path) -> Iterator[Box]:
    simgpu.write_config(tmp_path / "sim")
    started: list[subprocess.Popen[bytes]] = []
    yield Box(venv, tmp_path / "sim", tmp_path, started)
    for proc in started:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of a launch's process group and remove the /dev/shm files it maps
    (a failed or SIGTERM-stopped launch leaves nothing: this is for a test that broke)."""
    members = group_pids(proc.pid)
    shm = {path for pid in members for path in shm_files(pid)}
    if members:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(10)
    for path in shm:
        path.unlink(missing_ok=True)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, as the launch probe sees them."""
    return sorted(group_members(pgid))


def shm_files(pid: int) -> set[Path]:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    paths = (line.split(maxsplit=5)[-1] for line in maps.splitlines())
    return {Path(p) for p in paths if p.startswith("/dev/shm/") and not p.endswith("(deleted)")}


def run_server(
    box: Box,
    model: Path,
    *flags: str,
    port: int | None = None,
    wait_for: str | None = None,
    **env: str,
) -> str:
    """Start ``vllm serve`` in its own process group; return its log once it exits (or, with
    ``wait_for``, once that text appears, after which it is stopped with SIGTERM)."""
    port = port or _free_port()
    argv = [str(box.venv / "bin" / "vllm"), "serve", str(model), "--port", str(port), *flags]
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OPSBOOK_SIM_") and key != "CUDA_VISIBLE_DEVICES"
    }
    environment.update(OPSBOOK_SIM_DIR=str(box.sim), OPSBOOK_SIM_STARTUP_SECONDS=STARTUP_SECONDS)
    environment.update(env)
    log = box.tmp / f"vllm-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    box.groups.append(proc)
    if wait_for is None:
        assert proc.wait(30) != 0, log.read_text()
        return log.read_text(errors="replace")
    _wait_for_text(proc, log, wait_for)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    return log.read_text(errors="replace")


def _wait_for_text(proc: subprocess.Popen[bytes], log: Path, needle: str) -> None:
    for _ in range(600):
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        try:
            proc.wait(0.05)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError(f"{needle!r} not in the log:\n{log.read_text(errors='replace')[-3000:]}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def checkpoint(box: Box, *, fp8_kv: bool = False) -> Path:
    return make_checkpoint(box.tmp / "model", shards=4, shard_bytes=1_000_000, kv_cache_fp8=fp8_kv)


def make_sparse(model: Path) -> None:
    """A DeepSeek-V3.2-style (sparse MLA) text config, as in the real SM120 no-backend log."""
    config = json.loads((model / "config.json").read_text())
    config["text_config"].update(model_type="deepseek_v32", index_topk=2048)
    (model / "config.json").write_text(json.dumps(config, indent=4))


# -- the scenarios ---------------------------------------------------------------------------


def fp8_kv_on_sm120(box: Box) -> str:
    return run_server(box, checkpoint(box, fp8_kv=True), "-tp", "8", "--trust-remote-code")


def fp8_kv_on_sm120_0_10_2(box: Box) -> str:
    # 0.10.2's --kv-cache-dtype auto does not follow the checkpoint: FP8 is asked for by flag.
    return run_server(
        box,
        checkpoint(box, fp8_kv=True),
        "-tp",
        "8",
        "--trust-remote-code",
        "--kv-cache-dtype",
        "fp8",
        OPSBOOK_SIM_VLLM_VERSION="0.10.2",
    )


def sparse_mla_on_sm120(box: Box) -> str:
    model = checkpoint(box)
    make_sparse(model)
    return run_server(
        box, model, "-tp", "2", "--trust-remote-code", OPSBOOK_SIM_VLLM_VERSION="0.13.0"
    )


def forced_invalid_backend(box: Box) -> str:
    return run_server(
        box, checkpoint(box), "-tp", "2", "--trust-remote-code", "--attention-backend", "FLASHMLA"
    )


def port_in_use(box: Box) -> str:
    model = checkpoint(box)
    with socket.socket() as stale:
        stale.bind(("127.0.0.1", 0))
        stale.listen()
        port = int(stale.getsockname()[1])
        return run_server(box, model, "--host", "127.0.0.1", port=port)


def memory_held_by_another_process(box: Box) -> str:
    model = checkpoint(box)
    simgpu.register_process(box.sim, os.getpid(), "python3", 1, 40000)
    try:
        return run_server(box, model, "-tp", "2", "--trust-remote-code")
    finally:
        simgpu.release_process(box.sim, os.getpid())


def oom_fault(box: Box) -> str:
    return run_server(
        box, checkpoint(box), "-tp", "2", "--trust-remote-code", OPSBOOK_SIM_FAULT="oom"
    )


def kv_cache_below_one_request(box: Box) -> str:
    flags = ("--trust-remote-code", "--gpu-memory-utilization", "0.03", "--max-model-len", "32768")
    return run_server(box, checkpoint(box), *flags)


def no_memory_left_for_kv_cache(box: Box) -> str:
    return run_server(
        box, checkpoint(box), "--trust-remote-code", "--gpu-memory-utilization", "0.02"
    )


def truncated_shard(box: Box) -> str:
    model = checkpoint(box)
    truncate_shard(model, 3, 500_000)
    return run_server(box, model, "--trust-remote-code")


def custom_code_not_trusted(box: Box) -> str:
    return run_server(box, checkpoint(box))


def removed_flag(box: Box) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOOK_SIM_")}
    done = subprocess.run(
        [str(box.venv / "bin" / "vllm"), "serve", "m", "--disable-log-requests"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "OPSBOOK_SIM_VLLM_VERSION": "0.17.1"},
    )
    assert done.returncode == 2
    return done.stdout + done.stderr


SCENARIOS: dict[str, tuple[Callable[[Box], str], Scenario]] = {
    "fp8-kv-mla-sm120-0.15.1": (
        fp8_kv_on_sm120,
        # 0.15.1's selector refuses the FP8 KV cache for every MLA backend on SM120
        # (vllm/platforms/cuda.py get_attn_backend_cls); no public log of this release's text.
        Scenario(
            "fp8kv-mla",
            "ValueError: No valid attention backend found for cuda with "
            "AttentionSelectorConfig(head_size=576",
            ("kv_cache_dtype=fp8_e4m3", "TRITON_MLA: [kv_cache_dtype not supported]"),
        ),
    ),
    "fp8-kv-mla-sm120-0.10.2": (
        fp8_kv_on_sm120_0_10_2,
        Scenario(
            "fp8kv-mla",
            "NotImplementedError: TritonMLA",
            ("with FP8 KV cache not yet supported",),
            "fp8kv-mla-1.log",
        ),
    ),
    "no-backend-sparse-mla": (
        sparse_mla_on_sm120,
        Scenario(
            "no-backend",
            "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
            "head_size=576, dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=None, "
            "use_mla=True, has_sink=False, use_sparse=True",
            (
                "Reasons: {FLASH_ATTN_MLA: [sparse not supported, compute capability not "
                "supported, FlashAttention MLA not supported on this device]",
                "TRITON_MLA: [sparse not supported]",
            ),
            "no-backend-1.log",
        ),
    ),
    "no-backend-forced": (
        forced_invalid_backend,
        # vLLM 0.15.1 vllm/platforms/cuda.py (get_attn_backend_cls); no public log of it.
        # Since 0.11.2 the backend prints as an AttentionBackendEnum member
        # (vllm/platforms/cuda.py, vllm/v1/attention/backends/registry.py).
        Scenario(
            "backend-invalid",
            "ValueError: Selected backend AttentionBackendEnum.FLASHMLA is not valid for this "
            "configuration. Reason: ['compute capability not supported', 'FlashMLA Dense is "
            "only supported on Hopper devices.']",
        ),
    ),
    "port-in-use": (
        port_in_use,
        Scenario(
            "port-in-use",
            "[Errno 98] error while attempting to bind on address ('",
            ("): address already in use",),
            "port-in-use-1.log",
        ),
    ),
    "free-memory": (
        memory_held_by_another_process,
        Scenario(
            "free-memory",
            "ValueError: Free memory on device ",
            (
                " on startup is less than desired GPU memory utilization (",
                " GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
                "processes.",
            ),
            "free-memory-1.log",
        ),
    ),
    "oom": (
        oom_fault,
        Scenario(
            "oom",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ",
            (
                " GiB of which ",
                " is free. Including non-PyTorch memory, this process has ",
                " is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
                "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            ),
            "oom-2.log",
        ),
    ),
    "kv-cache-too-small": (
        kv_cache_below_one_request,
        Scenario(
            "kv-cache-too-small",
            "ValueError: To serve at least one request with the model's max seq len (",
            (" GiB KV cache is needed, which is larger than the available KV cache memory (",),
            "kv-cache-too-small-4.log",
        ),
    ),
    "kv-cache-none-left": (
        no_memory_left_for_kv_cache,
        Scenario(
            "kv-cache-too-small",
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.",
            (),
            "kv-cache-too-small-1.log",
        ),
    ),
    "truncated-shard": (
        truncated_shard,
        # vllm-facts §4.1, §5.3 (safetensors tensor.rs); no public log of it.
        Scenario(
            "safetensors-corrupt",
            "safetensors_rust.SafetensorError: Error while deserializing header: "
            "MetadataIncompleteBuffer",
        ),
    ),
    "trust-remote-code": (
        custom_code_not_trusted,
        Scenario(
            "trust-remote-code",
            "Please pass the argument `trust_remote_code=True` to allow custom code to be run.",
            (" [type=value_error, input_value=ArgsKwargs((), {'model",),
            "trust-remote-code-2.log",
        ),
    ),
    "unknown-arg": (
        removed_flag,
        Scenario(
            "unknown-arg",
            "vllm: error: unrecognized arguments: --disable-log-requests",
            (),
            "unknown-arg-2.log",
        ),
    ),
}


def index_entries() -> dict[str, tuple[str, str]]:
    """INDEX.md as ``{file: (category, key line)}``."""
    entries = {}
    for line in (LOGS / "INDEX.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        if len(cells) == 5 and cells[0].endswith(".log"):
            entries[cells[0]] = (cells[1], cells[2])
    return entries


def identifying_text(diagnosis: LogDiagnosis) -> str:
    assert diagnosis.line is not None, str(diagnosis)
    return diagnosis.line.text


# The catalogue (opsbook/knowledge/data/failures.yaml, not this test's) still expects
# "Selected backend FLASHMLA"; the real text names the enum member (issue 10).
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_simulated_failure_is_diagnosed_on_the_real_text(name: str, box: Box) -> None:
    make_log, expected = SCENARIOS[name]
    log = make_log(box)

    diagnosis = diagnose_log(log)
    assert (diagnosis.state, diagnosis.failure) == ("failed", expected.failure), str(diagnosis)
    line = identifying_text(diagnosis)
    assert line.startswith(expected.stem), line
    assert all(part in line for part in expected.shared), line
    assert diagnosis.line is not None and diagnosis.line.raw in log

    if expected.real_log is None:
        return
    category, key_line = index_entries()[expected.real_log]
    assert category == expected.failure
    real = diagnose_log((LOGS / expected.real_log).read_text(errors="replace"))
    assert real.failure == expected.failure and real.line is not None
    assert key_line in real.line.raw
    real_line = identifying_text(real)
    assert real_line.startswith(expected.stem), real_line
    assert all(part in real_line for part in expected.shared), real_line


def test_successful_start_ends_ready_with_the_phases_in_order(box: Box) -> None:
    log = run_server(
        box,
        checkpoint(box),
        "-tp",
        "2",
        "--trust-remote-code",
        "--max-model-len",
        "32768",
        wait_for="Application startup complete.",
    )
    ready_at = log.index("Application startup complete.")
    diagnosis = diagnose_log(log[: log.index("\n", ready_at) + 1])

    assert diagnosis.state == "ready" and diagnosis.failure is None, str(diagnosis)
    assert diagnosis.line is not None and "Application startup complete." in diagnosis.line.text
    names = [phase.name for phase in diagnosis.phases]
    # Every phase, in the order a real V1 startup shows them ("Starting to load model" comes
    # before the backend is chosen, while the model is built).
    real = diagnose_log((LOGS / "ready-4.log").read_text(errors="replace"))
    assert names == [phase.name for phase in real.phases]
    assert sorted(names) == sorted(PHASE_NAMES)
    numbers = [phase.first_line_no for phase in diagnosis.phases]
    assert numbers == sorted(numbers)
    stamps = [phase.timestamp for phase in diagnosis.phases if phase.timestamp]
    assert stamps == sorted(stamps) and len(stamps) == len(names)
    # Stopped with SIGTERM afterwards, the whole log still reads as a server that was ready.
    assert diagnose_log(log).state == "ready"
