"""``--textfile``: the run's verdicts for node_exporter's textfile collector, parsed back with
prometheus_client's own parser."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from opsbook.core.exceptions import RunError
from opsbook.core.results import HostResult, State
from opsbook.runner import textfile

NOW = 1_800_000_000.0
RESULTS = [
    HostResult("ops@gpu-01", "diagnose", State.OK, "ready: the process runs"),
    HostResult("ops@gpu-02", "diagnose", State.FAILED, "hung: /health answers 200, but ..."),
    HostResult("ops@gpu-03", "diagnose", State.UNREACHABLE, "connection refused"),
]
SUMMARIES = [
    {"host": "ops@gpu-01", "stage": "diagnose", "moment": "end",
     "summary": {"server_state": "ready", "ready_at": NOW - 3600.0, "running": 0.0}},
    {"host": "ops@gpu-02", "stage": "diagnose", "moment": "end",
     "summary": {"server_state": "hung", "ready_at": NOW - 60.0, "running": 3.0}},
]  # fmt: skip


def samples(path: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    families = text_string_to_metric_families(path.read_text())
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in families
        for s in family.samples
    }


def test_every_host_s_state_is_a_labelled_gauge_and_parses(tmp_path: Path) -> None:
    path = textfile.write_textfile(tmp_path, "prod", RESULTS, SUMMARIES, now=NOW)
    assert path == tmp_path / "opsbook_prod.prom"
    found = samples(path)

    def state(host: str, name: str) -> float:
        labels = {"deployment": "prod", "host": host, "state": name}
        return found[("opsbook_server_state", frozenset(labels.items()))]

    assert state("ops@gpu-01", "ready") == 1.0 and state("ops@gpu-01", "hung") == 0.0
    assert state("ops@gpu-02", "hung") == 1.0
    assert state("ops@gpu-03", "unreachable") == 1.0
    for host in ("ops@gpu-01", "ops@gpu-02", "ops@gpu-03"):
        assert sum(state(host, name) for name in textfile.STATES) == 1.0
    since = {
        dict(labels)["host"]: value
        for (name, labels), value in found.items()
        if name == "opsbook_seconds_since_ready"
    }
    assert since == {"ops@gpu-01": 3600.0, "ops@gpu-02": 60.0}
    verdict = {"deployment": "prod", "host": "ops@gpu-02", "stage": "diagnose",
               "verdict": "failed", "failure_id": ""}  # fmt: skip
    assert found[("opsbook_last_verdict", frozenset(verdict.items()))] == 1.0
    ended = ("opsbook_last_run_timestamp_seconds", frozenset({("deployment", "prod")}))
    assert found[ended] == NOW


def test_the_file_is_replaced_whole_and_no_temporary_file_stays(tmp_path: Path) -> None:
    textfile.write_textfile(tmp_path, "prod", RESULTS, SUMMARIES, now=NOW)
    first = (tmp_path / "opsbook_prod.prom").stat().st_ino
    textfile.write_textfile(tmp_path, "prod", RESULTS[:1], SUMMARIES[:1], now=NOW + 300)
    assert (tmp_path / "opsbook_prod.prom").stat().st_ino != first  # a rename, not a rewrite
    assert os.listdir(tmp_path) == ["opsbook_prod.prom"]
    assert "ops@gpu-02" not in (tmp_path / "opsbook_prod.prom").read_text()


def test_a_deployment_name_is_made_safe_for_a_file_name(tmp_path: Path) -> None:
    assert textfile.textfile_path(tmp_path, "a/b c") == tmp_path / "opsbook_a_b_c.prom"


def test_a_folder_that_is_missing_or_not_writable_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="not a folder") as missing:
        textfile.check_folder(tmp_path / "nope")
    assert "collector.textfile.directory" in (missing.value.remedy or "")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:
        with pytest.raises(RunError, match="cannot write there"):
            textfile.check_folder(locked)
    textfile.check_folder(tmp_path)
    assert os.listdir(tmp_path) == ["locked"]


def test_a_qualification_writes_its_own_file_with_each_cell_s_figures(tmp_path: Path) -> None:
    import dataclasses

    from tests.unit.test_qualify_gate import receipt

    good = receipt(1873.4, ttft=120.0, host="ops@gpu-01")
    good = dataclasses.replace(
        good, startup=dataclasses.replace(good.startup, kv_cache_tokens=65536)
    )
    slow = receipt(50.0, host="ops@gpu-02", passed=False)
    results = [
        HostResult("ops@gpu-01", "qualify", State.OK, "passed"),
        HostResult("ops@gpu-02", "qualify", State.FAILED, "slower", failure_id="x"),
    ]
    diagnosis = textfile.write_textfile(tmp_path, "prod", RESULTS, SUMMARIES, now=NOW)
    path = textfile.write_qualify_textfile(tmp_path, "prod", results, [good, slow], now=NOW)
    assert path == tmp_path / "opsbook_prod_qualify.prom" and diagnosis.exists()
    found = samples(path)
    (cell,) = {dict(k[1])["cell"] for k in found if k[0].endswith("tokens_per_second")}
    one = frozenset({("deployment", "prod"), ("host", "ops@gpu-01")})
    assert found[("opsbook_qualify_passed", one)] == 1.0
    two = frozenset({("deployment", "prod"), ("host", "ops@gpu-02")})
    assert found[("opsbook_qualify_passed", two)] == 0.0
    assert found[("opsbook_qualify_kv_cache_tokens", one)] == 65536.0
    assert found[("opsbook_qualify_output_tokens_per_second", one | {("cell", cell)})] == 1873.4
    assert found[("opsbook_qualify_ttft_p99_seconds", one | {("cell", cell)})] == 0.12
    assert found[("opsbook_last_run_timestamp_seconds", frozenset({("deployment", "prod")}))] == NOW
