"""The simulated ``VLLM::EngineCore`` and ``VLLM::Worker_TP<n>`` processes.

The engine core runs vLLM's engine start-up phases (worker init, free-memory check, backend
selection, weight loading with shard checks, compile, memory profiling, KV-cache sizing,
CUDA graphs), logging each with the prefix of the process that logs it in vLLM, and records
the simulated GPU memory of every worker. It tells the API server over a pipe when it is
ready; a failure ends it with exit code 1 after the traceback vLLM prints.

Workers only hold: their title, a /dev/shm ring buffer, their GPU memory record. They exit
cleanly on SIGTERM or when their engine core dies. The engine core does not watch the API
server, so killing only the API server leaves it and its workers running as orphans.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import _simmodel as model
from . import _simrelease
from ._simframes import (
    CORE_FRAMES,
    CORE_KV_FRAMES,
    CORE_PROFILE_FRAMES,
    MP_RPC_FRAMES,
    MP_WAIT_FRAMES,
    OOM_TAIL,
    WORKER_MAIN,
    make_frames,
    worker_frames,
)
from ._simlog import Log
from ._simprocs import (
    ShmFile,
    free_mib,
    gpu_records,
    is_alive,
    load_simgpu,
    register,
    release,
    set_title,
    spawn,
    stop_children,
)

GIB = model.GIB
MIB = model.MIB
CONTEXT_MIB = 560
ACTIVATION_GIB = 1.5
NCCL_GIB = 0.6
GRAPH_GIB = 0.52
PHASES = {"workers": 0.1, "load": 0.35, "compile": 0.15, "profile": 0.1, "graphs": 0.2}


def engine_main(spec: dict[str, Any]) -> None:
    """Entry point of the ``VLLM::EngineCore`` process."""
    set_title("VLLM::EngineCore")
    Engine(spec).run()


def worker_main(spec: dict[str, Any]) -> None:
    """Entry point of a ``VLLM::Worker_TP<n>`` process."""
    set_title(spec["title"])
    Worker(spec).run()


def worker_label(rank: int, tp: int, pp: int) -> str:
    if pp > 1:
        return f"Worker_PP{rank // tp}_TP{rank % tp}"
    return f"Worker_TP{rank}"


class Worker:
    """A GPU worker: holds its ring buffer and memory record until told to stop."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.parent = os.getppid()
        self.shm: ShmFile | None = None

    def run(self) -> None:
        # Imported now: a signal arriving during a first import would see half a module.
        load_simgpu()
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        self.shm = ShmFile.ring_buffer(readers=1)
        log = Log(self.spec["label"])
        while True:
            time.sleep(0.2)
            if os.getppid() != self.parent or not is_alive(self.parent):
                log.info("multiproc_executor.py:709", "Parent process exited, terminating worker")
                self._exit(0)

    def _on_term(self, signum: int, frame: Any) -> None:
        self._exit(0)

    def _exit(self, code: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            release(self.spec["sim_dir"], os.getpid())
        except Exception:
            pass
        if self.shm is not None:
            self.shm.unlink()
        os._exit(code)


# How often the engine core tells the API server it answers (the server's patience is
# ENGINE_SILENT_SECONDS in _simserver).
HEARTBEAT_SECONDS = 0.05


class Engine:
    """The engine core: runs the start-up phases, then idles until stopped."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self.log = Log("EngineCore_DP0")
        self.tp = int(spec["tp"])
        self.pp = int(spec["pp"])
        self.world = self.tp * self.pp
        self.seconds = float(spec["seconds"])
        self.workers: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []
        self.shm: list[ShmFile] = []
        self.ranks: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.stopping = False
        # With --distributed-executor-backend ray: the cluster, its placement group and actors.
        self.ray: Any = None
        self.ray_ranks: list[dict[str, Any]] = []
        self.load_refs: list[Any] = []

    # Life cycle.

    def run(self) -> None:
        load_simgpu()
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        started = time.monotonic()
        try:
            ready = self._start(started)
        except model.SimError as error:
            self._fail(error)
            return
        except Exception as error:  # Ray's own errors: a node or actor died, no cluster
            if self.ray is None:
                raise
            self._fail(self._ray_error(error))
            return
        self._report(ready)
        self._idle()

    def _start(self, started: float) -> dict[str, Any]:
        spec = self.spec
        self.config = model.load_model_config(Path(spec["model_dir"]))
        self.log.info("core.py:93", self._engine_config_line())
        gpus = gpu_records(spec["sim_dir"])
        if not gpus:
            raise model.SimError("RuntimeError", "No CUDA GPUs are available", "engine")
        if spec.get("executor") == "ray":
            self._start_ray_workers(len(gpus))
        elif self.world > len(gpus):
            raise model.SimError(
                "AssertionError",
                f"please set tensor_parallel_size ({self.tp}) to less than max local gpu "
                f"count ({len(gpus)})",
                "engine",
            )
        else:
            self.ranks = gpus[: self.world]
            self._start_workers()
        self._pace("workers")
        self._check_free_memory()
        capability = _capability(self.ranks[0])
        kv_dtype = spec["kv_cache_dtype"]
        self._rank_log(0).info(
            "gpu_model_runner.py:3259", f"Starting to load model {spec['model']}..."
        )
        backend = self._select_backend(capability, kv_dtype)
        load_seconds = self._load_weights()
        weights_gib = self._weights_per_gpu() / GIB
        self._rank_log(0).info(
            "gpu_model_runner.py:3338",
            f"Model loading took {weights_gib:.4f} GiB memory and {load_seconds + 0.4:.6f} seconds",
        )
        self._compile()
        tokens = self._profile_and_size_kv(kv_dtype)
        self._capture_graphs()
        took = time.monotonic() - started
        self.log.info(
            "core.py:250",
            f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds",
        )
        return {"status": "ready", "backend": backend, "kv_tokens": tokens}

    def _report(self, ready: dict[str, Any]) -> None:
        os.write(int(self.spec["status_fd"]), (json.dumps(ready) + "\n").encode())
        if self.spec.get("fault") != "engine-hang":
            threading.Thread(target=self._heartbeat, daemon=True).start()

    def _heartbeat(self) -> None:
        """Tell the API server the engine core answers, as vLLM's engine core answers its
        client's ZMQ socket: the server produces tokens only while these lines come, so a
        stopped (SIGSTOP) or wedged engine stalls generation while /health stays 200. The
        engine-hang fault never starts this (a wedged engine core without a signal)."""
        beat = (json.dumps({"status": "alive"}) + "\n").encode()
        while not self.stopping:
            try:
                os.write(int(self.spec["status_fd"]), beat)
            except OSError:
                return
            time.sleep(HEARTBEAT_SECONDS)

    def _idle(self) -> None:
        if self.ray is not None:
            self._idle_on_ray()
        while not self.stopping:
            time.sleep(0.2)
            for rank, worker in enumerate(self.workers):
                code = worker.poll()
                if code == 0:
                    # A worker that exits cleanly was told to stop with the rest of the group.
                    self._shutdown(0)
                if code is not None and not self.stopping:
                    self.log.error(
                        "multiproc_executor.py:149",
                        f"Worker proc VllmWorker-{rank} died unexpectedly, shutting down executor.",
                    )
                    self._shutdown(1)

    def _on_term(self, signum: int, frame: Any) -> None:
        self._shutdown(0)

    def _shutdown(self, code: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.stopping = True
        stop_children(self.workers)
        if self.ray is not None:
            # Ray removes an owner's actors when it exits; releasing them first is quicker.
            done = threading.Thread(target=self.ray.shutdown, daemon=True)
            done.start()
            done.join(3.0)
        for pid in [os.getpid(), *self.pids]:
            try:
                release(self.spec["sim_dir"], pid)
            except Exception:
                pass
        for shm in self.shm:
            shm.unlink()
        os._exit(code)

    def _fail(self, error: model.SimError) -> None:
        """Print the traceback(s) vLLM prints for this failure and exit 1."""
        rank = error.rank
        phase = error.phase
        in_worker = error.where == "worker"
        message = error.message
        if in_worker and self.world > 1:
            wlog = self._rank_log(rank)
            frames = WORKER_MAIN + worker_frames(phase)
            if phase == "profile":
                frames = make_frames(
                    (
                        "v1/executor/multiproc_executor.py",
                        833,
                        "worker_busy_loop",
                        "output = func(*args, **kwargs)",
                    )
                ) + worker_frames(phase)
                wlog.error("multiproc_executor.py:838", "WorkerProc hit an exception.")
            else:
                wlog.error("multiproc_executor.py:772", "WorkerProc failed to start.")
            wlog.traceback(frames, error.exc_type, message, where="multiproc_executor.py:772")
            if phase == "profile":
                engine_frames = CORE_PROFILE_FRAMES + MP_RPC_FRAMES
                exc_type = "RuntimeError"
                first = message.split("\n")[0]
                message = (
                    f"Worker failed with error '{first}', please check the stack trace above "
                    "for the root cause"
                )
            else:
                engine_frames = CORE_FRAMES + MP_WAIT_FRAMES
                exc_type = "Exception"
                message = (
                    "WorkerProc initialization failed due to an exception in a background "
                    "process. See stack trace for root cause."
                )
        else:
            exc_type = error.exc_type
            if phase in ("kv", "profile"):
                engine_frames = CORE_KV_FRAMES if phase == "kv" else CORE_PROFILE_FRAMES
                if phase == "profile":
                    engine_frames = (
                        engine_frames
                        + make_frames(
                            (
                                "v1/executor/uniproc_executor.py",
                                73,
                                "collective_rpc",
                                "answer = run_method(self.driver_worker, method, args, kwargs)",
                            )
                        )
                        + worker_frames(phase)
                    )
            elif in_worker:
                call = "init_device" if phase == "init_device" else "load_model"
                engine_frames = (
                    CORE_FRAMES
                    + make_frames(
                        (
                            "v1/executor/uniproc_executor.py",
                            48,
                            "_init_executor",
                            f"self.driver_worker.{call}()",
                        )
                    )
                    + [f for f in worker_frames(phase) if "multiproc_executor" not in f[0]]
                )
            else:
                engine_frames = CORE_FRAMES
        self.log.error("core.py:866", "EngineCore failed to start.")
        self.log.traceback(engine_frames, exc_type, message, where="core.py:866")
        self._shutdown(1)

    # Phases.

    def _pace(self, phase: str, share: float = 1.0) -> None:
        time.sleep(self.seconds * PHASES[phase] * share)

    def _rank_log(self, rank: int) -> Log:
        if self.ray is not None and self.ray_ranks:
            info = self.ray_ranks[rank]
            return RayActorLog(int(info["pid"]), str(info["ip"]))
        if self.world == 1:
            return self.log
        return Log(worker_label(rank, self.tp, self.pp), self.pids[rank])

    def _start_workers(self) -> None:
        spec = self.spec
        if self.world == 1:
            return
        self.shm.append(ShmFile.ring_buffer(readers=self.world))
        for rank in range(self.world):
            label = worker_label(rank, self.tp, self.pp)
            child = spawn(
                f"VLLM::{label}",
                spec["python"],
                spec["pythonpath"],
                "_simengine.worker_main",
                {"title": f"VLLM::{label}", "label": label, "sim_dir": spec["sim_dir"]},
            )
            self.workers.append(child)
            self.pids.append(child.pid)
        port = 40000 + os.getpid() % 20000
        for rank, pid in enumerate(self.pids):
            Log("Worker", pid).info(
                "parallel_state.py:1208",
                f"world_size={self.world} rank={rank} local_rank={rank} "
                f"distributed_init_method=tcp://127.0.0.1:{port} backend=nccl",
            )
        Log("Worker", self.pids[0]).info("pynccl.py:111", "vLLM is using nccl==2.27.5")
        if _capability(self.ranks[0]) == (12, 0):
            for pid in self.pids:
                Log("Worker", pid).warning(
                    "symm_mem.py:66",
                    "SymmMemCommunicator: Device capability 12.0 not supported, communicator "
                    "is not available.",
                )
        pcie = any(
            link in ("PIX", "PXB", "PHB", "NODE", "SYS") for link in self.ranks[0].get("links", [])
        )
        if self.world > 2 and pcie and not spec.get("disable_custom_all_reduce"):
            for pid in self.pids:
                Log("Worker", pid).warning(
                    "custom_all_reduce.py:144",
                    "Custom allreduce is disabled because it's not supported on more than two "
                    "PCIe-only GPUs. To silence this warning, specify "
                    "disable_custom_all_reduce=True explicitly.",
                )
        for rank, pid in enumerate(self.pids):
            tp_rank = rank % self.tp
            Log("Worker", pid).info(
                "parallel_state.py:1394",
                f"rank {rank} in world size {self.world} is assigned as DP rank 0, "
                f"PP rank {rank // self.tp}, TP rank {tp_rank}, EP rank {tp_rank}",
            )

    # The Ray executor (opsbook/rehearsal/sim/vllm/v1/executor/ray_utils.py).

    def _start_ray_workers(self, local_gpus: int) -> None:
        from .v1.executor.ray_utils import PlacementGroupTimeout, RayExecutor

        if self.world > local_gpus:
            # vLLM 0.15.1 vllm/v1/executor/ray_utils.py initialize_ray_cluster.
            self.log.warning(
                "ray_utils.py:337",
                f"Tensor parallel size ({self.world}) exceeds available GPUs ({local_gpus}). "
                "This may result in Ray placement group allocation failures. Consider reducing "
                f"tensor_parallel_size to {local_gpus} or less, or ensure your Ray cluster has "
                f"{self.world} GPUs available.",
            )
        self.ray = RayExecutor(self.world, str(self.spec["version"]), self.log)
        try:
            self.ray_ranks = self.ray.start()
        except PlacementGroupTimeout as timeout:
            raise model.SimError("ValueError", str(timeout), "engine") from None
        self.ranks = [dict(info["gpu"]) for info in self.ray_ranks]
        self.pids = [int(info["pid"]) for info in self.ray_ranks]
        port = 40000 + os.getpid() % 20000
        head_ip = str(self.ray_ranks[0]["ip"])
        for rank, info in enumerate(self.ray_ranks):
            RayActorLog(int(info["pid"]), str(info["ip"])).info(
                "parallel_state.py:1208",
                f"world_size={self.world} rank={rank} local_rank={rank % self.tp} "
                f"distributed_init_method=tcp://{head_ip}:{port} backend=nccl",
            )
        for rank, info in enumerate(self.ray_ranks):
            tp_rank = rank % self.tp
            RayActorLog(int(info["pid"]), str(info["ip"])).info(
                "parallel_state.py:1394",
                f"rank {rank} in world size {self.world} is assigned as DP rank 0, "
                f"PP rank {rank // self.tp}, TP rank {tp_rank}, EP rank {tp_rank}",
            )

    def _free_mib(self, rank: int, gpu: dict[str, Any]) -> int:
        if self.ray is not None and self.ray_ranks:
            return max(0, int(self.ray_ranks[rank]["free_mib"] or 0))
        return free_mib(self.spec["sim_dir"], gpu)

    def _wait_loading(self, seconds: float) -> None:
        """Pace the weight loading; on Ray, a rank whose node dies ends it with Ray's error."""
        if self.ray is None or not self.load_refs:
            time.sleep(seconds)
            return
        started = time.monotonic()
        self.ray.wait(self.load_refs, seconds)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))

    def _idle_on_ray(self) -> None:
        """Serve until stopped, checking the ranks as vLLM's executor health check does."""
        while not self.stopping:
            time.sleep(1.0)
            try:
                self.ray.check_health(timeout=5.0)
            except Exception as error:
                if self.stopping:
                    return
                failure = self._ray_error(error)
                self.log.error("core.py:1", "EngineCore encountered a fatal error.")
                self.log.traceback(CORE_FRAMES, failure.exc_type, failure.message, "core.py:1")
                self._shutdown(1)

    def _ray_error(self, error: BaseException) -> model.SimError:
        from .v1.executor.ray_utils import error_name

        return model.SimError(error_name(error), str(error), "engine")

    def _holder(self, rank: int) -> tuple[int, str]:
        if self.world == 1:
            return os.getpid(), "VLLM::EngineCore"
        return self.pids[rank], f"VLLM::{worker_label(rank, self.tp, self.pp)}"

    def _register_all(self, mib: int) -> None:
        if self.ray is not None:
            self.ray.hold_all(mib)
            return
        for rank, gpu in enumerate(self.ranks):
            pid, name = self._holder(rank)
            register(self.spec["sim_dir"], pid, name, int(gpu["index"]), mib)

    def _check_free_memory(self) -> None:
        util = float(self.spec["util"])
        for rank, gpu in enumerate(self.ranks):
            total = int(gpu["memory_total_mib"])
            free = self._free_mib(rank, gpu)
            wanted = util * total
            if free < wanted:
                error = model.SimError(
                    "ValueError",
                    f"Free memory on device cuda:{rank} ({free / 1024:.2f}/{total / 1024:.2f} GiB) "
                    f"on startup is less than desired GPU memory utilization ({util}, "
                    f"{wanted / 1024:.2f} GiB). Decrease GPU memory utilization or reduce GPU "
                    "memory used by other processes.",
                    "worker",
                )
                error.rank = rank
                error.phase = "init_device"
                raise error
        self._register_all(CONTEXT_MIB)

    def _select_backend(self, capability: tuple[int, int], kv_dtype: str) -> str:
        spec = self.spec
        release = _simrelease.load(spec["version"])
        try:
            backend, valid, selected = model.select_backend(
                self.config, capability, kv_dtype, release, spec.get("attention_backend")
            )
        except model.SimError as error:
            error.phase = "select"
            raise
        if selected:
            self._rank_log(0).info(
                release.cuda_line("selected"), f"Using {release.backend_name(backend)} backend."
            )
        else:
            self._rank_log(0).info(
                release.cuda_line("chosen"),
                f"Using {backend} attention backend out of potential backends: "
                f"{release.candidates_text(valid)}",
            )
        impl_error = model.backend_init_error(backend, kv_dtype, release)
        if impl_error is not None:
            impl_error.phase = "impl"
            raise impl_error
        return backend

    def _weights_per_gpu(self) -> float:
        shards, _ = model.listed_shards(Path(self.spec["model_dir"]))
        return model.weights_bytes(Path(self.spec["model_dir"]), shards) / self.world

    def _load_weights(self) -> float:
        """Walk the shards like the safetensors iterator; fail on the first incomplete one."""
        model_dir = Path(self.spec["model_dir"])
        shards, tensors = model.listed_shards(model_dir)
        self._check_weights_fit()
        present = [
            name
            for name in shards
            if (model_dir / name).exists() or (model_dir / name).is_symlink()
        ]
        missing = [name for name in shards if name not in present]
        log = self._rank_log(0)
        total = len(present)
        started = time.monotonic()
        self._progress(log, 0, total, started)
        step = self.seconds * PHASES["load"] / max(total, 1)
        if self.ray is not None:
            self.load_refs = self.ray.start_load(step * total)
        for done, name in enumerate(present, start=1):
            if self.spec.get("fault") == "hang" and done > max(1, total // 2):
                self._hang()
            path = model_dir / name
            if not path.exists():
                error = model.SimError(
                    "FileNotFoundError", f"[Errno 2] No such file or directory: '{path}'", "worker"
                )
                error.phase = "weights"
                raise error
            problem = model.shard_error(path)
            if problem is not None:
                error = model.SimError(
                    "safetensors_rust.SafetensorError",
                    f"Error while deserializing header: {problem}",
                    "worker",
                )
                error.phase = "weights"
                raise error
            self._wait_loading(step)
            self._progress(log, done, total, started)
        self._progress(log, total, total, started)
        log.line("")
        if missing:
            names = sorted(t for name in missing for t in tensors.get(name, []))
            shown = ", ".join(f"'{n}'" for n in names)
            error = model.SimError(
                "ValueError",
                f"Following weights were not initialized from checkpoint: {{{shown}}}",
                "worker",
            )
            error.phase = "missing"
            raise error
        took = time.monotonic() - started
        log.info("default_loader.py:314", f"Loading weights took {took:.2f} seconds")
        self._register_all(CONTEXT_MIB + int(self._weights_per_gpu() / MIB))
        return took

    def _check_weights_fit(self) -> None:
        weights = self._weights_per_gpu()
        for rank, gpu in enumerate(self.ranks):
            total = int(gpu["memory_total_mib"])
            free = self._free_mib(rank, gpu) * MIB
            if weights + NCCL_GIB * GIB > free:
                in_use = (total * MIB - free) / GIB
                error = model.SimError(
                    "torch.OutOfMemoryError",
                    f"CUDA out of memory. Tried to allocate 1.75 GiB. GPU {rank} has a total "
                    f"capacity of {total / 1024:.2f} GiB of which "
                    f"{min(free / MIB, 768.0):.2f} MiB is "
                    f"free. Including non-PyTorch memory, this process has {in_use:.2f} GiB "
                    f"memory in use. Of the allocated memory {max(in_use - 0.75, 0):.2f} GiB is "
                    "allocated by PyTorch, and 150.52 MiB is reserved by PyTorch but unallocated. "
                    + OOM_TAIL,
                    "worker",
                )
                error.rank = rank
                error.phase = "oom-load"
                raise error

    def _progress(self, log: Log, done: int, total: int, started: float) -> None:
        elapsed = time.monotonic() - started
        percent = int(100 * done / total) if total else 100
        if done == 0 or elapsed <= 0:
            timing = "00:00<?, ?it/s"
        else:
            rate = done / elapsed
            left = (total - done) / rate if rate else 0
            speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
            timing = f"{_clock(elapsed)}<{_clock(left)}, {speed}"
        log.line(
            f"Loading safetensors checkpoint shards: {percent:3d}% Completed | "
            f"{done}/{total} [{timing}]",
            sys.stderr,
        )

    def _hang(self) -> None:
        """The hang fault: nothing more is logged; the processes stay and the port stays shut."""
        while True:
            time.sleep(1)

    def _compile(self) -> None:
        if self.spec.get("enforce_eager"):
            return
        log = self._rank_log(0)
        digest = hashlib.sha256(self.spec["model_dir"].encode()).hexdigest()[:10]
        cache = Path.home() / ".cache" / "vllm" / "torch_compile_cache" / digest
        log.info(
            "backends.py:631",
            f"Using cache directory: {cache}/rank_0_0/backbone for vLLM's torch.compile",
        )
        share = self.seconds * PHASES["compile"]
        self._pace("compile", 0.3)
        log.info("backends.py:647", f"Dynamo bytecode transform time: {share * 0.3 + 3.1:.2f} s")
        self._pace("compile", 0.7)
        log.info(
            "backends.py:282",
            f"Compiling a graph for dynamic shape takes {share * 0.7 + 9.4:.2f} s",
        )
        log.info("monitor.py:34", f"torch.compile takes {share + 12.5:.2f} s in total")

    def _profile_and_size_kv(self, kv_dtype: str) -> int:
        spec = self.spec
        self._pace("profile", 0.5)
        gpu = self.ranks[0]
        total_mib = int(gpu["memory_total_mib"])
        util = float(spec["util"])
        if spec.get("fault") == "oom":
            error = model.SimError(
                "torch.OutOfMemoryError",
                f"CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of "
                f"{total_mib / 1024:.2f} GiB of which 1.12 GiB is free. Including non-PyTorch "
                f"memory, this process has {total_mib / 1024 - 1.12 - 0.62:.2f} GiB memory in use. "
                f"Of the allocated memory {total_mib / 1024 - 3.1:.2f} GiB is allocated by "
                "PyTorch, and 412.39 MiB is reserved by PyTorch but unallocated. " + OOM_TAIL,
                "worker",
            )
            error.phase = "profile"
            raise error
        if spec.get("fault") == "nccl-timeout" and self.world > 1:
            raise self._nccl_timeout()
        requested = util * total_mib * MIB
        overhead = ACTIVATION_GIB * GIB + (NCCL_GIB * GIB if self.world > 1 else 0.3 * GIB)
        if not spec.get("enforce_eager"):
            overhead += GRAPH_GIB * GIB
        available = requested - self._weights_per_gpu() - overhead
        self._rank_log(0).info(
            "gpu_worker.py:359", f"Available KV cache memory: {available / GIB:.2f} GiB"
        )
        if available <= 0:
            raise _kv_error(
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
        per_token = model.kv_bytes_per_token(self.config, kv_dtype, self.tp)
        tokens = int(available // per_token) // 16 * 16
        max_len = int(spec["max_model_len"])
        if tokens < max_len:
            needed = max_len * per_token / GIB
            raise _kv_error(
                f"To serve at least one request with the model's max seq len ({max_len}), "
                f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV "
                f"cache memory ({available / GIB:.2f} GiB). Based on the available memory, the "
                f"estimated maximum model length is {tokens}. Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
                "engine."
            )
        self.log.info(
            "kv_cache_utils.py:1229", f"GPU KV cache size: {model.fmt_tokens(tokens)} tokens"
        )
        self.log.info(
            "kv_cache_utils.py:1234",
            f"Maximum concurrency for {model.fmt_tokens(max_len)} tokens per request: "
            f"{tokens / max_len:.2f}x",
        )
        self._register_all(int(util * total_mib))
        self._pace("profile", 0.5)
        return tokens

    def _nccl_timeout(self) -> model.SimError:
        """The nccl-timeout fault: the first rank of the last pipeline stage (on a cluster, a
        rank of another node) stalls in the profile run's all-reduce and its NCCL watchdog
        fires. The line is PyTorch's (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
        WorkNCCL::checkTimeout) with the default 600000 ms timeout; the wait is shortened."""
        rank = self.tp * (self.pp - 1) if self.pp > 1 else 1
        self._pace("profile", 0.5)
        message = (
            f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, "
            "OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for "
            "600011 milliseconds before timing out."
        )
        now = time.strftime("%m%d %H:%M:%S")
        self._rank_log(rank).line(
            f"[rank{rank}]:[E{now}.000000000 ProcessGroupNCCL.cpp:632] {message}"
        )
        return model.SimError("RuntimeError", message, "engine")

    def _capture_graphs(self) -> None:
        if self.spec.get("enforce_eager"):
            return
        log = self._rank_log(0)
        sizes = min(67, max(1, int(self.spec.get("max_num_seqs") or 256) // 8 + 3))
        started = time.monotonic()
        for label, count, share in (
            ("mixed prefill-decode, PIECEWISE", sizes, 0.6),
            ("decode, FULL", 35, 0.4),
        ):
            self._pace("graphs", share)
            elapsed = time.monotonic() - started
            rate = count / max(elapsed, 1e-3)
            log.line(
                f"Capturing CUDA graphs ({label}): 100%|██████████| {count}/{count} "
                f"[{_clock(elapsed)}<00:00, {rate:5.2f}it/s]",
                sys.stderr,
            )
        took = max(1, round(time.monotonic() - started))
        log.info(
            "gpu_model_runner.py:4244",
            f"Graph capturing finished in {took} secs, took {GRAPH_GIB:.2f} GiB",
        )

    def _engine_config_line(self) -> str:
        spec = self.spec
        model_name = spec["model"]
        served = spec["served"][0] if spec["served"] else model_name
        return (
            f"Initializing a V1 LLM engine (v{spec['version']}) with config: model='{model_name}', "
            f"speculative_config=None, tokenizer='{model_name}', skip_tokenizer_init=False, "
            "tokenizer_mode=auto, revision=None, tokenizer_revision=None, "
            f"trust_remote_code={bool(spec['trust_remote_code'])}, dtype=torch.bfloat16, "
            f"max_seq_len={spec['max_model_len']}, download_dir=None, load_format=auto, "
            f"tensor_parallel_size={self.tp}, pipeline_parallel_size={self.pp}, "
            "data_parallel_size=1, "
            f"disable_custom_all_reduce={bool(spec.get('disable_custom_all_reduce'))}, "
            f"quantization={spec['quantization']}, "
            f"enforce_eager={bool(spec.get('enforce_eager'))}, "
            f"kv_cache_dtype={spec['kv_cache_dtype']}, device_config=cuda, "
            "structured_outputs_config=StructuredOutputsConfig(backend='auto', "
            "disable_fallback=False, disable_any_whitespace=False, "
            "disable_additional_properties=False, "
            f"reasoning_parser='{spec.get('reasoning_parser') or ''}', "
            "reasoning_parser_plugin='', enable_in_reasoning=False), "
            "observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, "
            "otlp_traces_endpoint=None, collect_detailed_traces=None), seed=0, "
            f"served_model_name={served}, enable_prefix_caching=True, enable_chunked_prefill=True, "
            "pooler_config=None, compilation_config={'level': None, 'mode': 3, "
            "'debug_dump_path': None, 'cache_dir': '', 'backend': 'inductor', 'custom_ops': "
            "['none'], 'splitting_ops': ['vllm::unified_attention', "
            "'vllm::unified_attention_with_output', 'vllm::unified_mla_attention', "
            "'vllm::unified_mla_attention_with_output'], 'use_inductor_graph_partition': False, "
            "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, "
            "'max_cudagraph_capture_size': 512, 'local_cache_dir': None}"
        )


class RayActorLog(Log):
    """A Ray actor's lines as the driver's log shows them: ``(RayWorkerWrapper pid=N, ip=A)``."""

    def __init__(self, pid: int, ip: str):
        super().__init__("RayWorkerWrapper", pid)
        self.ip = ip

    @property
    def prefix(self) -> str:
        return f"(RayWorkerWrapper pid={self.pid}, ip={self.ip}) "


def _kv_error(message: str) -> model.SimError:
    error = model.SimError("ValueError", message, "engine")
    error.phase = "kv"
    return error


def _capability(gpu: dict[str, Any]) -> tuple[int, int]:
    major, _, minor = str(gpu.get("compute_cap", "12.0")).partition(".")
    return int(major), int(minor or 0)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"
