"""Benchmark: the download check as one probe vs one SSH round trip per shard.

Starts a rehearsal host of its own (a real sshd on 127.0.0.8, in a temporary folder under
/tmp), writes the synthetic 119-shard checkpoint (sparse, ~547 GB apparent) in its login
user's home, then checks it over SSH both ways and prints both times and their ratio:

* opsbook: ``download.check_download``, one run of the ``download`` probe for all shards;
* the plain way: one ``host.run`` per shard (``stat`` for the size, ``od`` and ``dd`` for the
  safetensors header), after one ``ls`` for the shard names, the header parsed here.

Both run over the same open connection, so the ratio is the cost of the round trips on
loopback; over a real network each round trip costs more and the ratio grows. The same
comparison without SSH (one interpreter start per shard vs one probe run, locally) is
printed too. The rehearsal host is stopped at the end.

Usage: ``.venv/bin/python bench/download.py [--shards 119] [--repeat 2]`` (as root: the
rehearsal host creates its login user).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from opsbook import download, probes
from opsbook import sandbox as sandboxes
from opsbook.checkpoint import make_checkpoint
from opsbook.hosts import Host
from opsbook.sandbox import Sandbox

ADDRESS = "127.0.0.8"
PYTHON = "/usr/bin/python3"
PER_SHARD_SSH = (
    'f={path}; stat -c %s -- "$f"; n=$(head -c 8 -- "$f" | od -An -tu8 | tr -d \' \'); '
    'echo "$n"; dd if="$f" iflag=skip_bytes,count_bytes skip=8 count="$n" status=none'
)
PER_SHARD_LOCAL = (
    "import json, os, struct, sys; p = sys.argv[1]; s = os.stat(p).st_size; "
    "f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); "
    "e = max(v['data_offsets'][1] for k, v in h.items() if k != '__metadata__'); "
    "print(s == 8 + n + e)"
)
T = TypeVar("T")


# --- over SSH -------------------------------------------------------------------------------


def one_probe(host: Host, model_dir: str) -> int:
    """The opsbook way: one probe run checks every shard; returns the shards found ok."""
    ok: int = download.check_download(host, model_dir).data["summary"]["ok"]
    return ok


def round_trip_per_shard(host: Host, model_dir: str) -> int:
    """The plain way: list the shards, then one command per shard; returns the shards ok."""
    names = host.run(f"ls -1 -- {shlex.quote(model_dir)}", check=True).stdout.split()
    ok = 0
    for name in sorted(n for n in names if n.endswith(".safetensors")):
        path = shlex.quote(f"{model_dir}/{name}")
        out = host.run(PER_SHARD_SSH.format(path=path), check=True).stdout
        ok += header_agrees(out)
    return ok


def header_agrees(output: str) -> bool:
    """Whether ``size``, ``header length`` and the header's last offset add up."""
    size, length, header = output.split("\n", 2)
    tensors = json.loads(header)
    end = max(v["data_offsets"][1] for k, v in tensors.items() if k != "__metadata__")
    return int(size) == 8 + int(length) + end


# --- on this machine ------------------------------------------------------------------------


def one_probe_local(model_dir: str) -> int:
    """One probe run with the local python."""
    answer = probes.run_local("download", {"op": "check", "path": model_dir}, python=PYTHON)
    ok: int = answer["summary"]["ok"]
    return ok


def interpreter_per_shard(model_dir: str) -> int:
    """One ``python3 -c`` per shard, as a per-shard remote call would start one."""
    ok = 0
    for shard in sorted(Path(model_dir).glob("model-*.safetensors")):
        out = subprocess.run(
            [PYTHON, "-c", PER_SHARD_LOCAL, str(shard)], capture_output=True, text=True, check=True
        )
        ok += out.stdout.strip() == "True"
    return ok


# --- measuring ------------------------------------------------------------------------------


def best_of(repeat: int, run: Callable[[], T]) -> tuple[float, T]:
    """The fastest of ``repeat`` runs, in seconds, and what the last run returned."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return min(times), result


def checkpoint_for(box: Sandbox, shards: int) -> str:
    """The synthetic checkpoint in the login user's home, owned by that user."""
    model_dir = make_checkpoint(Path(box.home) / "bench" / "Kimi-K2.5-NVFP4", shards=shards)
    if os.geteuid() == 0:
        owner = pwd.getpwnam(box.user)
        for folder, dirs, files in os.walk(Path(box.home) / "bench"):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.chown(name, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
    return str(model_dir)


def report(label: str, seconds: float, ok: int) -> None:
    print(f"{label:<32}: {seconds:7.3f} s  ({ok} shards ok)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=119)
    parser.add_argument("--repeat", type=int, default=2)
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-bench-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    try:
        started = time.perf_counter()
        box = sandboxes.up(folder, address=ADDRESS, checkpoint=False)
        model_dir = checkpoint_for(box, options.shards)
        print(
            f"rehearsal host and {options.shards}-shard checkpoint ready in "
            f"{time.perf_counter() - started:.1f} s ({box.user}@{box.address}:{box.port})"
        )
        with Host(box.host_spec()) as host:
            host.run("true", check=True)  # connect once, outside the measurements
            probe_s, probe_ok = best_of(options.repeat, lambda: one_probe(host, model_dir))
            plain_s, plain_ok = best_of(
                options.repeat, lambda: round_trip_per_shard(host, model_dir)
            )
        local_probe_s, local_probe_ok = best_of(options.repeat, lambda: one_probe_local(model_dir))
        local_plain_s, local_plain_ok = best_of(
            options.repeat, lambda: interpreter_per_shard(model_dir)
        )
    finally:
        sandboxes.down(folder)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"over SSH (best of {options.repeat}):")
    report("  one probe", probe_s, probe_ok)
    report(f"  {options.shards + 1} round trips (ls + 1/shard)", plain_s, plain_ok)
    print(f"  ratio (per-shard / probe): {plain_s / probe_s:.1f}x")
    print("on this machine, no SSH:")
    report("  one probe", local_probe_s, local_probe_ok)
    report("  one python3 per shard", local_plain_s, local_plain_ok)
    print(f"  ratio (per-shard / probe): {local_plain_s / local_probe_s:.1f}x")


if __name__ == "__main__":
    main()
