"""Unit tests of opsbook.logscan on wordings of whole classes of failure rather than of one log:
other accelerators' allocators, other releases of torch's NCCL checks, NCCL's own warnings.
Each input is rendered from the format string named above it, with sample values."""

from __future__ import annotations

import pytest

from opsbook.logscan import FAILED, diagnose_log

# Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp: AT_ERROR("NPU out of memory.
# Tried to allocate ", format_size(alloc_size), " (NPU ", device, "; ", format_size(total),
# " total capacity; ", ... " already allocated; ", ... " current active; ", ... " free; ", ...
NPU_OOM = (
    "RuntimeError: NPU out of memory. Tried to allocate 20.00 MiB (NPU 3; 32.00 GiB total "
    "capacity; 30.10 GiB already allocated; 30.10 GiB current active; 5.25 MiB free; 31.00 GiB "
    "reserved in total by PyTorch)"
)
# PyTorch c10/xpu/XPUCachingAllocator.cpp: "XPU out of memory. Tried to allocate ",
# format_size(alloc_size), ". GPU ", device, " has a total capacity of ", ...
XPU_OOM = (
    "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
    "capacity of 15.11 GiB of which 200.00 MiB is free."
)
# PyTorch aten/src/ATen/mps/MPSAllocator.mm: "MPS backend out of memory (MPS allocated: ",
# format_size(...), ", other allocations: ", ..., ", max allowed: ", ...
MPS_OOM = (
    "RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GiB, other allocations: "
    "1.20 GiB, max allowed: 18.13 GiB). Tried to allocate 256.00 MiB on private pool."
)
# PyTorch torch/csrc/cuda/nccl.cpp throw_nccl_error: "NCCL Error " << status << ": " <<
# ncclGetErrorString(status) (ncclGetErrorString of ncclSystemError is "unhandled system error").
TORCH_NCCL_ERROR = "RuntimeError: NCCL Error 5: invalid usage"


@pytest.mark.parametrize("rendered", [NPU_OOM, XPU_OOM, MPS_OOM], ids=["npu", "xpu", "mps"])
def test_another_accelerators_allocator_running_out_is_oom(rendered: str) -> None:
    diagnosis = diagnose_log(f"INFO 03-05 07:15:30 worker.py:1] Loading model\n{rendered}\n")

    assert (diagnosis.state, diagnosis.failure) == (FAILED, "oom")
    assert diagnosis.line is not None and rendered in diagnosis.line.raw


def test_the_npu_allocators_figures_are_parsed_like_cudas_older_form() -> None:
    numbers = diagnose_log(NPU_OOM + "\n").numbers

    assert numbers["tried_to_allocate"] == "20.00 MiB"
    assert (numbers["gpu"], numbers["capacity"], numbers["free"]) == (3, "32.00 GiB", "5.25 MiB")


def test_torchs_numbered_nccl_error_is_nccl() -> None:
    diagnosis = diagnose_log(TORCH_NCCL_ERROR + "\n")

    assert diagnosis.failure == "nccl"
    assert diagnosis.numbers.get("nccl_error") == "invalid usage"


# NVIDIA/nccl src/ras/client_support.cc: WARN("Call to bind failed: %s", strerror(errno)), with
# the WARN prefix of src/include/debug.h ("%s:%d:%d [%d] %s:%d NCCL WARN ").
NCCL_RAS_BIND = (
    "host1:2528104:2528104 [1] ras/client_support.cc:160 NCCL WARN Call to bind failed: "
    "Address already in use"
)


def test_ncclss_own_bind_warning_is_nccl_not_a_taken_server_port() -> None:
    diagnosis = diagnose_log(NCCL_RAS_BIND + "\nhost1:2528104:2528104 [1] NCCL INFO Init done\n")

    assert diagnosis.failure == "nccl"
    assert diagnosis.line is not None and "NCCL WARN Call to bind failed" in diagnosis.line.raw


def test_a_taken_server_port_is_still_port_in_use() -> None:
    # python/cpython Lib/asyncio/base_events.py create_server, as uvicorn logs it.
    text = (
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
        "address already in use\n"
    )
    assert diagnose_log(text).failure == "port-in-use"
