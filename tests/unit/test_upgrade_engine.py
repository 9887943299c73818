"""The new engine of an upgrade: what its env holds, read by its own interpreter, and whether
its vLLM, torch and CUDA packages belong together."""

from __future__ import annotations

import sys

import pytest

from opsbook.remote import probes
from opsbook.remote.testing import Answer, FakeHost
from opsbook.steps import upgrade_engine as engines


def engine(**fields) -> engines.EngineInstall:
    return engines.EngineInstall(python="/opt/v18/bin/python", vllm="0.18.0", **fields)


def test_the_probe_reads_an_env_with_its_own_interpreter_without_importing_vllm() -> None:
    answer = probes.run_local(engines.PROBE, {}, python=sys.executable)
    read = engines.EngineInstall.parse(sys.executable, answer)
    assert read.executable == sys.executable
    assert read.python_version == ".".join(map(str, sys.version_info[:3]))
    assert read.vllm is None  # opsbook's own env has no vLLM
    assert read.freeze_digest and len(read.freeze_digest) == 16
    assert answer["packages"] > 10


def test_a_torch_other_than_the_one_vllm_pins_is_a_mixed_install() -> None:
    mixed = engine(torch="2.10.0+cu128", vllm_requires=("torch==2.9.0",))
    [finding] = engines.mixed_install_findings(mixed)
    assert finding.severity == "error" and finding.subject == "torch"
    assert "requires torch==2.9.0" in finding.message and "2.10.0+cu128" in finding.message
    assert "pip install 'torch==2.9.0'" in finding.remedy
    matched = engine(torch="2.9.0+cu128", vllm_requires=("torch==2.9.0",))
    assert engines.mixed_install_findings(matched) == []


def test_cuda_packages_of_two_majors_are_a_mixed_install() -> None:
    mixed = engine(
        torch="2.9.0+cu128",
        cuda_packages={"nvidia-cublas-cu12": "12.8.4", "nvidia-cuda-runtime-cu13": "13.0.1"},
    )
    [finding] = engines.mixed_install_findings(mixed)
    assert finding.subject == "CUDA"
    assert "CUDA 12: torch 2.9.0+cu128, nvidia-cublas-cu12" in finding.message
    assert "CUDA 13: nvidia-cuda-runtime-cu13" in finding.message
    one = engine(torch="2.9.0+cu128", cuda_packages={"nvidia-cublas-cu12": "12.8.4"})
    assert engines.mixed_install_findings(one) == []


@pytest.mark.parametrize(
    "python, venv",
    [("/opt/v18/bin/python", "/opt/v18"), ("/opt/v18/bin/python3.11", "/opt/v18")],
)
def test_the_env_of_an_interpreter(python: str, venv: str) -> None:
    assert engines.venv_of(python) == venv


def test_an_interpreter_outside_an_env_is_refused() -> None:
    with pytest.raises(ValueError, match="not an env's interpreter"):
        engines.venv_of("/usr/bin/env")


def test_creating_an_env_quotes_every_value_and_stops_at_a_failed_pip() -> None:
    host = FakeHost(
        "gpu",
        commands={
            r"^python3 -m venv -- '/opt/my env'$": "",
            r"^'/opt/my env/bin/python' -m pip install .* -- 'vllm==0.18.0; rm -rf /'$": Answer(
                stderr="ERROR: Invalid requirement", exit_code=1
            ),
        },
    )
    done = engines.create_engine(host, "/opt/my env/bin/python", "vllm==0.18.0; rm -rf /")
    assert not done.ok and "Invalid requirement" in done.message
    assert done.findings[0].subject == "new engine"


def small_wheel(folder, version: str):
    """A wheel of a package named vllm holding only its metadata (no dependencies: pip needs
    no index to install it)."""
    import zipfile

    path = folder / f"vllm-{version}-py3-none-any.whl"
    info = f"vllm-{version}.dist-info"
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_an_env_is_created_beside_and_pip_installs_the_source_into_it(tmp_path) -> None:
    from opsbook.remote.testing import LocalHost

    wheel = small_wheel(tmp_path, "0.18.0")
    python = str(tmp_path / "engines" / "v18" / "bin" / "python")
    done = engines.create_engine(LocalHost(home=tmp_path), python, str(wheel))
    assert done.ok, done.message
    assert "installed" in done.message and "/engines/v18" in done.message
    read = engines.read_engine(LocalHost(home=tmp_path, python=python), python)
    assert read is not None and read.vllm == "0.18.0" and read.torch is None
