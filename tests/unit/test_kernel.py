"""The run's kernel: quiet, over IPC, and its clients ready without a fixed wait, losing no
output of the first request that follows (a real ipykernel, started here)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.channels import HBChannel
from jupyter_core.utils import run_sync

from opsbook.runner.kernel import PromptKernelClient, quiet_kernel_manager


@pytest.fixture
def km(tmp_path: Path) -> Iterator[Any]:
    manager = quiet_kernel_manager(tmp_path / "kernel.log")(kernel_name="python3")
    run_sync(manager.start_kernel)()
    try:
        yield manager
    finally:
        run_sync(manager.shutdown_kernel)(now=True)


async def printed_by_a_new_client(km: Any, code: str) -> tuple[Any, list[str]]:
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        seen: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])

        await client.execute_interactive(code, timeout=60, output_hook=hook)
        return client, seen
    finally:
        client.stop_channels()


def test_each_new_client_is_ready_and_sees_the_first_output_in_full(km: Any) -> None:
    for n in range(5):  # a deploy's stages each take a new client of the one kernel
        client, seen = run_sync(printed_by_a_new_client)(km, f"print('stage {n}')")
        assert isinstance(client, PromptKernelClient)
        assert "".join(seen) == f"stage {n}\n"


def test_a_client_s_channels_start_without_a_heartbeat_thread(km: Any) -> None:
    # nbclient starts each stage's channels with jupyter_client's defaults (a heartbeat); a
    # heartbeat stopped as it starts (a run stopped by SIGTERM) spun to "Too many open files".
    client = km.client()
    client.start_channels()
    try:
        assert client.channels_running
        assert not [t for t in threading.enumerate() if isinstance(t, HBChannel)]
    finally:
        client.stop_channels()


def test_the_kernel_talks_over_ipc_in_a_private_folder(km: Any) -> None:
    assert km.transport == "ipc"
    folder = Path(km.ip).parent
    assert folder.name.startswith("opsbook-kernel-")
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_shared_kernel_has_imported_the_stages_when_the_first_stage_gets_it(
    tmp_path: Path,
) -> None:
    from opsbook.runner.shared_kernel import SharedKernel

    notebooks = Path(__file__).parents[2] / "notebooks"
    for attempt in range(3):  # the warm-up's client and the next ones must not cross
        kernel = SharedKernel()
        kernel.start(tmp_path / "kernel.log", notebooks)
        try:
            # Its clients start no heartbeat thread (one stopped as it begins spins).
            assert not [t for t in threading.enumerate() if isinstance(t, HBChannel)]
            km = kernel.ready(tmp_path / "kernel.log")
            # What the imports made is frozen: the collector does not walk it again.
            code = (
                "import gc, sys\n"
                f"print('opsbook.stages.launch_server' in sys.modules, {attempt}, "
                "gc.get_freeze_count() > 0)"
            )
            _, seen = run_sync(printed_by_a_new_client)(km, code)
        finally:
            kernel.discard()
        assert "".join(seen) == f"True {attempt} True\n"


def test_a_shared_kernel_opens_the_first_stages_connections_ahead(tmp_path: Path) -> None:
    from opsbook.core.deployment import HostSpec
    from opsbook.runner.shared_kernel import SharedKernel

    # Nothing listens on port 1 of this machine: the opening fails at once, left for a stage.
    refused = HostSpec("127.0.0.1", port=1, user="nobody", connect_timeout=2.0)
    trusted = HostSpec("127.0.0.1", port=2, user="nobody", trust_on_first_use=True)
    kernel = SharedKernel()
    kernel.start(
        tmp_path / "kernel.log", Path(__file__).parents[2] / "notebooks", [refused, trusted]
    )
    try:
        km = kernel.ready(tmp_path / "kernel.log")
        code = "import opsbook.remote.hosts as h\nprint(sorted(s.name for s in h._ahead))"
        _, seen = run_sync(printed_by_a_new_client)(km, code)
    finally:
        kernel.discard()
    assert "".join(seen) == f"{[refused.name]}\n"


def test_the_kernel_keeps_no_input_history_of_its_own(km: Any) -> None:
    # The run's notebooks are the record; IPython's history database would be a second one,
    # outside the run folder.
    code = "print(get_ipython().history_manager.enabled)"
    _, seen = run_sync(printed_by_a_new_client)(km, code)
    assert "".join(seen) == "False\n"


def test_a_killed_kernel_is_waited_for_in_steps_of_milliseconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_client.manager import KernelManager

    from opsbook.runner import kernel as run_kernel

    steps: list[float] = []
    wait = KernelManager._async_wait

    async def recorded(self: Any, pollinterval: float = 0.1) -> None:
        steps.append(pollinterval)
        await wait(self, pollinterval)

    monkeypatch.setattr(KernelManager, "_async_wait", recorded)
    manager = quiet_kernel_manager(tmp_path / "kernel.log")(kernel_name="python3")
    run_sync(manager.start_kernel)()
    process = manager.provisioner.process
    run_sync(manager.shutdown_kernel)(now=True)
    assert steps == [run_kernel.KILLED_POLL] and run_kernel.KILLED_POLL <= 0.01
    assert process.poll() is not None and not manager.has_kernel
