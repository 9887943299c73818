"""Probe: read, patch and restore a checkpoint's JSON config files, in one round trip each.

Stdlib only and Python 3.8 compatible, because it runs under whatever ``python3`` the host
has. It decides nothing about the content: it reads texts and file status, and writes the
texts it is given, safely:

- a write happens only if every file still has the sha256 the caller planned against;
- the first original is kept as ``<file>.opsbook-orig`` and never overwritten (it is created
  with a hard link, which fails if the name exists); when that backup exists and the file
  differs from it (the operator changed it since), the file as it is now is kept as well, as
  ``<file>.opsbook-orig.<sha256 prefix>``, so that apply then restore loses nothing;
- a symlinked file is refused, never replaced by a regular file nor written through (its
  target may be shared, as a Hugging Face cache blob is);
- a temporary file is removed when a write fails (a full disk leaves nothing behind);
- a file is replaced by writing a temp file in the same folder, fsync, giving it the
  original's mode and owner, and renaming it over the file, then fsync of the folder.

Args (the dict given to ``main``):
    action: ``read`` (default), ``apply`` or ``restore``.
    dir: the checkpoint directory.
    files: the file names to read (default: config.json, hf_quant_config.json,
        tokenizer_config.json); for ``restore``, the files to put back.
    writes: for ``apply``, file name to ``{"expect_sha256": ..., "text": ...}``.
    suffix: the backup suffix (default ``.opsbook-orig``).
    weights: for ``read``, also count the ``*.safetensors`` files and add up their sizes.
"""

from __future__ import annotations

import hashlib
import os

DEFAULT_FILES = ["config.json", "hf_quant_config.json", "tokenizer_config.json"]
BACKUP_SUFFIX = ".opsbook-orig"
# Config files are kilobytes; anything this large is not a config and is not read.
MAX_TEXT_BYTES = 32 * 1024 * 1024


def main(args: dict) -> dict:
    action = args.get("action", "read")
    folder = os.path.abspath(os.path.expanduser(str(args["dir"])))
    suffix = str(args.get("suffix") or BACKUP_SUFFIX)
    if action == "apply":
        return apply(folder, args.get("writes") or {}, suffix)
    if action == "restore":
        return restore(folder, list(args.get("files") or DEFAULT_FILES), suffix)
    state = read_state(folder, list(args.get("files") or DEFAULT_FILES), suffix)
    if args.get("weights"):
        state["weights"] = weights_on_disk(folder)
    return state


def weights_on_disk(folder: str) -> dict:
    """How many ``*.safetensors`` files the folder holds and their bytes (links followed, as
    in a Hugging Face cache snapshot); one stat each, no header read."""
    shards, total = 0, 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.name.endswith(".safetensors"):
            continue
        try:
            total += entry.stat().st_size
        except OSError:
            continue
        shards += 1
    return {"shards": shards, "bytes": total}


def read_state(folder: str, names: list, suffix: str) -> dict:
    """Texts and status of the files and of their backups."""
    return {
        "dir": folder,
        "exists": os.path.isdir(folder),
        "files": {n: file_status(os.path.join(folder, n), with_text=True) for n in names},
        "backups": {n: file_status(os.path.join(folder, n) + suffix) for n in names},
    }


def file_status(path: str, with_text: bool = False) -> dict:
    """exists, size, mode, uid, gid, sha256 (and the UTF-8 text) of one file."""
    out: dict = {"path": path, "exists": False}
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return out
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e.strerror}"
        return out
    out.update(exists=True, size=st.st_size, mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid)
    if st.st_size > MAX_TEXT_BYTES:
        out["error"] = f"larger than {MAX_TEXT_BYTES} bytes: not a config file"
        return out
    try:
        data = read_bytes(path)
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e.strerror}"
        return out
    out["sha256"] = hashlib.sha256(data).hexdigest()
    if with_text:
        try:
            out["text"] = data.decode("utf-8")
        except UnicodeDecodeError:
            out["error"] = "not UTF-8 text"
    return out


