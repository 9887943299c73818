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
import uuid
from pathlib import Path
from typing import IO, Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import default


class QuietKernelManager(AsyncKernelManager):
    """An :class:`AsyncKernelManager` over IPC whose kernel logs to :attr:`log_path`."""

    log_path: Path | None = None

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
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            if log is not None:
                log.close()  # the kernel holds its own copy of the descriptor

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
