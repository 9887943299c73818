"""Benchmark: one download probe for all shards vs one remote call per shard.

Checks a synthetic 119-shard checkpoint (sparse, ~547 GB apparent) on this machine both ways
and prints the ratio. The plain way starts one ``python3 -c`` per shard that stats the file
and reads its safetensors header, standing in for one ``ssh host ...`` call per shard; over a
real network each of those calls also pays a connection round trip, so the ratio here is a
lower bound.

Usage: ``.venv/bin/python bench/download.py [--shards 119] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from opsbook import probes
from opsbook.checkpoint import make_checkpoint

PYTHON = "/usr/bin/python3"
PER_SHARD = (
    "import json, os, struct, sys; p = sys.argv[1]; s = os.stat(p).st_size; "
    "f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); "
    "e = max(v['data_offsets'][1] for k, v in h.items() if k != '__metadata__'); "
    "print(s == 8 + n + e)"
)


def one_probe(model_dir: Path) -> int:
    """The opsbook way: one probe run checks every shard; returns the shards found ok."""
    answer = probes.run_local("download", {"op": "check", "path": str(model_dir)}, python=PYTHON)
    ok: int = answer["summary"]["ok"]
    return ok


def call_per_shard(model_dir: Path) -> int:
    """The plain way: one interpreter start per shard; returns the shards found ok."""
    ok = 0
    for shard in sorted(model_dir.glob("model-*.safetensors")):
        out = subprocess.run(
            [PYTHON, "-c", PER_SHARD, str(shard)], capture_output=True, text=True, check=True
        )
        ok += out.stdout.strip() == "True"
    return ok


def best_of(repeat: int, run: Callable[[Path], int], model_dir: Path) -> tuple[float, int]:
    """The fastest of ``repeat`` runs, in seconds, and what the run returned."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = run(model_dir)
        times.append(time.perf_counter() - started)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=119)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="opsbook-bench-") as folder:
        started = time.perf_counter()
        model_dir = make_checkpoint(Path(folder) / "Kimi-K2.5-NVFP4", shards=options.shards)
        made = time.perf_counter() - started
        probe_s, probe_ok = best_of(options.repeat, one_probe, model_dir)
        plain_s, plain_ok = best_of(options.repeat, call_per_shard, model_dir)
    print(f"checkpoint: {options.shards} shards, generated in {made:.2f} s")
    print(f"one probe         : {probe_s:7.3f} s  ({probe_ok} shards ok)")
    print(f"one call per shard: {plain_s:7.3f} s  ({plain_ok} shards ok)")
    print(f"ratio (per-shard / probe): {plain_s / probe_s:.1f}x")


if __name__ == "__main__":
    main()
