"""The simulated vLLM's nccl-timeout fault reads as the catalogue's nccl-timeout, naming the
rank that stalled."""

from opsbook.knowledge import logscan
from tests.unit.test_sim_matches_catalogue import Box, box, checkpoint, run_server  # noqa: F401


def test_a_stalled_rank_is_diagnosed_as_nccl_timeout(box: Box) -> None:  # noqa: F811
    text = run_server(
        box, checkpoint(box), "-tp", "2", "--trust-remote-code", OPSBOOK_SIM_FAULT="nccl-timeout"
    )
    diagnosis = logscan.diagnose_log(text, running=False)
    assert diagnosis.failure == "nccl-timeout", diagnosis.title
    assert "[Rank 1] Watchdog caught collective operation timeout" in text
