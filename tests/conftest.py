"""What every test shares: a run free of the developer's ``OPSBOOK_*`` settings, and the vLLM
facts tool of the repository loaded as a module (both tiers test it)."""

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

# Settings of the test run itself, not of what is tested: where the real-vLLM and Ray tiers
# are installed (`make real-vllm` puts them there before pytest starts), which real vLLM the
# probes are checked against, where the real-vLLM tests keep their logs, and which MLA backend
# they ask the real vLLM for (to try the non-AMX path on an AMX machine).
TEST_RUN_SETTINGS = frozenset(
    {
        "OPSBOOK_CACHE_DIR",
        "OPSBOOK_REAL_VLLM_PYTHON",
        "OPSBOOK_REAL_VLLM_VENV",
        "OPSBOOK_SAVE_REAL_LOGS",
        "OPSBOOK_REAL_MLA_BACKEND",
    }
)


@pytest.fixture(scope="session", autouse=True)
def without_developer_settings() -> Iterator[None]:
    """No ``OPSBOOK_*`` variable of the developer's shell (a deployment file, a runs folder, a
    headless flag, a simulator setting) reaches a test, its fixtures or the programs it starts;
    a test that wants one sets it with ``monkeypatch``. Session-wide, so that the rehearsal
    hosts the session's fixtures start see none either."""
    with pytest.MonkeyPatch.context() as patch:
        for name in sorted(os.environ):
            if name.startswith("OPSBOOK_") and name not in TEST_RUN_SETTINGS:
                patch.delenv(name)
        yield


def vllm_facts_tool() -> ModuleType:
    """tools/vllm_facts.py as a module (a script of the repository, not of the package)."""
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "vllm_facts_tool", root / "tools" / "vllm_facts.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_facts_tool"] = module
    spec.loader.exec_module(module)
    return module
