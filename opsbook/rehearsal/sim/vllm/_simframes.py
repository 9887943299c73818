"""The tracebacks of the simulated engine core and workers: the frames vLLM's own print, by
phase (source paths are vLLM 0.15.1's, see ``_simlog.source``).

Standard library only: copied into the rehearsal host's venv with the rest of this package.
"""

from __future__ import annotations

from ._simlog import Frame, source

OOM_TAIL = (
    "If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


def make_frames(*rows: tuple[str, int, str, str]) -> list[Frame]:
    return [(source(path), line, function, code) for path, line, function, code in rows]


CORE_FRAMES = make_frames(
    ("v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    ("v1/engine/core.py", 637, "__init__", "super().__init__("),
    ("v1/engine/core.py", 102, "__init__", "self.model_executor = executor_class(vllm_config)"),
    ("v1/executor/abstract.py", 101, "__init__", "self._init_executor()"),
)
CORE_KV_FRAMES = make_frames(
    ("v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    ("v1/engine/core.py", 637, "__init__", "super().__init__("),
    (
        "v1/engine/core.py",
        111,
        "__init__",
        "num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(",
    ),
    ("v1/engine/core.py", 224, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
    ("v1/core/kv_cache_utils.py", 1289, "get_kv_cache_configs", "check_enough_kv_cache_memory("),
    ("v1/core/kv_cache_utils.py", 688, "check_enough_kv_cache_memory", "raise ValueError("),
)
CORE_PROFILE_FRAMES = make_frames(
    ("v1/engine/core.py", 857, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    ("v1/engine/core.py", 637, "__init__", "super().__init__("),
    (
        "v1/engine/core.py",
        111,
        "__init__",
        "num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(",
    ),
    (
        "v1/engine/core.py",
        204,
        "_initialize_kv_caches",
        "available_gpu_memory = self.model_executor.determine_available_memory()",
    ),
    (
        "v1/executor/abstract.py",
        136,
        "determine_available_memory",
        'return self.collective_rpc("determine_available_memory")',
    ),
)
MP_WAIT_FRAMES = make_frames(
    (
        "v1/executor/multiproc_executor.py",
        172,
        "_init_executor",
        "self.workers = WorkerProc.wait_for_ready(unready_workers)",
    ),
    ("v1/executor/multiproc_executor.py", 660, "wait_for_ready", "raise e from None"),
)
MP_RPC_FRAMES = make_frames(
    (
        "v1/executor/multiproc_executor.py",
        289,
        "collective_rpc",
        "result = get_response(w, dequeue_timeout, self.shutdown_event)",
    ),
    ("v1/executor/multiproc_executor.py", 272, "get_response", "raise RuntimeError("),
)
WORKER_MAIN = make_frames(
    (
        "v1/executor/multiproc_executor.py",
        743,
        "worker_main",
        "worker = WorkerProc(*args, **kwargs)",
    ),
)
INIT_DEVICE_FRAMES = make_frames(
    ("v1/worker/worker_base.py", 326, "init_device", "self.worker.init_device()  # type: ignore"),
    (
        "v1/worker/gpu_worker.py",
        235,
        "init_device",
        "self.requested_memory = request_memory(init_snapshot, self.cache_config)",
    ),
    ("v1/worker/utils.py", 348, "request_memory", "raise ValueError("),
)
LOAD_FRAMES = make_frames(
    (
        "v1/worker/gpu_worker.py",
        273,
        "load_model",
        "self.model_runner.load_model(eep_scale_up=eep_scale_up)",
    ),
    ("v1/worker/gpu_model_runner.py", 3498, "load_model", "self.model = model_loader.load_model("),
)
INIT_MODEL_FRAMES = make_frames(
    ("model_executor/model_loader/base_loader.py", 49, "load_model", "model = initialize_model("),
    (
        "model_executor/model_loader/utils.py",
        48,
        "initialize_model",
        "return model_class(vllm_config=vllm_config, prefix=prefix)",
    ),
    ("model_executor/models/deepseek_v2.py", 1326, "__init__", "self.model = DeepseekV2Model("),
    ("model_executor/layers/mla.py", 112, "__init__", "self.mla_attn = MLAAttention("),
    ("attention/layer.py", 683, "__init__", "self.impl = impl_cls("),
)
SELECT_FRAMES = make_frames(
    ("attention/layer.py", 641, "__init__", "self.attn_backend = get_attn_backend("),
    ("attention/selector.py", 91, "get_attn_backend", "return _cached_get_attn_backend("),
    (
        "attention/selector.py",
        135,
        "_cached_get_attn_backend",
        "attention_cls = current_platform.get_attn_backend_cls(",
    ),
    ("platforms/cuda.py", 402, "get_attn_backend_cls", "raise ValueError("),
)
WEIGHT_FRAMES = make_frames(
    (
        "model_executor/model_loader/base_loader.py",
        55,
        "load_model",
        "self.load_weights(model, model_config)",
    ),
    (
        "model_executor/model_loader/default_loader.py",
        300,
        "load_weights",
        "loaded_weights = model.load_weights(self.get_all_weights(model_config, model))",
    ),
    (
        "model_executor/models/deepseek_v2.py",
        1507,
        "load_weights",
        "for name, loaded_weight in weights:",
    ),
    (
        "model_executor/model_loader/weight_utils.py",
        633,
        "safetensors_weights_iterator",
        'with safe_open(st_file, framework="pt") as f:',
    ),
)
MISSING_FRAMES = make_frames(
    (
        "model_executor/model_loader/base_loader.py",
        55,
        "load_model",
        "self.load_weights(model, model_config)",
    ),
    ("model_executor/model_loader/default_loader.py", 312, "load_weights", "raise ValueError("),
)
PROFILE_FRAMES = make_frames(
    (
        "v1/worker/gpu_worker.py",
        329,
        "determine_available_memory",
        "self.model_runner.profile_run()",
    ),
    (
        "v1/worker/gpu_model_runner.py",
        4127,
        "profile_run",
        "hidden_states, last_hidden_states = self._dummy_run(",
    ),
    ("v1/worker/gpu_model_runner.py", 3911, "_dummy_run", "outputs = self.model("),
)
OOM_LOAD_FRAMES = make_frames(
    ("model_executor/model_loader/base_loader.py", 49, "load_model", "model = initialize_model("),
    (
        "model_executor/layers/fused_moe/layer.py",
        1251,
        "__init__",
        "self.quant_method.create_weights(layer=self, **moe_quant_params)",
    ),
    ("model_executor/layers/quantization/modelopt.py", 1188, "create_weights", "torch.empty("),
)


def worker_frames(phase: str) -> list[Frame]:
    if phase == "init_device":
        return (
            make_frames(
                ("v1/executor/multiproc_executor.py", 562, "__init__", "self.worker.init_device()")
            )
            + INIT_DEVICE_FRAMES
        )
    if phase == "profile":
        return PROFILE_FRAMES
    load = (
        make_frames(
            ("v1/executor/multiproc_executor.py", 569, "__init__", "self.worker.load_model()")
        )
        + LOAD_FRAMES
    )
    if phase == "select":
        return (
            load
            + INIT_MODEL_FRAMES[:-1]
            + make_frames(
                ("attention/layer.py", 641, "__init__", "self.attn_backend = get_attn_backend(")
            )
            + SELECT_FRAMES[1:]
        )
    if phase == "impl":
        return (
            load
            + INIT_MODEL_FRAMES
            + make_frames(
                (
                    "v1/attention/backends/mla/triton_mla.py",
                    118,
                    "__init__",
                    "raise NotImplementedError(",
                )
            )
        )
    if phase == "weights":
        return load + WEIGHT_FRAMES
    if phase == "missing":
        return load + MISSING_FRAMES
    if phase == "oom-load":
        return load + OOM_LOAD_FRAMES
    return load
