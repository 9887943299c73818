"""The simulated vLLM API server (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``).

Order of events follows vLLM: parse and validate arguments, bind the port before the engine
starts, build the engine config from the model's files, start ``VLLM::EngineCore`` and wait
for it, then list the routes and serve HTTP (uvicorn's lines included).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import _simconfig, _simrelease
from . import _simmodel as model
from ._simcli import build_parser, non_default_args, normalise_flags
from ._simframes import make_frames
from ._simhttp import ROUTES, Handler, HTTPServer
from ._simlog import Frame, Log, source
from ._simprocs import ShmFile, is_alive, python_executable, spawn
from ._simserving import Reply, Serving

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
NEW_SERVER_LINE_SINCE = "0.16"
BANNER_SINCE = "0.18"
ENGINE_STOP_TIMEOUT = 5.0
# The engine core answers every HEARTBEAT_SECONDS (_simengine); silent this long, it is stopped
# or wedged and no token is produced until it answers again.
ENGINE_SILENT_SECONDS = 0.5
# How often a request waiting on a silent engine core looks again.
TOKEN_WAIT_SECONDS = 0.05
API_SHARE = 0.05
WORDS = (
    "The rehearsal server answers with a short and stable reply from the simulated model "
    "so every check can compare it"
).split()


# Command line.


# The server process.


class ApiServer:
    """One simulated API server process, from its first log line to its exit.

    Args:
        args: parsed flags.
        parser: the parser holding the server flags (for the defaults).
        settings: the simulation settings (version, startup seconds, fault).
        form: ``serve`` or ``api_server``.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        parser: argparse.ArgumentParser,
        settings: dict[str, Any],
        form: str,
    ):
        self.args = args
        self.parser = parser
        self.settings = settings
        self.form = form
        self.version = settings["version"]
        fault = settings["fault"]
        self.fault = fault if fault in _simconfig.FAULTS else None
        self.seconds = settings["startup_seconds"] * (10 if self.fault == "slow-start" else 1)
        self.log = Log("APIServer")
        self.t0 = time.time()
        self.sock: socket.socket | None = None
        self.sems: list[ShmFile] = []
        self.engine: Any = None
        self.ready = threading.Event()
        self.engine_gone = threading.Event()
        self.engine_seen = time.monotonic()
        self.ready_info: dict[str, Any] = {}
        self.serving = False
        self.stopping = False
        self.stats = {
            "requests": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "running": 0,
            "waiting": 0,
            "preemptions": 0,
        }
        self.model_name = ""
        self.served: list[str] = []
        self.max_model_len = 0
        self.lock = threading.Lock()
        self.replies = Serving(settings, tuple(WORDS), self._die)

    def run(self) -> int:
        if self.settings["fault"] and self.fault is None:
            self.log.warning(
                "opsbook_sim",
                f"Unknown simulated fault {self.settings['fault']!r} ignored; known: "
                f"{list(_simconfig.FAULTS)}",
            )
        self._install_signals()
        if self.fault == "die-after-1s":
            threading.Timer(1.0, self._die).start()
        self._announce()
        if self.fault == "plugin-error":
            self._plugin_failed()
        try:
            self._validate_args()
        except model.SimError as error:
            self._raise(error, self._entry_frames())
            return 1
        if not self._bind():
            return 1
        try:
            spec = self._engine_spec()
        except model.SimError as error:
            self._raise(error, self._config_frames())
            self._cleanup()
            return 1
        self.sems = [ShmFile.semaphore(), ShmFile.semaphore()]
        self._start_engine(spec)
        while not self.ready.is_set():
            if self.engine_gone.wait(0.1):
                break
        if not self.ready.is_set():
            if self.stopping:
                # A signal handler or the die-after-1s fault is ending the process.
                threading.Event().wait()
            return self._engine_failed()
        self._serve()
        return 0

    # Start-up.

    def _install_signals(self) -> None:
        if self.fault == "ignore-sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def _announce(self) -> None:
        log = self.log
        if _simconfig.at_least(self.version, BANNER_SINCE):
            model_name = self._model_arg()
            for text in (
                "",
                "       █     █     █▄   ▄█",
                f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {self.version}",
                f"  █▄█▀ █     █     █     █  model   {model_name}",
                "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
                "",
            ):
                log.info("utils.py:306", text)
        else:
            log.info("api_server.py:1977", f"vLLM API server version {self.version}")
        shown = non_default_args(self.args, self.parser)
        if self.form == "serve" and self.args.model_tag:
            shown["model"] = self.args.model_tag
        log.info("utils.py:253", f"non-default args: {shown}")
        if self.form == "serve" and self.args.model and self.args.model_tag is None:
            log.warning(
                "argparse_utils.py:203",
                "With `vllm serve`, you should provide the model as a positional argument or "
                "in a config file instead of via the `--model` option.",
            )

    def _plugin_failed(self) -> None:
        """The plugin-error fault: a vllm.general_plugins entry point whose module is missing.
        vLLM loads the general plugins as it builds the engine's arguments and logs the
        failure with its traceback, then goes on without the plugin (vLLM 0.32.0
        vllm/plugins/__init__.py load_plugins_by_group: logger.exception("Failed to load
        plugin %s", plugin.name)); the frames are those vLLM 0.32.0 printed, the plugin's
        name that of PaddlePaddle/PaddleOCR#16738."""
        lib = f"/usr/lib/python{sys.version_info[0]}.{sys.version_info[1]}"
        lines = [
            "Failed to load plugin register_paddlex_genai_models",
            "Traceback (most recent call last):",
            f'  File "{source("plugins/__init__.py")}", line 69, in load_plugins_by_group',
            "    func = plugin.load()",
            "           ^^^^^^^^^^^^^",
            f'  File "{lib}/importlib/metadata/__init__.py", line 202, in load',
            "    module = import_module(match.group('module'))",
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            f'  File "{lib}/importlib/__init__.py", line 126, in import_module',
            "    return _bootstrap._gcd_import(name[level:], package, level)",
            "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            '  File "<frozen importlib._bootstrap>", line 1206, in _gcd_import',
            '  File "<frozen importlib._bootstrap>", line 1178, in _find_and_load',
            '  File "<frozen importlib._bootstrap>", line 1142, in _find_and_load_unlocked',
            "ModuleNotFoundError: No module named 'paddlex_genai_plugin'",
        ]
        self.log.error("__init__.py:72", "\n".join(lines))

    def _model_arg(self) -> str:
        tag = getattr(self.args, "model_tag", None)
        return str(tag or self.args.model or DEFAULT_MODEL)

    def _validate_args(self) -> None:
        if self.args.enable_auto_tool_choice and not self.args.tool_call_parser:
            raise model.SimError(
                "TypeError", "Error: --enable-auto-tool-choice requires --tool-call-parser", "api"
            )

    def _display_host(self) -> str:
        return self.args.host or "0.0.0.0"

    def _bind(self) -> bool:
        """Bind the port before the engine starts, as vLLM does (listening comes later)."""
        # An unset --host binds loopback only: the rehearsal host must not listen outside.
        address = self.args.host or "127.0.0.1"
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, int(self.args.port)))
        except OSError as error:
            sock.close()
            text = (error.strerror or str(error)).lower()
            self.log.uvicorn(
                "ERROR",
                f"[Errno {error.errno}] error while attempting to bind on address "
                f"('{self._display_host()}', {self.args.port}): {text}",
            )
            return False
        self.sock = sock
        return True

    def _engine_spec(self) -> dict[str, Any]:
        """Build the engine config from the model's files, logging what vLLM logs."""
        args = self.args
        name = self._model_arg()
        model_dir = model.resolve_model_dir(name)
        if model_dir is None:
            raise model.invalid_model_error(name)
        config = model.load_model_config(model_dir)
        release = _simrelease.load(self.version)
        self._warn_unknown_env(release)
        if model.needs_remote_code(config) and not args.trust_remote_code:
            raise _validation_error("ModelConfig", model.remote_code_message(name), name)
        log = self.log
        log.info("model.py:631", f"Resolved architecture: {model.architecture(config)}")
        derived = model.derived_max_model_len(config)
        max_len = args.max_model_len or derived
        if max_len > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
            raise _validation_error(
                "ModelConfig",
                f"User-specified max_model_len ({max_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={derived} or model_max_length=None in "
                "model's config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used "
                "with extreme caution. If the model uses relative position encoding (RoPE), "
                "positions exceeding derived_max_model_len lead to nan. If the model uses "
                "absolute position encoding, positions exceeding derived_max_model_len will "
                "cause a CUDA array out-of-bounds error.",
                name,
            )
        log.info("model.py:1745", f"Using max model len {max_len}")
        quant = model.quant_config(model_dir, config)
        quantization = args.quantization or model.quantization_method(quant)
        warnings: list[str] = []
        kv_dtype = model.resolve_kv_cache_dtype(args.kv_cache_dtype, quant, self.version, warnings)
        for text in warnings:
            log.warning("torch_utils.py:331", text)
        if kv_dtype not in release.kv_cache_dtypes:
            raise _kv_dtype_error(kv_dtype, release.kv_cache_dtypes)
        if model.is_quantized_kv(kv_dtype):
            log.info(*release.fp8_kv_log(kv_dtype))
        backend = self._attention_backend(release)
        self._log_blackwell_default(release, config, backend)
        batched = args.max_num_batched_tokens or 8192
        log.info(
            "scheduler.py:216", f"Chunked prefill is enabled with max_num_batched_tokens={batched}."
        )
        if quant and quantization in ("modelopt_fp4", "modelopt"):
            algo = model.quant_algo(quant)
            kind = "NVFP4" if quantization == "modelopt_fp4" else "fp8"
            log.warning(
                "modelopt.py:1041",
                f"Detected ModelOpt {kind} checkpoint (quant_algo={algo}). Please note that the "
                "format is experimental and could change in future.",
            )
        heads = model.num_attention_heads(config)
        if heads % max(1, args.tensor_parallel_size):
            raise _validation_error(
                "ParallelConfig",
                f"Total number of attention heads ({heads}) must be divisible by tensor "
                f"parallel size ({args.tensor_parallel_size}).",
                name,
            )
        self.model_name = name
        self.served = list(args.served_model_name or [name])
        self.max_model_len = max_len
        return {
            "python": python_executable(),
            "pythonpath": str(Path(__file__).resolve().parent.parent),
            "sim_dir": str(_sim_dir()),
            "version": self.version,
            "fault": self.fault,
            "seconds": self.seconds,
            "t0": self.t0,
            "model": name,
            "model_dir": str(model_dir),
            "served": self.served,
            "tp": args.tensor_parallel_size,
            "pp": args.pipeline_parallel_size,
            "executor": args.distributed_executor_backend,
            "util": args.gpu_memory_utilization,
            "max_model_len": max_len,
            "kv_cache_dtype": kv_dtype,
            "quantization": quantization,
            "enforce_eager": args.enforce_eager,
            "attention_backend": backend,
            "disable_custom_all_reduce": args.disable_custom_all_reduce,
            "max_num_seqs": args.max_num_seqs,
            "trust_remote_code": args.trust_remote_code,
            "reasoning_parser": args.reasoning_parser,
        }

    def _attention_backend(self, release: _simrelease.Release) -> str | None:
        """--attention-backend, --attention-config.backend, or VLLM_ATTENTION_BACKEND where
        the release still reads it."""
        config = getattr(self.args, "attention_config", None)
        from_config = config.get("backend") if isinstance(config, dict) else None
        named = getattr(self.args, "attention_backend", None) or from_config
        if named or not release.reads_env("VLLM_ATTENTION_BACKEND"):
            return named
        return os.environ.get("VLLM_ATTENTION_BACKEND")

    def _warn_unknown_env(self, release: _simrelease.Release) -> None:
        """vLLM 0.32.0 vllm/platforms/interface.py validate_environ's warning, from 0.31.0."""
        if not release.warns_unknown_env:
            return
        for name in sorted(os.environ):
            if name.startswith("VLLM_") and not release.reads_env(name):
                self.log.warning(
                    "interface.py:1458", f"Unknown vLLM environment variable detected: {name}"
                )

    def _log_blackwell_default(
        self, release: _simrelease.Release, config: dict[str, Any], backend: str | None
    ) -> None:
        """0.13-0.17 choose FLASHINFER_MLA for MLA on SM10x while building the config."""
        gpus = _sim_gpus()
        if backend or not gpus or not model.uses_mla(config):
            return
        major, _, minor = str(gpus[0].get("compute_cap", "0.0")).partition(".")
        nope = int(model.text_config(config).get("qk_nope_head_dim") or 0)
        sparse = model.uses_sparse(config)
        if release.blackwell_default((int(major), int(minor or 0)), nope, sparse):
            self.log.info(
                release.cuda_line("forcing"),
                "Forcing kv cache block size to 64 for FlashInferMLA backend.",
            )

    def _start_engine(self, spec: dict[str, Any]) -> None:
        time.sleep(self.seconds * API_SHARE)
        read_end, write_end = os.pipe()
        spec["status_fd"] = write_end
        self.engine = spawn(
            "VLLM::EngineCore",
            spec["python"],
            spec["pythonpath"],
            "_simengine.engine_main",
            spec,
            pass_fds=(write_end,),
        )
        os.close(write_end)
        threading.Thread(target=self._watch_engine, args=(read_end,), daemon=True).start()

    def _watch_engine(self, read_end: int) -> None:
        with os.fdopen(read_end, "rb") as stream:
            for raw in stream:
                try:
                    info = json.loads(raw)
                except ValueError:
                    continue
                self.engine_seen = time.monotonic()
                if info.get("status") == "ready":
                    self.ready_info = info
                    self.ready.set()
        self.engine_gone.set()
        if self.ready.is_set() and not self.stopping:
            self._engine_died()

    def _engine_died(self) -> None:
        self.log.error(
            "core_client.py:564",
            "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        )
        self.log.error(
            "async_llm.py:480",
            "AsyncLLM output_handler failed.\n"
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See "
            "stack trace (above) for the root cause.",
        )

    def _engine_failed(self) -> int:
        code = 1
        try:
            code = self.engine.wait(10)
        except Exception:
            code = 1
        frames = (
            self._config_frames()[:-4]
            + make_frames(
                (
                    "entrypoints/openai/api_server.py",
                    233,
                    "build_async_engine_client_from_engine_args",
                    "async_llm = AsyncLLM.from_vllm_config(",
                ),
                ("v1/engine/async_llm.py", 223, "from_vllm_config", "return cls("),
                (
                    "v1/engine/async_llm.py",
                    134,
                    "__init__",
                    "self.engine_core = EngineCoreClient.make_async_mp_client(",
                ),
                (
                    "v1/engine/core_client.py",
                    121,
                    "make_async_mp_client",
                    "return AsyncMPClient(*client_args)",
                ),
                ("v1/engine/core_client.py", 807, "__init__", "super().__init__("),
                (
                    "v1/engine/core_client.py",
                    468,
                    "__init__",
                    "with launch_core_engines(vllm_config, executor_class, log_stats) as (",
                ),
            )
            + [
                (
                    str(Path(os.__file__).with_name("contextlib.py")),
                    144,
                    "__exit__",
                    "next(self.gen)",
                ),
            ]
            + make_frames(
                ("v1/engine/utils.py", 880, "launch_core_engines", "wait_for_engine_startup("),
                ("v1/engine/utils.py", 937, "wait_for_engine_startup", "raise RuntimeError("),
            )
        )
        self.log.traceback(
            frames,
            "RuntimeError",
            "Engine core initialization failed. See root cause above. Failed core proc(s): "
            f"{{'EngineCore_DP0': {code if code and code > 0 else 1}}}",
        )
        self._cleanup()
        return 1

    # Serving.

    def _serve(self) -> None:
        time.sleep(self.seconds * API_SHARE)
        log = self.log
        log.info("api_server.py:1725", "Supported tasks: ['generate']")
        if self.args.enable_auto_tool_choice:
            log.info("serving_chat.py:139", '"auto" tool choice has been enabled.')
        address = f"http://{self._display_host()}:{self.args.port}"
        if _simconfig.at_least(self.version, NEW_SERVER_LINE_SINCE):
            log.info("api_server.py:603", f"Starting vLLM server on {address}")
        else:
            log.info("api_server.py:2052", f"Starting vLLM API server 0 on {address}")
        log.info("launcher.py:38", "Available routes are:")
        for path, methods in ROUTES:
            log.info("launcher.py:46", f"Route: {path}, Methods: {methods}")
        assert self.sock is not None
        server = HTTPServer(self.sock, Handler, self)
        log.uvicorn("INFO", f"Started server process [{os.getpid()}]")
        log.uvicorn("INFO", "Waiting for application startup.")
        log.uvicorn("INFO", "Application startup complete.")
        self.serving = True
        server.serve_forever(poll_interval=0.2)

    # Stopping.

    def _on_term(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.stopping = True
        if self.serving:
            self.log.uvicorn("INFO", "Shutting down")
            self.log.uvicorn("INFO", "Waiting for application shutdown.")
            self.log.uvicorn("INFO", "Application shutdown complete.")
            self.log.uvicorn("INFO", f"Finished server process [{os.getpid()}]")
        self._cleanup()
        os._exit(0)

    def _die(self) -> None:
        """The die-after-1s fault: the engine core goes away and the server follows it."""
        self.stopping = True
        self._engine_died()
        self._cleanup()
        os._exit(1)

    def _cleanup(self) -> None:
        engine = self.engine
        if engine is not None and engine.poll() is None:
            try:
                os.kill(engine.pid, signal.SIGTERM)
                engine.wait(ENGINE_STOP_TIMEOUT)
            except Exception:
                if is_alive(engine.pid):
                    os.kill(engine.pid, signal.SIGKILL)
        for sem in self.sems:
            sem.unlink()
        if self.sock is not None:
            self.sock.close()

    # Tracebacks.

    def _raise(self, error: model.SimError, frames: list[Frame]) -> None:
        self.log.traceback(frames, error.exc_type, error.message)

    def _entry_frames(self) -> list[Frame]:
        if self.form == "serve":
            script = str(Path(sys.prefix) / "bin" / "vllm")
            return [(script, 10, "<module>", "sys.exit(main())")] + make_frames(
                ("entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
                ("entrypoints/cli/serve.py", 59, "cmd", "validate_parsed_serve_args(args)"),
                ("entrypoints/utils.py", 259, "validate_parsed_serve_args", "raise TypeError("),
            )
        return make_frames(
            (
                "entrypoints/openai/api_server.py",
                2087,
                "<module>",
                "validate_parsed_serve_args(args)",
            ),
            ("entrypoints/utils.py", 259, "validate_parsed_serve_args", "raise TypeError("),
        )

    def _config_frames(self) -> list[Frame]:
        if self.form == "serve":
            head = [(str(Path(sys.prefix) / "bin" / "vllm"), 10, "<module>", "sys.exit(main())")]
            head += make_frames(
                ("entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
                ("entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
            )
        else:
            head = make_frames(
                (
                    "entrypoints/openai/api_server.py",
                    2087,
                    "<module>",
                    "uvloop.run(run_server(args))",
                ),
            )
        return (
            head
            + make_frames(
                (
                    "entrypoints/openai/api_server.py",
                    1941,
                    "run_server",
                    "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
                ),
                (
                    "entrypoints/openai/api_server.py",
                    1961,
                    "run_server_worker",
                    "async with build_async_engine_client(",
                ),
                (
                    "entrypoints/openai/api_server.py",
                    179,
                    "build_async_engine_client",
                    "async with build_async_engine_client_from_engine_args(",
                ),
                (
                    "entrypoints/openai/api_server.py",
                    205,
                    "build_async_engine_client_from_engine_args",
                    "vllm_config = engine_args.create_engine_config(usage_context=usage_context)",
                ),
                (
                    "engine/arg_utils.py",
                    1367,
                    "create_engine_config",
                    "model_config = self.create_model_config()",
                ),
                ("engine/arg_utils.py", 1224, "create_model_config", "return ModelConfig("),
            )
            + [
                (
                    str(Path(sys.prefix) / "lib" / "pydantic" / "_internal" / "_dataclasses.py"),
                    121,
                    "__init__",
                    "s.__pydantic_validator__.validate_python("
                    "ArgsKwargs(args, kwargs), self_instance=s)",
                ),
            ]
        )

    # HTTP answers.

    def answer(self, prompt: str, max_tokens: int, ignore_eos: bool = False) -> Reply:
        """A deterministic reply (``_simserving``), counted in the server's counters."""
        with self.lock:
            in_flight = self.stats["running"]
        reply = self.replies.reply(prompt, max_tokens, ignore_eos, in_flight, self._token_made)
        with self.lock:
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += reply.prompt_tokens
        return reply

    def _token_made(self) -> None:
        """One token of a reply, as it is paced: made only while the engine core answers (a
        SIGSTOPped engine core stalls every reply, /health still 200), then counted."""
        while not self.engine_responsive():
            time.sleep(TOKEN_WAIT_SECONDS)
        with self.lock:
            self.stats["generation_tokens"] += 1

    def engine_responsive(self) -> bool:
        """Whether the engine core answered lately: the one check the serving path makes
        before each token (a SIGSTOPped engine core or the engine-hang fault: no)."""
        return time.monotonic() - self.engine_seen < ENGINE_SILENT_SECONDS

    @contextlib.contextmanager
    def request_in_flight(self) -> Iterator[None]:
        """One request in flight: counted in ``vllm:num_requests_running`` until answered."""
        with self.lock:
            self.stats["running"] += 1
        try:
            yield
        finally:
            with self.lock:
                self.stats["running"] -= 1

    def metrics(self) -> str:
        """``/metrics`` with the names of the release played (its facts sheet)."""
        names = _simrelease.load(self.version).metric_names
        labels = f'engine="0",model_name="{self.served[0]}"'
        with self.lock:
            stats = dict(self.stats)
        values = {
            "running": ("gauge", stats["running"]),
            "waiting": ("gauge", stats["waiting"]),
            "kv_cache_usage": ("gauge", 0.0),
            "prompt_tokens": ("counter", stats["prompt_tokens"]),
            "generation_tokens": ("counter", stats["generation_tokens"]),
            "preemptions": ("counter", stats["preemptions"]),
            "requests_succeeded": ("counter", stats["requests"]),
        }
        lines = []
        for role, (kind, value) in values.items():
            sample = names[role]
            lines.append(f"# TYPE {sample.removesuffix('_total')} {kind}")
            lines.append(f"{sample}{{{labels}}} {float(value)}")
        return "\n".join(lines) + "\n"

    def models(self) -> dict[str, Any]:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": self.model_name,
                    "parent": None,
                    "max_model_len": self.max_model_len,
                    "permission": [
                        {
                            "id": "modelperm-" + hashlib.md5(name.encode()).hexdigest(),
                            "object": "model_permission",
                            "created": created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
                for name in self.served
            ],
        }


def _validation_error(config: str, message: str, model_name: str) -> model.SimError:
    """The pydantic wrapper newer vLLM puts around config errors."""
    return model.SimError(
        "pydantic_core._pydantic_core.ValidationError",
        f"1 validation error for {config}\n  Value error, {message} [type=value_error, "
        f"input_value=ArgsKwargs((), {{'model': '{model_name}', ...}}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.11/v/value_error",
        "api",
    )


def _kv_dtype_error(kv_dtype: str, known: list[str]) -> model.SimError:
    """CacheConfig's refusal of an unknown KV dtype after the model config loaded (0.33.0+;
    vllm/config/cache.py _validate_cache_dtype under pydantic)."""
    return model.SimError(
        "pydantic_core._pydantic_core.ValidationError",
        "1 validation error for CacheConfig\ncache_dtype\n  Value error, Invalid kv_cache_dtype: "
        f"{kv_dtype!r}. Valid values are: {known} [type=value_error, input_value={kv_dtype!r}, "
        "input_type=str]\n    For further information visit "
        "https://errors.pydantic.dev/2.12/v/value_error",
        "api",
    )


def _sim_gpus() -> list[dict[str, Any]]:
    from . import _simgpu

    try:
        return list(_simgpu.load_gpus(_simgpu.sim_dir()))
    except (OSError, ValueError, KeyError):
        return []


def _sim_dir() -> Path:
    from . import _simgpu

    return Path(_simgpu.sim_dir())


def main(argv: list[str], form: str) -> int:
    """Run the simulated server.

    Args:
        argv: the arguments after ``vllm`` (serve form, subcommand first) or after the module.
        form: ``serve`` or ``api_server``.

    Returns:
        The process exit code (argparse errors exit 2 by themselves).
    """
    settings = _simconfig.load()
    parser, server_parser = build_parser(form, settings["version"])
    args = parser.parse_args(normalise_flags(argv))
    if form == "serve" and args.subparser != "serve":
        if args.subparser is None:
            parser.print_help()
            return 0
        print(f"vllm {args.subparser}: not available on the rehearsal host", file=sys.stderr)
        return 1
    return ApiServer(args, server_parser, settings, form).run()
