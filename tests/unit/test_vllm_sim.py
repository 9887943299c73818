"""The simulated vLLM of the rehearsal host, run as real processes from a scratch venv.

Each launch gets its own process group (start_new_session), so cleanup only ever signals
groups and PIDs these tests started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsbook.rehearsal.checkpoint import make_checkpoint, truncate_shard
from opsbook.rehearsal.sim import simgpu
from opsbook.rehearsal.sim.vllm import _simmodel
from opsbook.rehearsal.sim.vllm._simrelease import Release
from opsbook.remote.probes.launch import group_members

SYSTEM_PYTHON = Path("/usr/bin/python3")
STARTUP_SECONDS = "0.3"
# What 0.15.1 prints for the incident's checkpoint on SM120: its selector refuses the FP8 KV
# cache for every MLA backend (vllm/platforms/cuda.py, vllm/v1/attention/backend.py and the
# backends' supported_kv_cache_dtypes / supports_combination in the 0.15.1 wheel).
FP8_FAILURE = (
    "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
    "head_size=576, dtype=torch.bfloat16, kv_cache_dtype=fp8_e4m3, block_size=None, "
    "use_mla=True, has_sink=False, use_sparse=False, use_mm_prefix=False, attn_type=decoder). "
    "Reasons: {FLASH_ATTN_MLA: [kv_cache_dtype not supported, compute capability not supported, "
    "FlashAttention MLA not supported on this device], FLASHMLA: [compute capability not "
    "supported, FlashMLA Dense is only supported on Hopper devices.], FLASHINFER_MLA: [compute "
    "capability not supported], TRITON_MLA: [kv_cache_dtype not supported], FLASHMLA_SPARSE: "
    "[kv_cache_dtype not supported, non-sparse not supported, compute capability not supported]}."
)
ENGINE_FAILED = (
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {'EngineCore_DP0': 1}"
)
# 0.13.0-0.15.1 log the candidates as a tuple; 0.16.0 on as "['A']." (vllm/platforms/cuda.py).
TRITON_CHOSEN = "Using TRITON_MLA attention backend out of potential backends: ('TRITON_MLA',)"
TRITON_CHOSEN_0_18 = "Using TRITON_MLA attention backend out of potential backends: ['TRITON_MLA']."
READY = "Application startup complete."

pytestmark = pytest.mark.skipif(
    not SYSTEM_PYTHON.exists() or not Path("/dev/shm").is_dir(), reason="needs python3 and /dev/shm"
)


@pytest.fixture
def sim_dir(tmp_path: Path) -> Path:
    simgpu.write_config(tmp_path / "sim")
    return tmp_path / "sim"


def fp8_checkpoint(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "model", shards=4, shard_bytes=1_000_000)


def remove_kv_keys(model_dir: Path) -> None:
    """What the config-patch stage does: drop the checkpoint's FP8 KV-cache settings."""
    config = json.loads((model_dir / "config.json").read_text())
    config["quantization_config"].pop("kv_cache_scheme", None)
    config["quantization_config"].pop("kv_cache_quant_algo", None)
    (model_dir / "config.json").write_text(json.dumps(config, indent=4))
    quant = json.loads((model_dir / "hf_quant_config.json").read_text())
    quant["quantization"].pop("kv_cache_quant_algo", None)
    (model_dir / "hf_quant_config.json").write_text(json.dumps(quant, indent=4))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, as the launch probe sees them."""
    return sorted(group_members(pgid))


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def shm_files(pids: list[int]) -> set[Path]:
    """/dev/shm files the processes map, as fuser would find them."""
    files = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith("/dev/shm/") and not path.endswith("(deleted)"):
                files.add(Path(path))
    return files


class Launch:
    """One simulated server started in its own process group, its log in a file."""

    def __init__(self, venv: Path, argv: list[str], sim: Path, log: Path, **env: str):
        self.log_path = log
        self.shm: set[Path] = set()
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("OPSBOOK_SIM_") and key != "CUDA_VISIBLE_DEVICES"
        }
        environment.update(
            OPSBOOK_SIM_DIR=str(sim), OPSBOOK_SIM_STARTUP_SECONDS=STARTUP_SECONDS, **env
        )
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,
            )
        self.pgid = self.proc.pid

    @property
    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text:
                self.shm |= shm_files(group_pids(self.pgid))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in the log:\n{self.text[-4000:]}")

    def exit_code(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        """SIGKILL whatever is left of the group and remove the /dev/shm files it mapped."""
        self.shm |= shm_files(group_pids(self.pgid))
        if group_pids(self.pgid):
            os.killpg(self.pgid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)
        for path in self.shm:
            path.unlink(missing_ok=True)


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.cleanup()


def serve(
    venv: Path, sim: Path, model: Path, launches: list[Launch], *flags: str, **env: str
) -> tuple[Launch, int]:
    port = free_port()
    argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--port", str(port), *flags]
    launch = Launch(venv, argv, sim, model.parent / f"vllm-{port}.log", **env)
    launches.append(launch)
    return launch, port


def get(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
            status = answer.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def test_fp8_kv_checkpoint_fails_on_sm120_with_0_15_1(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    launch, _ = serve(venv, sim_dir, model, launches, "-tp", "8", "--trust-remote-code")
    assert launch.exit_code() == 1
    text = launch.text
    assert "kv_cache_dtype=fp8_e4m3" in text
    assert "quantization=modelopt_fp4" in text
    assert "Using fp8 data type to store kv cache." in text
    assert text.index(FP8_FAILURE) < text.index(ENGINE_FAILED)
    assert "out of potential backends" not in text
    assert "(EngineCore_DP0 pid=" in text and "(Worker_TP0 pid=" in text
    assert not group_pids(launch.pgid)
    assert simgpu.live_processes(sim_dir) == []
    assert not list((sim_dir / "procs").glob("*.json"))


def test_checkpoint_without_kv_keys_serves_and_stops_cleanly(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    launch, port = serve(
        venv,
        sim_dir,
        model,
        launches,
        "-tp",
        "2",
        "--trust-remote-code",
        "--served-model-name",
        "kimi",
        "--max-model-len",
        "32768",
    )
    launch.wait_for(READY)
    text = launch.text
    assert "kv_cache_dtype=auto" in text
    assert TRITON_CHOSEN in text
    assert f"Starting vLLM API server 0 on http://0.0.0.0:{port}" in text

    pids = group_pids(launch.pgid)
    titles = sorted(cmdline(pid) for pid in pids if pid != launch.pgid)
    assert titles == [b"VLLM::EngineCore\x00", b"VLLM::Worker_TP0\x00", b"VLLM::Worker_TP1\x00"]
    held = simgpu.live_processes(sim_dir)
    assert [(r["gpu"], r["name"]) for r in held] == [
        (0, "VLLM::Worker_TP0"),
        (1, "VLLM::Worker_TP1"),
    ]
    assert all(r["used_mib"] == int(0.9 * 97887) for r in held)
    assert any(p.name.startswith("psm_") for p in launch.shm)
    assert any(p.name.startswith("sem.mp-") for p in launch.shm)

    assert get(port, "/health")[0] == 200
    status, models = get(port, "/v1/models")
    assert status == 200
    assert models["data"][0]["id"] == "kimi"
    assert models["data"][0]["root"] == str(model)
    assert models["data"][0]["max_model_len"] == 32768
    assert get(port, "/version") == (200, {"version": "0.15.1"})
    status, completion = get(
        port, "/v1/completions", {"model": "kimi", "prompt": "Hi", "max_tokens": 4}
    )
    assert status == 200
    assert completion["object"] == "text_completion"
    assert completion["usage"]["completion_tokens"] == 4
    assert len(completion["choices"][0]["text"].split()) == 4
    status, chat = get(
        port,
        "/v1/chat/completions",
        {"model": "kimi", "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"
    assert get(port, "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    assert "vllm:generation_tokens_total" in get(port, "/metrics")[1]

    os.killpg(launch.pgid, signal.SIGTERM)
    assert launch.exit_code() == 0
    deadline = time.monotonic() + 5
    while group_pids(launch.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_pids(launch.pgid)
    assert not list((sim_dir / "procs").glob("*.json"))
    assert [path for path in launch.shm if path.exists()] == []
    assert "Application shutdown complete." in launch.text


def test_version_0_18_serves_fp8_kv_cache(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    launch, port = serve(
        venv,
        sim_dir,
        model,
        launches,
        "-tp",
        "2",
        "--trust-remote-code",
        OPSBOOK_SIM_VLLM_VERSION="0.18.0",
    )
    launch.wait_for(READY)
    text = launch.text
    assert "Initializing a V1 LLM engine (v0.18.0)" in text
    assert "kv_cache_dtype=fp8_e4m3" in text
    assert TRITON_CHOSEN_0_18 in text
    assert f"Starting vLLM server on http://0.0.0.0:{port}" in text
    assert get(port, "/version") == (200, {"version": "0.18.0"})


@pytest.mark.parametrize(
    ("version", "dtypes"),
    [
        ("0.15.1", ["auto", "bfloat16"]),
        ("0.18.0", ["auto", "float16", "bfloat16", "fp8", "fp8_e4m3"]),
    ],
)
def test_triton_mla_backend_exposes_kv_dtypes_of_its_version(
    venv: Path, version: str, dtypes: list[str]
) -> None:
    probe = (
        "import json, vllm\n"
        "from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend as B\n"
        "print(json.dumps([vllm.__version__, B.supported_kv_cache_dtypes]))\n"
    )
    env = {**os.environ, "OPSBOOK_SIM_VLLM_VERSION": version}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == [version, dtypes]


def test_sigkill_leaves_orphans_holding_memory_and_shm_files(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    launch, _ = serve(venv, sim_dir, model, launches, "-tp", "2", "--trust-remote-code")
    launch.wait_for(READY)
    children = [pid for pid in group_pids(launch.pgid) if pid != launch.pgid]

    os.kill(launch.pgid, signal.SIGKILL)
    launch.exit_code()
    time.sleep(0.5)
    assert group_pids(launch.pgid) == children
    assert len(simgpu.live_processes(sim_dir)) == 2
    sems = [path for path in launch.shm if path.name.startswith("sem.mp-")]
    assert sems and all(path.exists() for path in sems)

    os.killpg(launch.pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while group_pids(launch.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert simgpu.live_processes(sim_dir) == []
    assert all(path.exists() for path in launch.shm)


def test_port_in_use_is_reported_before_the_engine_starts(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    with socket.socket() as stale:
        stale.bind(("127.0.0.1", 0))
        stale.listen()
        port = stale.getsockname()[1]
        argv = [
            str(venv / "bin" / "vllm"),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        launch = Launch(venv, argv, sim_dir, tmp_path / "port.log")
        launches.append(launch)
        assert launch.exit_code() == 1
    assert (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
        "address already in use"
    ) in launch.text
    assert "EngineCore" not in launch.text


def test_truncated_shard_fails_at_loading(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    truncate_shard(model, 3, 500_000)
    launch, _ = serve(venv, sim_dir, model, launches, "--trust-remote-code")
    assert launch.exit_code() == 1
    text = launch.text
    assert "Loading safetensors checkpoint shards:  50% Completed | 2/4" in text
    assert (
        "safetensors_rust.SafetensorError: Error while deserializing header: "
        "MetadataIncompleteBuffer"
    ) in text
    assert ENGINE_FAILED in text


def test_custom_code_needs_trust_remote_code(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    launch, _ = serve(venv, sim_dir, model, launches)
    assert launch.exit_code() == 1
    text = launch.text
    assert f"The repository {model} contains custom code which must be executed" in text
    assert (
        "Please pass the argument `trust_remote_code=True` to allow custom code to be run." in text
    )


def test_free_memory_held_by_another_process_fails_startup(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    simgpu.register_process(sim_dir, os.getpid(), "python3", 1, 40000)
    launch, _ = serve(venv, sim_dir, model, launches, "-tp", "2", "--trust-remote-code")
    assert launch.exit_code() == 1
    assert (
        "ValueError: Free memory on device cuda:1 (55.91/95.59 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 86.03 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes."
    ) in launch.text
    simgpu.release_process(sim_dir, os.getpid())


def vllm_cli(venv: Path, *argv: str, version: str = "0.15.1") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOOK_SIM_")}
    return subprocess.run(
        [str(venv / "bin" / "vllm"), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "OPSBOOK_SIM_VLLM_VERSION": version},
    )


def test_disable_log_requests_is_gone_in_0_17_only(venv: Path) -> None:
    # vllm/engine/arg_utils.py: AsyncEngineArgs adds it up to 0.16.0, not in 0.17.1.
    out = vllm_cli(venv, "serve", "m", "--disable-log-requests", version="0.17.1")
    assert out.returncode == 2
    assert out.stderr.strip().endswith(
        "vllm: error: unrecognized arguments: --disable-log-requests"
    )
    accepted = vllm_cli(venv, "serve", "/nowhere", "--disable-log-requests", version="0.16.0")
    assert accepted.returncode == 1
    assert "Invalid repository ID or local directory specified: '/nowhere'" in (
        accepted.stdout + accepted.stderr
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--attention-config.backend", "TRITON_MLA"],
        ["--attention-config.backend=TRITON_MLA"],
        ["--attention-backend", "TRITON_MLA"],
        ["--kv-cache-memory", "1000000"],
        ["--kv-cache-memory-bytes", "1G"],
        ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'],
        ["-cc.cudagraph_mode=PIECEWISE"],
        ["--hf-token"],
        ["--hf-token", "hf_x"],
        ["--disable-log-requests"],
    ],
)
def test_flags_of_0_15_1_pass_the_parser(venv: Path, flags: list[str]) -> None:
    out = vllm_cli(venv, "serve", "/nowhere", *flags)
    assert out.returncode == 1, out.stderr
    assert "Invalid repository ID or local directory specified" in out.stdout + out.stderr


def test_attention_backend_flags_arrive_in_0_13(venv: Path) -> None:
    for flag in ("--attention-backend", "--attention-config.backend"):
        out = vllm_cli(venv, "serve", "m", flag, "TRITON_MLA", version="0.12.0")
        assert out.returncode == 2
        assert "unrecognized arguments" in out.stderr or "invalid choice" in out.stderr


def test_unknown_kv_dtype_is_refused_by_argparse_before_0_33(venv: Path) -> None:
    out = vllm_cli(venv, "serve", "m", "--kv-cache-dtype", "fp9")
    assert out.returncode == 2
    assert "argument --kv-cache-dtype: invalid choice: 'fp9'" in out.stderr


def test_unknown_kv_dtype_fails_after_config_load_from_0_33(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    launch, _ = serve(
        venv,
        sim_dir,
        model,
        launches,
        "--trust-remote-code",
        "--kv-cache-dtype",
        "fp9",
        OPSBOOK_SIM_VLLM_VERSION="0.33.0",
    )
    assert launch.exit_code() == 1
    text = launch.text
    assert "1 validation error for CacheConfig" in text
    assert "Value error, Invalid kv_cache_dtype: 'fp9'. Valid values are: [" in text
    assert text.index("Resolved architecture:") < text.index("Invalid kv_cache_dtype")
    assert "EngineCore" not in text


def test_selector_reasons_match_the_real_sm120_sparse_log() -> None:
    config = {
        "model_type": "deepseek_v32",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "index_topk": 2048,
    }
    with pytest.raises(_simmodel.SimError) as failure:
        _simmodel.select_backend(config, (12, 0), "auto", Release("0.13.0"), None)
    assert failure.value.message == (
        "No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, "
        "dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=None, use_mla=True, "
        "has_sink=False, use_sparse=True, use_mm_prefix=False, attn_type=decoder). Reasons: "
        "{FLASH_ATTN_MLA: [sparse not supported, compute capability not supported, "
        "FlashAttention MLA not supported on this device], FLASHMLA: [sparse not supported, "
        "compute capability not supported, FlashMLA Sparse is only supported on Hopper and "
        "Blackwell devices.], FLASHINFER_MLA: [sparse not supported, compute capability not "
        "supported], TRITON_MLA: [sparse not supported], FLASHMLA_SPARSE: [compute capability "
        "not supported]}."
    )


KIMI_TEXT = {
    "text_config": {
        "model_type": "deepseek_v3",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
    }
}


@pytest.mark.parametrize(
    ("capability", "version", "kv", "chosen"),
    [
        ((12, 0), "0.15.1", "auto", ["TRITON_MLA"]),
        ((12, 0), "0.18.0", "fp8_e4m3", ["TRITON_MLA"]),
        ((12, 0), "0.33.0", "fp8_e4m3", ["TRITON_MLA"]),
        ((9, 0), "0.15.1", "auto", ["FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"]),
        ((10, 0), "0.18.0", "fp8_e4m3", ["FLASHINFER_MLA", "CUTLASS_MLA", "TRITON_MLA"]),
        (
            (10, 0),
            "0.33.0",
            "fp8_e4m3",
            ["FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "TRITON_MLA"],
        ),
    ],
)
def test_dense_mla_backend_priority(
    capability: tuple[int, int], version: str, kv: str, chosen: list[str]
) -> None:
    assert _simmodel.select_backend(KIMI_TEXT, capability, kv, Release(version), None) == (
        chosen[0],
        chosen,
        False,
    )


def test_fp8_kv_on_sm120_with_0_15_1_is_refused_by_the_selector() -> None:
    with pytest.raises(_simmodel.SimError) as failure:
        _simmodel.select_backend(KIMI_TEXT, (12, 0), "fp8_e4m3", Release("0.15.1"), None)
    assert f"ValueError: {failure.value.message}" == FP8_FAILURE


@pytest.mark.parametrize("version", ["0.13.0", "0.15.1", "0.17.1"])
def test_blackwell_default_selects_flashinfer_mla_with_fp8(version: str) -> None:
    # 0.13-0.17 set attention_config.backend = FLASHINFER_MLA on SM10x (vllm/platforms/cuda.py).
    release = Release(version)
    assert _simmodel.select_backend(KIMI_TEXT, (10, 0), "fp8_e4m3", release, None) == (
        "FLASHINFER_MLA",
        ["FLASHINFER_MLA"],
        True,
    )
    assert release.backend_name("FLASHINFER_MLA") == "AttentionBackendEnum.FLASHINFER_MLA"


def test_0_10_2_picks_triton_mla_and_its_impl_refuses_fp8() -> None:
    release = Release("0.10.2")
    chosen = _simmodel.select_backend(KIMI_TEXT, (12, 0), "fp8_e4m3", release, None)
    assert chosen[0] == "TRITON_MLA"
    error = _simmodel.backend_init_error("TRITON_MLA", "fp8_e4m3", release)
    assert error is not None
    assert error.message == "TritonMLA V1 with FP8 KV cache not yet supported"
    assert _simmodel.backend_init_error("TRITON_MLA", "fp8_e4m3", Release("0.15.1")) is None


def test_forced_backend_with_wrong_capability_is_refused() -> None:
    config = {"model_type": "kimi_k2", "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    with pytest.raises(
        _simmodel.SimError,
        match=r"Selected backend AttentionBackendEnum.FLASHMLA is not valid .* "
        r"Reason: \['compute capability not supported', "
        r"'FlashMLA Dense is only supported on Hopper devices.'\]",
    ):
        _simmodel.select_backend(config, (12, 0), "auto", Release("0.15.1"), "FLASHMLA")


def test_kv_dtype_auto_follows_the_checkpoint() -> None:
    scheme = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
    }
    legacy = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
    }
    assert _simmodel.resolve_kv_cache_dtype("auto", scheme, "0.15.1", []) == "fp8_e4m3"
    assert _simmodel.resolve_kv_cache_dtype("auto", legacy, "0.15.1", []) == "fp8_e4m3"
    assert _simmodel.resolve_kv_cache_dtype("bfloat16", scheme, "0.15.1", []) == "bfloat16"
    assert (
        _simmodel.resolve_kv_cache_dtype("auto", {**scheme, "kv_cache_scheme": None}, "0.15.1", [])
        == "auto"
    )


def test_sim_package_stays_independent_of_opsbook() -> None:
    sources = Path(_simmodel.__file__).parent.rglob("*.py")
    assert not [
        p
        for p in sources
        if "opsbook"
        in p.read_text()
        .replace("opsbook-vllm-sim", "")
        .replace("opsbook_sim", "")
        .replace("OPSBOOK_SIM", "")
        .lower()
        and "import opsbook" in p.read_text()
    ]
    assert sys.version_info >= (3, 9)


def test_b200_serves_the_fp8_kv_checkpoint_with_flashinfer_mla_on_0_15_1(
    venv: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    b200 = tmp_path / "b200"
    simgpu.write_config(b200, "b200", 8)
    model = fp8_checkpoint(tmp_path)
    launch, port = serve(venv, b200, model, launches, "-tp", "8", "--trust-remote-code")
    launch.wait_for(READY)
    text = launch.text
    assert "kv_cache_dtype=fp8_e4m3" in text
    assert "Using fp8 data type to store kv cache." in text
    assert "Forcing kv cache block size to 64 for FlashInferMLA backend." in text
    assert "Using AttentionBackendEnum.FLASHINFER_MLA backend." in text
    assert get(port, "/version") == (200, {"version": "0.15.1"})


def test_0_33_0_serves_the_fp8_kv_checkpoint_on_sm120(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    model = fp8_checkpoint(tmp_path)
    launch, _ = serve(
        venv,
        sim_dir,
        model,
        launches,
        "-tp",
        "8",
        "--trust-remote-code",
        OPSBOOK_SIM_VLLM_VERSION="0.33.0",
    )
    launch.wait_for(READY)
    text = launch.text
    assert "Using fp8_e4m3 data type to store kv cache." in text
    assert "Using TRITON_MLA attention backend out of potential backends: ['TRITON_MLA']." in text
    assert "Forcing kv cache block size" not in text


def test_vllm_attention_backend_is_obeyed_by_0_14_1_and_ignored_from_0_15_1(
    venv: Path, sim_dir: Path, tmp_path: Path, launches: list[Launch]
) -> None:
    # vLLM 0.14.1 reads VLLM_ATTENTION_BACKEND (vllm/config/attention.py); 0.15.1's vllm/envs.py
    # no longer lists it, and until 0.31.0 nothing says so (vllm issue 50292); from 0.31.0
    # validate_environ warns (vllm/platforms/interface.py).
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    flags = ("-tp", "2", "--trust-remote-code", "--max-model-len", "32768")
    said = {}
    for version in ("0.14.1", "0.15.1", "0.32.0"):
        launch, _ = serve(
            venv, sim_dir, model, launches, *flags,
            VLLM_ATTENTION_BACKEND="FLASHMLA", OPSBOOK_SIM_VLLM_VERSION=version,
        )  # fmt: skip
        if version == "0.14.1":
            assert launch.exit_code() != 0
        else:
            launch.wait_for(READY)
        said[version] = launch.text
        launch.cleanup()  # its simulated GPU memory, before the next release starts
    assert "Selected backend AttentionBackendEnum.FLASHMLA is not valid" in said["0.14.1"]
    assert "Using TRITON_MLA attention backend" in said["0.15.1"]
    unknown = "Unknown vLLM environment variable detected: VLLM_ATTENTION_BACKEND"
    assert unknown not in said["0.15.1"] and unknown in said["0.32.0"]
