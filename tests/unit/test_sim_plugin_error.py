"""The simulated vLLM's plugin-error fault: vLLM's traceback of a general plugin that fails to
load, logged at ERROR before readiness, and a server that starts all the same."""

from opsbook.knowledge import logscan
from tests.unit.test_sim_matches_catalogue import Box, box, checkpoint, run_server  # noqa: F401

ERROR = "ModuleNotFoundError: No module named 'paddlex_genai_plugin'"


def test_a_plugin_that_fails_to_load_is_an_error_the_startup_goes_past(box: Box) -> None:  # noqa: F811
    log = run_server(
        box,
        checkpoint(box),
        "-tp",
        "2",
        "--trust-remote-code",
        "--max-model-len",
        "32768",
        OPSBOOK_SIM_FAULT="plugin-error",
        wait_for="Application startup complete.",
    )
    assert "ERROR" in log[: log.index(ERROR)].splitlines()[-1]
    assert log.index(ERROR) < log.index("Application startup complete.")
    follower = logscan.LogFollower()
    error_end = log.index("\n", log.index(ERROR)) + 1
    follower.feed(log[:error_end].encode())
    seen = follower.diagnose(running=True)
    assert seen.state == "failed" and seen.line is not None and ERROR in seen.line.text
    assert follower.judge(seen) == logscan.UNDECIDED
    follower.feed(log[error_end:].encode())
    ready = follower.diagnose(running=True)
    assert ready.state == "ready", str(ready)
    assert follower.judge(seen) == logscan.WENT_ON
    survived = follower.error_before_ready(ready)
    assert survived is not None and survived.line is not None and ERROR in survived.line.raw
