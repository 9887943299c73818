"""Probe: the KV-cache dtypes the installed vLLM's MLA attention backends support.

Stdlib only; runs on the host's python3 and asks the deployment's interpreter, which imports
each backend class and reads its ``supported_kv_cache_dtypes``. This is the ground truth the
compatibility rules' version ranges only approximate. A real vLLM imports torch on the way,
so this takes seconds; backends that do not import on this vLLM are left out.
"""

import json
import subprocess

BACKENDS = {
    "TRITON_MLA": "vllm.v1.attention.backends.mla.triton_mla:TritonMLABackend",
    "FLASHMLA": "vllm.v1.attention.backends.mla.flashmla:FlashMLABackend",
    "FLASH_ATTN_MLA": "vllm.v1.attention.backends.mla.flashattn_mla:FlashAttnMLABackend",
    "FLASHINFER_MLA": "vllm.v1.attention.backends.mla.flashinfer_mla:FlashInferMLABackend",
    "CUTLASS_MLA": "vllm.v1.attention.backends.mla.cutlass_mla:CutlassMLABackend",
}

READER = """
import importlib, json, sys
found = {}
for name, target in json.loads(sys.argv[1]).items():
    module, _, cls = target.partition(":")
    try:
        backend = getattr(importlib.import_module(module), cls)
        found[name] = [str(d) for d in backend.supported_kv_cache_dtypes]
    except Exception:
        pass
print(json.dumps(found))
"""


def main(args):
    try:
        proc = subprocess.run(
            [args["python"], "-c", READER, json.dumps(BACKENDS)],
            capture_output=True,
            text=True,
            timeout=float(args.get("timeout", 180)),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"backends": None, "error": str(e)}
    if proc.returncode != 0:
        return {"backends": None, "error": proc.stderr.strip()[-500:]}
    try:
        return {"backends": json.loads(proc.stdout.strip().splitlines()[-1]), "error": None}
    except (ValueError, IndexError):
        return {"backends": None, "error": "no answer: " + proc.stdout[-200:]}
