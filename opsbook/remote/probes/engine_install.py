"""Probe: what an engine's env holds, read by that env's own interpreter from its packages'
metadata, without importing vLLM or torch (seconds each, and a broken install may not import).

Stdlib only and Python 3.8 compatible. Sent to the interpreter 07_upgrade is to switch to:
its vLLM and torch versions, what vLLM's metadata requires of torch, the CUDA runtime
packages beside them, and a digest of the whole installed set (what ``pip freeze`` lists).

Args (the dict given to ``main``): none.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

# The CUDA packages NVIDIA publishes on PyPI carry the CUDA major in their name
# (nvidia-cuda-runtime-cu12, nvidia-cublas-cu13...); torch's own version its build
# (2.9.0+cu128).
CUDA_PACKAGE_PREFIX = "nvidia-"


def _distributions() -> list[Any]:
    import importlib.metadata as metadata

    return list(metadata.distributions())


def _name(dist: Any) -> str:
    return str(dist.metadata["Name"] or "").lower().replace("_", "-")


def main(args: dict) -> dict:
    dists = _distributions()
    versions = {}
    requires = {}
    for dist in dists:
        name = _name(dist)
        if name and name not in versions:
            versions[name] = str(dist.version)
            if name == "vllm":
                requires["vllm"] = [str(r) for r in dist.requires or []]
    frozen = sorted(f"{name}=={version}" for name, version in versions.items())
    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "python": ".".join(str(n) for n in sys.version_info[:3]),
        "vllm": versions.get("vllm"),
        "torch": versions.get("torch"),
        "vllm_requires": [r for r in requires.get("vllm", []) if r.lower().startswith("torch")],
        "cuda_packages": {
            name: version
            for name, version in sorted(versions.items())
            if name.startswith(CUDA_PACKAGE_PREFIX)
        },
        "freeze_digest": hashlib.sha256("\n".join(frozen).encode()).hexdigest()[:16],
        "packages": len(frozen),
    }
