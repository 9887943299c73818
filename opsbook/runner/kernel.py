"""The kernel a headless run executes its notebooks in: quiet on the terminal.

A kernel started the default way talks over TCP and says so on the terminal
(``[IPKernelApp] WARNING | Kernel is running over TCP without encryption``), and logs its own
shutdown races there (``Invalid Control Message`` tracebacks, ``KeyboardInterrupt caught in
kernel``) even when every cell passed. The terminal of ``opsbook run`` is for the stages; so
the kernel runs over IPC sockets in a private folder (nothing listens on a port, which is also
what the warning asks for), and its own log goes to a file of the run folder, where it is kept
for the rare day the kernel itself dies.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import IO, Any

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

# A run's notebooks are its record: IPython's input history (an SQLite database under
# ~/.ipython, written after every cell) would keep a second copy of every cell, in a file no
# run folder holds, for about 1 ms a cell.
KERNEL_OPTIONS = ("--HistoryManager.enabled=False",)
KILLED_POLL = 0.005


class PromptKernelClient(AsyncKernelClient):
    """A kernel client whose readiness check does not end with 0.2 s of waiting.

    jupyter_client's ``wait_for_ready`` (8.x, ``client.py``) proves the kernel answers on the
    shell channel and that IOPub is connected, then drains IOPub until it has been silent for
    0.2 s. A deploy's notebooks share one kernel and each stage asks twice (its environment,
    then papermill), so that silence cost 0.4 s a stage. Messages still to come on IOPub then
    belong to the readiness request, and nbclient ignores messages of other requests.
    """

    def start_channels(
        self,
        shell: bool = True,
        iopub: bool = True,
        stdin: bool = True,
        hb: bool = False,
        control: bool = True,
    ) -> None:
        """The channels, without a heartbeat unless asked. The kernel manager says whether
        the kernel lives; and a heartbeat thread stopped before it has begun spins opening
        sockets until ZMQ refuses ("Too many open files"), since HBChannel sets ``_running``
        after its socket is made, undoing ``stop()`` (jupyter_client 8.x, ``channels.py``). A
        client that lives a moment meets that under load, or when a run is stopped (SIGTERM)
        as a stage's client starts: nbclient starts each stage's channels with the defaults."""
        super().start_channels(shell, iopub, stdin, hb, control)

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while not await self._proved_ready():
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")
        while True:  # what is already there, without waiting for more
            try:
                await self.iopub_channel.get_msg(timeout=0)
            except Empty:
                return

    async def _proved_ready(self) -> bool:
        """One kernel_info round trip, then a message on IOPub (the kernel publishes its busy
        status for that request: IOPub is connected)."""
        self.kernel_info()
        try:
            reply = await self.shell_channel.get_msg(timeout=1)
        except Empty:
            return False
        if reply["msg_type"] != "kernel_info_reply":
            return False
        try:
            await self.iopub_channel.get_msg(timeout=0.2)
        except Empty:
            return False
        self._handle_kernel_info_reply(reply)
        return True


class QuietKernelManager(AsyncKernelManager):
    """An :class:`AsyncKernelManager` over IPC whose kernel logs to :attr:`log_path`, with
    clients that are ready without a wait (:class:`PromptKernelClient`)."""

    log_path: Path | None = None

    @default("client_factory")
    def _client_factory_default(self) -> type[PromptKernelClient]:
        return PromptKernelClient

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        # One private folder per kernel: IPC socket names never collide between runs.
        folder = Path(tempfile.gettempdir()) / f"opsbook-kernel-{uuid.uuid4().hex[:12]}"
        folder.mkdir(mode=0o700)
        return str(folder / "kernel")

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        log = self._open_log()
        if log is not None:
            kw.setdefault("stderr", log)
        try:
            await super()._async_launch_kernel([*kernel_cmd, *KERNEL_OPTIONS], **kw)
        finally:
            if log is not None:
                log.close()  # the kernel holds its own copy of the descriptor

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # jupyter_client 8.x (manager.py) looks every 0.1 s whether a killed kernel is gone,
        # and a kernel SIGKILLed a moment ago is still there at the first look: every run
        # waited 0.1 s at its end. The kernel is gone within milliseconds.
        await super()._async_wait(pollinterval=KILLED_POLL)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        folder = Path(self.ip).parent
        if not restart and folder.name.startswith("opsbook-kernel-"):
            shutil.rmtree(folder, ignore_errors=True)  # our own private folder of sockets

    def _open_log(self) -> IO[bytes] | None:
        if self.log_path is None:
            return None
        return self.log_path.open("ab")


def quiet_kernel_manager(log_path: Path) -> type[QuietKernelManager]:
    """A kernel manager class for papermill whose kernels log to ``log_path``."""
    return type("RunKernelManager", (QuietKernelManager,), {"log_path": log_path})
