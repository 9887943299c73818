"""Every test runs without the developer's OPSBOOK_* settings (tests/conftest.py)."""

import json
import os
import subprocess
import sys

from tests.conftest import TEST_RUN_SETTINGS


def test_no_developer_setting_reaches_a_test_or_the_programs_it_starts() -> None:
    leaked = {k for k in os.environ if k.startswith("OPSBOOK_")} - TEST_RUN_SETTINGS
    assert leaked == set()
    code = "import json, os; print(json.dumps([k for k in os.environ if k[:8] == 'OPSBOOK_']))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(child.stdout)) <= TEST_RUN_SETTINGS
