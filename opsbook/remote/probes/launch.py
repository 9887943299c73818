"""Probe: start, watch and stop a model server that opsbook launched, and nothing else.

Stdlib only (Python 3.8+); runs on the host. Operations (``args["op"]``):

- ``start``: refuse if the recorded launch still runs or the port is taken (naming who holds
  it); start the script detached in a session of its own with its output to the log; record
  PID, process group, start time and command line, and with ``inputs`` (name: ``{"files":
  [paths]}`` or ``{"python": interpreter}``) a digest of each, what the server runs; then watch
  about two seconds for proof that it started (alive, log created and growing).
- ``status``: the recorded launch (alive, still the same process), its group, other vLLM
  processes of the user, the log (size, age, the tail from an offset), and whether the port
  answers; with ``health`` (a URL path) also the server's answer to it when the port is open,
  and with ``notes`` (file names) the text of those files of the state folder: a health check
  in one round trip. With ``log_when_healthy`` false, a server that runs and answers ``/health``
  200 is reported without its log's text (the scheduled check needs no more). With ``inputs``
  (as ``start`` takes them), whether each is the same as when the running launch started.
  With ``when_healthy`` (a command line), a server that runs and answers ``/health`` 200 also
  gets that command's output (``side``: what a record notes of a ready server, without a
  round trip of its own).
  With ``settled`` (``{"deployment": digest, "secrets": values, "model": path}``), whether
  the running launch is the one the last complete deploy left ready, with the same deployment
  digest (and secrets' values) and the same files in the checkpoint folder (names, sizes,
  modification times): the deploy's "nothing to do" (``settled``: the note's run and time,
  and what differs; the digests stay here).
- ``settle``: with the launch running and ``/health`` 200, write that note
  (``SETTLED_NOTE``: the deploy's run, the deployment digest, the launch's PID and start, the
  checkpoint folder's listing digest); otherwise write nothing and say why.
- ``stop``: SIGTERM to the recorded process group, wait, then SIGKILL; only after checking the
  process is still the one recorded (start time and command line) and is not an ancestor of
  this probe; other processes are reported, never signalled.
- ``clean_shm``: remove ``/dev/shm/psm_*`` and ``sem.mp-*`` files of this user that no live
  process has open or mapped (also done by ``stop`` with ``clean_shm``, once nothing of the
  launch runs: the step before a start in one round trip).
- ``http``: GET or POST on the server's port from the host itself.
- ``watch``: a ``status`` (with ``/health``) that waits on the host, up to ``wait`` seconds,
  for something that decides a readiness wait: the line that proves the server ready (then
  ``/health`` answers), an error line, or the process gone. It looks every
  ``WATCH_STEP`` seconds, reading only the bytes the log grew by, so the watcher learns of
  readiness within a step plus one round trip, and its cost does not grow with the log.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import time

SHM = "/dev/shm"
SHM_PREFIXES = ("psm_", "sem.mp-")
PROOF_SECONDS = 2.0
TAIL_LIMIT = 512 * 1024
TCP_LISTEN = "0A"
WATCH_STEP = 0.05
WATCH_LIMIT = 30.0
WATCH_READ = 1 << 20
WATCH_TAIL_LIMIT = 8 << 20
# Log lines that decide a wait: uvicorn's ready lines (vLLM serves with uvicorn), and the
# starts of error lines and tracebacks (the watcher's diagnosis tells which failure).
PROOF_MARKERS = (b"Application startup complete", b"Uvicorn running on")
ERROR_MARKERS = (b"Traceback (most recent call last)", b"ERROR ", b"Error: ")
ENGINE_TIMEOUT = 30.0
# The note a complete deploy leaves beside the launch record: what "nothing to do" compares.
SETTLED_NOTE = "settled.json"
# Run by the deployment's interpreter: which Python and which vLLM install it is, without
# importing vLLM (seconds of torch). A dist's RECORD lists every installed file with its hash,
# so a reinstall of the same version with other files shows too.
ENGINE_SCRIPT = r"""
import hashlib, json, os, sys
out = {"executable": os.path.realpath(sys.executable), "version": sys.version, "vllm": None}
try:
    import importlib.metadata as m
    dist = m.distribution("vllm")
    out["vllm"] = dist.version
    out["record"] = hashlib.sha256((dist.read_text("RECORD") or "").encode()).hexdigest()
except Exception:
    pass
