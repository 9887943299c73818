"""The deploy's shared kernel: one Python kernel for all the stage notebooks of a run, started
ahead and warmed while the run prepares its first stage."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opsbook.core.deployment import HostSpec


# What the deploy's stage notebooks import (their first cells, and the stage modules the
# registry imports on first use): 0.4 s of the kernel's CPU, spent while the run prepares.
# Then the run's facts readings, which the stages of this kernel share (preflight's reading of
# a host serves 02_config_patch: opsbook.stages.base.share_readings). Last, what the kernel
# and its imports made is frozen (gc.freeze): it lives as long as the kernel, and each full
# collection walked all of it again, 45 ms of the 74 the download probe's first assembly took
# in this kernel (28 ms frozen, 21 ms in a plain interpreter, which has fewer objects).
WARM_UP = """
import opsbook.widgets, opsbook.stages, opsbook.steps.host_facts
opsbook.stages.import_runbook()
opsbook.stages.base.share_readings(opsbook.steps.host_facts.RunReadings())
import gc
gc.freeze()
del gc
"""
# Before the imports: the first stage's hosts' SSH handshakes, while the run takes its locks
# (a host that fails is the first stage's to report).
OPEN_AHEAD = """
try:
    import opsbook.remote.hosts
    from opsbook.core.deployment import HostSpec
    opsbook.remote.hosts.open_ahead([HostSpec(**fields) for fields in {fields!r}], {forks!r})
except Exception:
    pass
"""
WARM_UP_TIMEOUT = 60.0


class SharedKernel:
    """One Python kernel for the stage notebooks of a deploy run, started by the first stage
    and handed to the next ones: a kernel start and opsbook's imports are paid once per run,
    not once per stage. Each notebook still runs top to bottom from its own parameters; before
    each, the kernel's environment is set to that stage's (results file, journal). A stage
    that fails or runs past its deadline discards the kernel: the next starts a fresh one.
    """

    def __init__(self) -> None:
        self.km: Any = None
        self._warming: Any = None

    def start(
        self, log_path: Path, cwd: Path, hosts: Sequence[HostSpec] = (), forks: int = 1
    ) -> None:
        """Start the kernel now, without waiting for it: it boots, opens the SSH connections
        of ``hosts`` and imports what the stages import, while the run imports papermill and
        prepares its first stage, which then finds it running."""
        from jupyter_core.utils import run_sync

        from opsbook.runner.kernel import quiet_kernel_manager

        self.km = quiet_kernel_manager(log_path)(kernel_name="python3")
        run_sync(self.km.start_kernel)(cwd=str(cwd))
        # Sent now, its reply awaited by the first stage (ready()).
        client = self.km.client()
        client.start_channels()  # no heartbeat (kernel.PromptKernelClient.start_channels)
        fields = [asdict(spec) for spec in hosts]
        code = (OPEN_AHEAD.format(fields=fields, forks=forks) if hosts else "") + WARM_UP
        self._warming = (client, client.execute(code, silent=True, store_history=False))

    def ready(self, log_path: Path) -> Any:
        """The kernel manager for the next notebook: not started yet (papermill starts it
        with this process's environment; it is quiet and logs to ``log_path``), or running
        (the notebook's client sets the stage's environment in it: ``engine.ClosingClient``)."""
        from jupyter_core.utils import run_sync

        from opsbook.runner.kernel import quiet_kernel_manager

        if self.km is not None and self.km.has_kernel:
            # The clients of one kernel manager share a ZMQ identity: the warm-up's must be
            # closed before another connects, or the kernel answers the wrong one.
            run_sync(self._finish_warming)()
            return self.km
        self.km = quiet_kernel_manager(log_path)(kernel_name="python3")
        return self.km

    def discard(self) -> None:
        """Shut the kernel down, if one runs; the next stage starts a new one."""
        from jupyter_core.utils import run_sync

        if self._warming is not None:
            self._warming[0].stop_channels()
            self._warming = None
        km, self.km = self.km, None
        if km is not None and km.has_kernel:
            with contextlib.suppress(Exception):  # a kernel already gone is what we want
                run_sync(km.shutdown_kernel)(now=True)

    async def _finish_warming(self) -> None:
        """Wait for the warm-up's reply (the kernel has imported the stages), then close its
        client."""
        if self._warming is None:
            return
        (client, msg_id), self._warming = self._warming, None
        deadline = time.monotonic() + WARM_UP_TIMEOUT
        try:
            while time.monotonic() < deadline:
                reply = await client.shell_channel.get_msg(timeout=deadline - time.monotonic())
                if reply["parent_header"].get("msg_id") == msg_id:
                    return
        except Empty:
            return  # a kernel that never answered is found out by the next request
        finally:
            client.stop_channels()
