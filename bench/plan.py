"""Benchmark: ``opsbook plan --offline`` on a local copy of nvidia/Kimi-K2.5-NVFP4's config and
shard headers, against plain Python reading the same files.

Writes the copy as a planner sees it: ``config.json`` (tests/data/plan) and 119 safetensors
files holding the documented 278,341 tensors' headers (tests/data/plan/kimi-k25-nvfp4-tensors.json,
no weights: the plan reads headers only), and a deployment of 8 x RTX PRO 6000 at utilization
0.93. Then it times, each in its own process, taking turns:

* ``opsbook plan -f DEP --offline --gpu-memory 97887`` (the whole CLI: interpreter start,
  imports, the headers, the plan and its knobs), the copy planned before (its tensor table
  kept, as when trying knob after knob) and cold (no table kept: the first plan of a copy);
* ``python3 -c`` reading ``config.json`` and the 119 headers with ``json``: the plainest way
  to touch the same input.

Issue 34's goal: the plan answers in under 0.5 s offline, the first plan of a copy included.

Usage: ``.venv/bin/python bench/plan.py [--runs 7] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import benchtable

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "plan"
SHARDS = 119
GOAL_SECONDS = 0.5
DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
PLAIN = (
    "import json, os, struct, sys\n"
    "folder = sys.argv[1]\n"
    "json.load(open(os.path.join(folder, 'config.json')))\n"
    "for name in sorted(os.listdir(folder)):\n"
    "    if name.endswith('.safetensors'):\n"
    "        with open(os.path.join(folder, name), 'rb') as f:\n"
    "            (n,) = struct.unpack('<Q', f.read(8))\n"
    "            json.loads(f.read(n))\n"
)


def tensors() -> list[tuple[str, str, list[int]]]:
    """The documented tensor table, expanded over layers, experts and encoder blocks."""
    doc = json.loads((DATA / "kimi-k25-nvfp4-tensors.json").read_text())
    found = []
    for group in doc["groups"]:
        for i in range(*group.get("layers", [0, 1])):
            for j in range(*group.get("experts", [0, 1])):
                for k in range(*group.get("blocks", [0, 1])):
                    for name, shape, dtype in group["tensors"]:
                        found.append((name.format(i=i, j=j, k=k), dtype, shape))
    return found


def write_checkpoint(folder: Path) -> None:
    """config.json and 119 shards of headers only, the tensors dealt out in order."""
    folder.mkdir()
    shutil.copy(DATA / "kimi-k25-nvfp4-config.json", folder / "config.json")
    table = tensors()
    per_shard = -(-len(table) // SHARDS)
    for index in range(SHARDS):
        header, offset = {}, 0
        for name, dtype, shape in table[index * per_shard : (index + 1) * per_shard]:
            size = math.prod(shape) * DTYPE_BYTES[dtype]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()  # as safetensors writes it
        name = f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"
        (folder / name).write_bytes(struct.pack("<Q", len(text)) + text)


def write_deployment(path: Path, model: Path) -> None:
    doc = {
        "name": "kimi-k25-nvfp4-bench",
        "hosts": [{"address": "127.0.0.1", "user": "nobody"}],
        "model": {"path": str(model)},
        "python": "/usr/bin/python3",
        "server": {
            "port": 8000,
            "args": {"tensor-parallel-size": 8, "gpu-memory-utilization": 0.93},
        },
    }
    path.write_text(json.dumps(doc))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command")
    parser.add_argument("--keep", action="store_true", help="keep the generated copy")
    args = parser.parse_args()
    benchtable.as_installed()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-bench-plan-"))
    try:
        model = folder / "Kimi-K2.5-NVFP4"
        write_checkpoint(model)
        deployment = folder / "dep.yml"
        write_deployment(deployment, model)
        command = ["-m", "opsbook.cli", "plan", "-f", str(deployment), "--offline"]
        command += ["--gpu-memory", "97887", "--runs-dir", str(folder / "runs")]
        warm = ["env", f"XDG_CACHE_HOME={folder / 'cache'}", sys.executable, *command]
        # A cache folder that cannot be made: every run reads all the headers.
        cold = ["env", "XDG_CACHE_HOME=/dev/null/cache", sys.executable, *command]
        plain = [sys.executable, "-c", PLAIN, str(model)]
        shown = subprocess.run(warm, capture_output=True, text=True).stdout.splitlines()
        timed = benchtable.interleaved(args.runs, warm, cold, plain)
        (warm_s, code), (cold_s, _), (plain_s, _) = timed
        print(f"opsbook plan --offline (exit {code}): {shown[0]}")
        print(f"  planned before: {warm_s:.3f} s; cold: {cold_s:.3f} s")
        print(f"python3 reading config.json and {SHARDS} headers: {plain_s:.3f} s")
        benchtable.header("capacity plan")
        for label, seconds in (
            ("copy planned before", warm_s),
            ("first plan of the copy", cold_s),
        ):
            benchtable.row(
                f"plan --offline, Kimi-K2.5-NVFP4 ({SHARDS} shard headers), {label}",
                benchtable.seconds(seconds),
                f"python3 json {benchtable.seconds(plain_s)}",
                seconds / plain_s,
                f"< {GOAL_SECONDS} s: {benchtable.verdict(seconds < GOAL_SECONDS)}",
            )
    finally:
        if args.keep:
            print(f"kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