def apply(folder: str, writes: dict, suffix: str) -> dict:
    """Back up and replace each file, if every file is still the one the caller planned on."""
    names = list(writes)
    before = {n: file_status(os.path.join(folder, n)) for n in names}
    conflicts = [n for n in names if before[n].get("sha256") != writes[n]["expect_sha256"]]
    actions: dict = {}
    if conflicts:
        return {
            "ok": False,
            "conflicts": conflicts,
            "actions": actions,
            "state": read_state(folder, names, suffix),
        }
    links = symlinks(folder, names)
    if links:
        return {
            "ok": False,
            "conflicts": [],
            "symlinks": links,
            "actions": actions,
            "state": read_state(folder, names, suffix),
        }
    ok = True
    for name in names:
        path = os.path.join(folder, name)
        try:
            backup = make_backup(path, path + suffix, before[name])
            kept = keep_current(path, path + suffix, before[name])
            owner_kept = replace_file(path, writes[name]["text"].encode("utf-8"), before[name])
            actions[name] = {"backup": backup, "written": True, "owner_kept": owner_kept}
            if kept:
                actions[name]["second_backup"] = kept
        except OSError as e:
            ok = False
            actions[name] = {"written": False, "error": f"{type(e).__name__}: {e}"}
            break
    return {
        "ok": ok,
        "conflicts": [],
        "actions": actions,
        "state": read_state(folder, names, suffix),
    }


def restore(folder: str, names: list, suffix: str) -> dict:
    """Put each backup's bytes back in place of its file (the backup stays)."""
    actions: dict = {}
    ok = True
    for name in names:
        path = os.path.join(folder, name)
        backup = file_status(path + suffix)
        if not backup["exists"]:
            actions[name] = {"status": "no-backup"}
            continue
        if file_status(path).get("sha256") == backup.get("sha256"):
            actions[name] = {"status": "already"}
            continue
        try:
            owner_kept = replace_file(path, read_bytes(path + suffix), backup)
            actions[name] = {"status": "restored", "owner_kept": owner_kept}
        except OSError as e:
            ok = False
            actions[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    return {"ok": ok, "actions": actions, "state": read_state(folder, names, suffix)}


def symlinks(folder: str, names: list) -> dict:
    """File name to link target, for the files that are symbolic links."""
    return {
        n: os.readlink(os.path.join(folder, n))
        for n in names
        if os.path.islink(os.path.join(folder, n))
    }


def keep_current(path: str, backup: str, status: dict) -> str:
    """When the first-original backup differs from the file as it is now, keep the file too
    as ``<backup>.<sha256[:12]>`` (never overwritten); the name kept, or "" if none needed."""
    first = file_status(backup)
    if not first.get("exists") or first.get("sha256") == status.get("sha256"):
        return ""
    second = backup + "." + str(status["sha256"])[:12]
    if os.path.lexists(second):
        return second
    write_synced(second, read_bytes(path), status)
    fsync_dir(os.path.dirname(second))
    return second


def make_backup(path: str, backup: str, status: dict) -> str:
    """Keep the first original: ``created``, or ``kept`` when a backup already exists."""
    if os.path.lexists(backup):
        return "kept"
    data = read_bytes(path)
    tmp = temp_name(backup)
    write_synced(tmp, data, status)
    try:
        # A hard link never replaces an existing name: two runs cannot both "create" it.
        os.link(tmp, backup)
    except FileExistsError:
        return "kept"
    except OSError:
        # Some filesystems refuse hard links; O_EXCL still never replaces an existing name.
        try:
            write_synced(backup, data, status)
        except FileExistsError:
            return "kept"
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    fsync_dir(os.path.dirname(backup))
    return "created"


def replace_file(path: str, data: bytes, status: dict) -> bool:
    """Atomically replace ``path`` with ``data``, keeping mode and owner from ``status``."""
    tmp = temp_name(path)
    try:
        owner_kept = write_synced(tmp, data, status)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path))
    return owner_kept


def write_synced(tmp: str, data: bytes, status: dict) -> bool:
    """Write a new file, fsync it, give it the mode and owner in ``status``."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    owner_kept = True
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        if "uid" in status:
            try:
                os.fchown(fd, status["uid"], status["gid"])
            except PermissionError:
                # Not root: the file stays ours; the caller reports it if that differs.
                st = os.fstat(fd)
                owner_kept = (st.st_uid, st.st_gid) == (status["uid"], status["gid"])
        os.fchmod(fd, status.get("mode", 0o644))
    except BaseException:
        # A full disk (ENOSPC) must not leave a partial file behind under any name.
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return owner_kept


def temp_name(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.opsbook-tmp-{os.getpid()}")


def fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