print(json.dumps(out, sort_keys=True))
"""


def main(args):
    op = args.get("op")
    handler = {
        "start": start,
        "status": status,
        "stop": stop,
        "clean_shm": clean_shm,
        "http": http,
        "smoke": smoke,
        "watch": watch,
        "settle": settle,
    }.get(op)
    if handler is None:
        return {"error": f"unknown op {op!r}"}
    return handler(args)


# -- processes ------------------------------------------------------------------------------


def proc_stat(pid):
    """(state, ppid, pgid, sid, start_ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return {
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "start": int(fields[19]),
    }


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def owner(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def alive(pid):
    stat = proc_stat(pid)
    return stat is not None and stat["state"] not in ("Z", "X")


def all_pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def describe(pid):
    stat = proc_stat(pid) or {}
    return {
        "pid": pid,
        "ppid": stat.get("ppid"),
        "pgid": stat.get("pgid"),
        "state": stat.get("state"),
        "uid": owner(pid),
        "cmdline": cmdline(pid),
    }


def ancestors():
    """PIDs of this probe and every process above it (its shell, sshd...)."""
    chain, pid = [], os.getpid()
    while pid and pid not in chain:
        chain.append(pid)
        stat = proc_stat(pid)
        pid = stat["ppid"] if stat else 0
    return chain


def group_members(pgid):
    return [pid for pid in all_pids() if (proc_stat(pid) or {}).get("pgid") == pgid and alive(pid)]


def vllm_processes(uid=None):
    """Live processes that look like a vLLM server or its renamed children: those of ``uid``,
    or of every user when ``uid`` is None (another user's server holds GPUs and ports too)."""
    found = []
    skip = set(ancestors())
    for pid in all_pids():
        line = cmdline(pid) or ""
        if pid in skip or (uid is not None and owner(pid) != uid) or not alive(pid):
            continue
        if line.startswith("VLLM::") or "vllm.entrypoints" in line or " vllm serve" in " " + line:
            found.append(describe(pid))
    return found


# -- the launch record ------------------------------------------------------------------------


def record_path(args):
    return os.path.join(args["state_dir"], "launch.json")


def read_record(args):
    try:
        with open(record_path(args)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and {"pid", "start", "pgid"} <= set(doc) else None


def record_problem(args):
    """Why an existing launch.json cannot be read, or None (missing, or readable)."""
    path = record_path(args)
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{path} is unreadable: {e}"
    if not isinstance(doc, dict) or not {"pid", "start", "pgid"} <= set(doc):
        return f"{path} is not a launch record opsbook wrote"
    return None


def write_record(args, record):
    os.makedirs(args["state_dir"], exist_ok=True)
    path = record_path(args)
    temp = path + ".tmp"
    try:
        with open(temp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        # A full disk must not leave a half-written temporary file behind.
        if os.path.lexists(temp):
            os.unlink(temp)
        raise


def same_process(record):
    """Whether the recorded PID is still the process opsbook started (not a reused PID).

    The start time (clock ticks since boot) tells a reused PID apart; the command line is
    checked too. It may still change legitimately: a script recorded before its ``exec``
    becomes the server, and vLLM may retitle its processes ``VLLM::...``."""
    if record is None or not alive(record["pid"]):
        return False
    stat = proc_stat(record["pid"])
    if stat is None or stat["start"] != record["start"]:
        return False
    recorded, current = record.get("cmdline"), cmdline(record["pid"]) or ""
    if not recorded or current == recorded or current.startswith("VLLM::"):
        return True
    return bool(record.get("script")) and record["script"] in recorded


# -- operations -------------------------------------------------------------------------------


def start(args):
    record = read_record(args)
    if same_process(record):
        return {"started": False, "reason": "running", "record": record}
    script, log = args["script"], args["log"]
    if not os.path.isfile(script):
        return {"started": False, "reason": "no-script", "script": script}
    if not os.access(script, os.X_OK):
        return {"started": False, "reason": "not-executable", "script": script}
    if port_open(args.get("port")):
        return {"started": False, "reason": "port-taken", "holders": port_holders(args["port"])}
    inputs = fingerprint(args["inputs"]) if args.get("inputs") else None
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
        offset = out.tell()
        proc = subprocess.Popen(
            [script],
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=os.path.dirname(script) or None,
        )
    stat = proc_stat(proc.pid) or {}
    record = {
        "pid": proc.pid,
        "pgid": stat.get("pgid", proc.pid),
        "start": stat.get("start"),
        "uid": os.getuid(),
        "script": script,
        "log": log,
        "log_offset": offset,
        "port": args.get("port"),
        "started_at": time.time(),
    }
    if inputs is not None:
        record["inputs"] = inputs
    write_record(args, record)
    proof = prove_started(proc, record)
    # After the proof the script has exec'd the server: its command line identifies it.
    write_record(args, record)
    return {"started": True, "record": record, "proof": proof}


def prove_started(proc, record):
    """Watch briefly: the process alive and the log growing, or its exit code and last words."""
    deadline = time.monotonic() + PROOF_SECONDS
    sizes = []
    while time.monotonic() < deadline:
        code = proc.poll()
        sizes.append(file_size(record["log"]))
        if code is not None:
            break
        time.sleep(0.1)
    code = proc.poll()
    record["cmdline"] = cmdline(record["pid"])
    grown = max(0, (sizes[-1] or 0) - record["log_offset"]) if sizes else 0
    return {
        "alive": code is None,
        "exit_code": code,
        "log_exists": os.path.exists(record["log"]),
        "log_bytes": grown,
        "cmdline": record["cmdline"],
        "tail": read_from(record["log"], record["log_offset"])[0][-8192:],
    }


def status(args):
    record = read_record(args)
    uid = os.getuid()
    # By default only this launch's part of the log, which is appended to across launches.
    offset = args.get("offset")
    if offset is None and record is not None:
        offset = record.get("log_offset", 0)
    answer = {
        "record": record,
        "running": same_process(record),
        "group": [],
        "others": [],
        "log_before_stop": None,
        "port_open": port_open(args.get("port")),
        "uid": uid,
        "record_error": record_problem(args) if record is None else None,
    }
    if args.get("health") and answer["port_open"]:
        timeout = float(args.get("health_timeout", 10))
        answer["health"] = http_status(args["port"], args["health"], timeout)
    healthy = answer["running"] and answer.get("health", {}).get("status") == 200
    # A server that runs and answers /health is ready whatever its log says: a health check
    # may leave the log's text on the host.
    skip_text = healthy and not args.get("log_when_healthy", True)
    limit = 0 if skip_text else args.get("tail_limit", TAIL_LIMIT)
    answer["log"] = log_state(args["log"], offset, limit)
    if record is not None:
        answer["group"] = [describe(p) for p in group_members(record["pgid"])]
        stopped_at = (record.get("stop") or {}).get("log_size")
        if stopped_at is not None and args.get("offset") is None:
            answer["log_before_stop"] = read_from(args["log"], offset, until=stopped_at)[0]
    group_pids = {p["pid"] for p in answer["group"]}
    answer["others"] = [p for p in vllm_processes(uid) if p["pid"] not in group_pids]
    if args.get("notes"):
        answer["notes"] = {name: read_note(args["state_dir"], name) for name in args["notes"]}
    if args.get("inputs") and answer["running"]:
        answer["inputs"] = compare_inputs((record or {}).get("inputs"), args["inputs"])
    if args.get("when_healthy") and healthy:
        answer["side"] = run_side(args["when_healthy"])
    if args.get("settled") and healthy:
        answer["settled"] = settled_verdict(args, record)
    return answer


# -- "nothing to do": the note a complete deploy leaves ----------------------------------------


def settle(args):
    """Note that the running, ready launch is what the deploy left (``args["settled"]`` gives
    the run's name and the deployment digest)."""
    record = read_record(args)
    if not same_process(record):
        return {"noted": False, "why": "no launch of this deployment runs"}
    health = http_status(args["port"], "/health", float(args.get("health_timeout", 10)))
    if health.get("status") != 200:
        return {"noted": False, "why": f"/health answers {health.get('status')}"}
    asked = args["settled"]
    note = {
        "run": str(asked["run"]),
        "at": time.time(),
        "deployment": deployment_key(asked),
        "launch": [record["pid"], record["start"]],
        "model": listing_digest(str(asked["model"])),
    }
    path = os.path.join(args["state_dir"], SETTLED_NOTE)
    temp = path + ".tmp"
    with open(temp, "w") as f:
        json.dump(note, f)
    os.replace(temp, path)
    return {"noted": True, "why": ""}


def settled_verdict(args, record):
    """Whether the note of the last complete deploy still holds: its run and time, and the
    names of what differs ("note" when there is no readable note)."""
    try:
        with open(os.path.join(args["state_dir"], SETTLED_NOTE)) as f:
            note = json.load(f)
        since = {"run": str(note["run"]), "at": float(note["at"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {"since": None, "differs": ["note"]}
    asked = args["settled"]
    differs = []
    if record is None or note.get("launch") != [record["pid"], record["start"]]:
        differs.append("launch")
    if note.get("deployment") != deployment_key(asked):
        differs.append("deployment")
    if note.get("model") != listing_digest(str(asked["model"])):
        differs.append("model")
    return {"since": since, "differs": differs}


def deployment_key(asked):
    """The deployment's digest with the values of its secrets, hashed here: the secrets come
    in the arguments, which the journal masks; no digest of them leaves the host."""
    total = hashlib.sha256(str(asked["deployment"]).encode())
    for value in sorted(str(v) for v in asked.get("secrets") or ()):
        total.update(b"\0" + value.encode())
    return total.hexdigest()


def listing_digest(folder):
    """A digest of a folder's files, each one's relative path, size and modification time: a
    shard added, removed, rewritten or touched changes it (a full read is 01's to make)."""
    total = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError as e:
                total.update(f"{path}\0{e.strerror}\n".encode())
                continue
            relative = os.path.relpath(path, folder)
            total.update(f"{relative}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return total.hexdigest()


def run_side(argv):
    """The output of a command asked for beside a ready server's status, or why there is none."""
    try:
        done = subprocess.run(
            [str(word) for word in argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=ENGINE_TIMEOUT,
            cwd=os.path.expanduser("~"),
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"exit_code": None, "output": f"not run: {type(e).__name__}"}
    output = (done.stdout + done.stderr).decode(errors="replace")
    return {"exit_code": done.returncode, "output": output[-65536:]}


# -- what a server runs -----------------------------------------------------------------------


def fingerprint(inputs):
    """A digest of each input a server runs: ``{"files": [paths]}`` or ``{"python": path}``."""
    return {name: input_digest(spec) for name, spec in sorted(inputs.items())}


def compare_inputs(recorded, inputs):
    """Each input: "same" or "changed" since the launch started, "unrecorded" when the launch
    did not note it (started by an older opsbook). Only the verdict leaves the host: a digest
    of the secrets file is not worth carrying around."""
    now = fingerprint(inputs)
    recorded = recorded if isinstance(recorded, dict) else {}
    verdicts = {}
    for name, digest in now.items():
        if name not in recorded:
            verdicts[name] = "unrecorded"
        else:
            verdicts[name] = "same" if recorded[name] == digest else "changed"
    return verdicts


def input_digest(spec):
    if "python" in spec:
        return engine_digest(str(spec["python"]))
    total = hashlib.sha256()
    for path in spec.get("files") or []:
        total.update(f"{path}\0{file_digest(path)}\n".encode())
    return total.hexdigest()


def file_digest(path):
    """The sha256 of a file; "absent" or "unreadable: why" otherwise (a file that appears,
    goes, or becomes readable is a change too)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return "absent"
    except OSError as e:
        return f"unreadable: {e.strerror}"
    return digest.hexdigest()


def engine_digest(python):
    """A digest of the interpreter and the vLLM it imports (what ``ENGINE_SCRIPT`` says)."""
    try:
        done = subprocess.run(
            [python, "-c", ENGINE_SCRIPT],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=ENGINE_TIMEOUT,
        )
        said = done.stdout if done.returncode == 0 else b"exit %d" % done.returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        said = f"not run: {type(e).__name__}".encode()
    return hashlib.sha256(said).hexdigest()


def watch(args):
    record = read_record(args)
    offset = args.get("offset")
    if offset is None and record is not None:
        offset = record.get("log_offset", 0)
    deadline = time.monotonic() + min(float(args.get("wait", 0)), WATCH_LIMIT)
    position = offset or 0
    size = file_size(args["log"])
    if size is not None and size < position:
        position = 0  # truncated or replaced: read it from the start, as status does
    steps = 0
    while time.monotonic() < deadline:
        position, found = new_markers(args["log"], position)
        if found or not same_process(record):
            break
        steps += 1
        # The port is looked at twice a second: a server may be ready with its log elsewhere.
        if steps % 10 == 0 and port_open(args.get("port")):
            break
        time.sleep(WATCH_STEP)
    asked = dict(args, offset=offset, health=args.get("health") or "/health")
    asked.setdefault("tail_limit", WATCH_TAIL_LIMIT)
    answer = status(asked)
    answer["watched_steps"] = steps
    return answer


def new_markers(path, position):
    """Where the log now ends, and whether the bytes after ``position`` hold a marker."""
    size = file_size(path)
    if size is None or size <= position:
        return position, False
    overlap = max(len(m) for m in PROOF_MARKERS + ERROR_MARKERS)
    start = max(0, position - overlap, size - WATCH_READ)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return position, False
    found = any(m in data for m in PROOF_MARKERS + ERROR_MARKERS)
    return start + len(data), found


def read_note(state_dir, name):
    """The text of a file the launch noted in the state folder; None when there is none."""
    if os.path.basename(name) != name or name in ("", ".", ".."):
        return None
    try:
        with open(os.path.join(state_dir, name)) as f:
            return f.read(1 << 16)
    except OSError:
        return None


def stop(args):
    answer = stop_group(args)
    if args.get("clean_shm") and stop_allows_start(answer):
        answer["shm"] = clean_shm({"apply": True})
    return answer


def stop_allows_start(answer):
    """The stop went as a start needs: the launch is stopped, or nothing of it ran and no
    other vLLM process of this user runs (as opsbook.steps.server judges it)."""
    if answer["reason"] == "stopped":
        return True
    uid = answer["uid"]
    own = [p for p in answer["refused"] if p.get("uid") in (None, uid)]
    return answer["reason"] in ("no-record", "not-running") and not own


def stop_group(args):
    record = read_record(args)
    answer = {"record": record, "stopped": [], "refused": [], "remaining": [], "uid": os.getuid()}
    others = vllm_processes()
    if record is None:
        answer["reason"] = "no-record"
        answer["refused"] = others
        return answer
    members = group_members(record["pgid"])
    if not members:
        answer["reason"] = "not-running"
        answer["refused"] = others
        return answer
    leader_ok = same_process(record) or not alive(record["pid"])
    mine = set(ancestors())
    if not leader_ok:
        answer["reason"] = "pid-reused"
        answer["refused"] = [describe(p) for p in members]
        return answer
    if mine & set(members) or os.getpgid(0) == record["pgid"]:
        answer["reason"] = "own-session"
        answer["refused"] = [describe(p) for p in members]
        return answer
    # A member that exits between the listing and this look has no owner any more: it is gone,
    # not another user's (seen under load: a stop refused as "other-user").
    foreign = [p for p in members if owner(p) not in (os.getuid(), None)]
    if foreign:
        answer["reason"] = "other-user"
        answer["refused"] = [describe(p) for p in foreign]
        return answer
    answer["stopped"] = [describe(p) for p in members]
    # The signal reaches the API server and its engine processes together: what they log while
    # dying (an engine "died unexpectedly") is the stop's doing, not a crash. Where the log
    # stood when the signal went is recorded so that diagnosis reads only what came before.
    record["stop"] = {"at": time.time(), "log_size": file_size(record["log"]), "by": "opsbook"}
    write_record(args, record)
    answer["signals"] = signal_group(record["pgid"], float(args.get("grace", 10)))
    answer["remaining"] = [describe(p) for p in group_members(record["pgid"])]
    answer["reason"] = "stopped" if not answer["remaining"] else "survived"
    member_pids = set(members)
    answer["refused"] = [p for p in others if p["pid"] not in member_pids]
    return answer


def signal_group(pgid, grace):
    """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL what is left."""
    sent = ["TERM"]
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return sent
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.1)
    if group_members(pgid):
        sent.append("KILL")
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.05)
    return sent


def clean_shm(args):
    uid = os.getuid()
    in_use = open_shm_paths()
    removed, kept = [], []
    try:
        names = sorted(os.listdir(SHM))
    except OSError as e:
        return {"error": f"cannot list {SHM}: {e.strerror}", "removed": [], "kept": []}
    for name in names:
        if not name.startswith(SHM_PREFIXES):
            continue
        path = os.path.join(SHM, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid:
            kept.append({"file": name, "why": f"belongs to uid {st.st_uid}", "mine": False})
        elif path in in_use:
            kept.append({"file": name, "why": f"open in process {in_use[path]}", "mine": True})
        elif args.get("apply", True):
            try:
                os.unlink(path)
                removed.append({"file": name, "bytes": st.st_size})
            except OSError as e:
                kept.append({"file": name, "why": e.strerror, "mine": True})
        else:
            removed.append({"file": name, "bytes": st.st_size, "dry_run": True})
    return {"removed": removed, "kept": kept}


def open_shm_paths():
    """/dev/shm paths some live process has open or mapped, with one such PID."""
    found = {}
    for pid in all_pids():
        for path in fd_targets(pid) + mapped_paths(pid):
            if path.startswith(SHM + "/"):
                found.setdefault(path.split(" (deleted)")[0], pid)
    return found


def fd_targets(pid):
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(os.path.join(folder, name)))
        except OSError:
            pass
    return targets


def mapped_paths(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return [line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6]
    except OSError:
        return []


def http(args):
    # urllib (with http.client and the email parser) costs a probe 35 ms to import: only the
    # operations that need its generality pay for it, not the health check.
    import urllib.error
    import urllib.request

    url = "http://127.0.0.1:{}{}".format(int(args["port"]), args.get("path", "/health"))
    body = args.get("json")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    if data:
        request.add_header("Content-Type", "application/json")
    if args.get("bearer"):
        request.add_header("Authorization", "Bearer " + args["bearer"])
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=float(args.get("timeout", 10))) as r:
            text = r.read(1 << 20).decode(errors="replace")
            return {"status": r.status, "body": text, "seconds": time.monotonic() - started}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read(4096).decode(errors="replace")}
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return {"status": None, "error": str(reason)}


def http_status(port, path, timeout):
    """GET ``path`` on the server's loopback port over a bare HTTP/1.0 socket: the status
    code and the start of the body, without urllib's import cost."""
    started = time.monotonic()
    request = f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode()
    chunks, size = [], 0
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=timeout) as s:
            s.sendall(request)
            while size < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError as e:
        if not chunks:  # a reset after an answer leaves the answer to read
            return {"status": None, "error": str(e)}
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    words = head.split(b"\r\n", 1)[0].split()
    if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        return {"status": None, "error": f"not an HTTP answer: {head[:80]!r}"}
    seconds = time.monotonic() - started
    return {"status": int(words[1]), "body": body.decode(errors="replace"), "seconds": seconds}


def smoke(args):
    """``/health``, ``/v1/models`` and a small completion of the first model, in one go."""
    common = {"port": args["port"], "bearer": args.get("bearer")}
    common["timeout"] = args.get("timeout", 10)
    answer = {"health": http(dict(common, path="/health"))}
    answer["models"] = http(dict(common, path="/v1/models"))
    answer["model"] = first_model(answer["models"])
    answer["completion"] = None
    if answer["model"]:
        body = dict(args.get("completion") or {}, model=answer["model"])
        answer["completion"] = http(dict(common, path="/v1/completions", json=body))
    return answer


def first_model(answer):
    """The first model id of a ``/v1/models`` answer, or None."""
    try:
        return str(json.loads(answer["body"])["data"][0]["id"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


# -- files and ports --------------------------------------------------------------------------


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def read_from(path, offset, limit=TAIL_LIMIT, until=None):
    """The log from byte ``offset`` (at most its last ``limit`` bytes, up to byte ``until``
    when given) and where it ended."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if until is not None and until <= size:
                size = until
            # A log shorter than the offset was truncated or replaced: read it from the start.
            start = offset or 0
            if start > size:
                start = 0
            start = max(start, size - limit)
            f.seek(start)
            data = f.read(size - start)
            return data.decode(errors="replace"), start + len(data)
    except OSError:
        return "", offset or 0


def log_state(path, offset, limit=TAIL_LIMIT):
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False}
    text, end = read_from(path, offset, limit)
    return {
        "exists": True,
        "size": st.st_size,
        "age": time.time() - st.st_mtime,
        "text": text,
        "offset": offset or 0,
        "end": end,
    }


def port_holders(port):
    """Who listens on ``port``: PID and command line where this user may see them, else the
    owner's uid only (another user's process)."""
    holders, owners = [], None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            if int(fields[1].rpartition(":")[2], 16) != int(port):
                continue
            if owners is None:
                owners = socket_owners()
            pid = owners.get(fields[9])
            holder = describe(pid) if pid else {"pid": None, "uid": int(fields[7])}
            if holder not in holders:
                holders.append(holder)
    return holders


def socket_owners():
    """Socket inode to PID, for the processes this user may look into."""
    found = {}
    for pid in all_pids():
        for target in fd_targets(pid):
            if target.startswith("socket:["):
                found.setdefault(target[8:-1], pid)
    return found


def port_open(port):
    if not port:
        return None
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=1):
            return True
    except OSError:
        return False
