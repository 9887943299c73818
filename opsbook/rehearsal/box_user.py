"""The rehearsal host's login user: the per-folder account root creates (and removes), or the
current user; and the files it must own."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import stat
import subprocess
import time
from pathlib import Path

from opsbook.core.exceptions import SandboxError
from opsbook.rehearsal.box_state import BoxPaths

SHELLS = {"zsh": Path("/usr/bin/zsh"), "bash": Path("/bin/bash")}
SHELL_PACKAGES = {"zsh": "zsh", "bash": "bash"}


def login_name(paths: BoxPaths, shell: str) -> str:
    """The account that will log in: a per-sandbox user as root, else the current user."""
    if os.geteuid() == 0:
        return "opsbook-" + hashlib.sha256(str(paths.dir).encode()).hexdigest()[:8]
    me = pwd.getpwuid(os.geteuid())
    if Path(me.pw_shell).name != shell:
        raise SandboxError(
            f"the login shell of {me.pw_name} is {me.pw_shell}, not {shell}, and only root can "
            "create a user with another shell",
            remedy=f"use --shell {Path(me.pw_shell).name}, or run `opsbook sandbox up` as root",
        )
    return me.pw_name


def account(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(
            f"user {name} does not exist", remedy="run `opsbook sandbox up` again"
        ) from None


def check_traversable(folder: Path) -> None:
    """Refuse a folder whose parents another user cannot enter: sshd reads keys as that user."""
    for parent in folder.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise SandboxError(
                f"the sandbox user cannot reach {folder}: {parent} is mode "
                f"{stat.S_IMODE(mode):o} (not enterable by other users)",
                remedy=f"run `chmod o+x {parent}`, or choose a --dir under /tmp or /srv",
            )


def ensure_user(paths: BoxPaths, name: str, shell: str) -> bool:
    """Create the login user, or adopt one left by an earlier run of this folder.

    Returns:
        True if the user belongs to this sandbox (created now or earlier), so down removes it.
    """
    try:
        existing = pwd.getpwnam(name)
    except KeyError:
        existing = None
    if existing is not None and Path(existing.pw_dir) != paths.home:
        raise SandboxError(
            f"user {name} exists with home {existing.pw_dir}, not {paths.home}",
            remedy=f"remove it with `userdel {name}` if it is a leftover, or use another --dir",
        )
    if existing is None:
        run_admin(
            [
                "useradd",
                "-M",
                "-d",
                str(paths.home),
                "-s",
                str(SHELLS[shell]),
                "-p",
                "*",
                "-c",
                "opsbook rehearsal host",
                name,
            ]
        )
    elif existing.pw_shell != str(SHELLS[shell]):
        run_admin(["usermod", "-s", str(SHELLS[shell]), name])
    return True


def run_admin(argv: list[str]) -> None:
    """Run useradd/usermod/userdel, retrying while another one holds the passwd lock."""
    for attempt in range(20):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr or attempt == 19:
            break
        time.sleep(0.25)
    raise SandboxError(
        f"`{' '.join(argv)}` failed: {done.stderr.strip()}",
        remedy="check /etc/passwd and /etc/shadow are writable (run as root)",
    )


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def chown_tree(top: Path, owner: pwd.struct_passwd) -> None:
    """Give a tree to the login user; symlinks themselves, never what they point at."""
    if os.geteuid() != 0:
        return
    os.chown(top, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def disown(paths: BoxPaths, uid: int) -> None:
    """Give what the removed user owned in the folder back to the operator, so that no file is
    left to a uid that the next user created on the machine would get."""
    me = os.getuid()
    for top in (paths.home, paths.venv, paths.models, paths.sim):
        if not top.exists():
            continue
        for root, dirs, files in os.walk(top):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                with contextlib.suppress(OSError):
                    if os.lstat(name).st_uid == uid:
                        os.chown(name, me, os.getgid(), follow_symlinks=False)
