"""Probe: what the capacity plan reads of a checkpoint in one round trip: its config texts
and the bytes of its tensors, from every shard's safetensors header (no weight is read).

Stdlib only (Python 3.8+). Tensors are summed by name with the expert number replaced by
``*`` (``...layers.7.mlp.experts.*.down_proj.weight``): a 384-expert MoE's quarter-million
names become a few thousand rows, and how each row is split over the GPUs is decided by the
caller (opsbook.knowledge.capacity), which knows vLLM's sharding.

Args (the dict given to ``main``):
    dir: the checkpoint directory (a Hugging Face cache repo or snapshot folder too).
    files: the config files to read (default: config.json, hf_quant_config.json).

Answer: ``{"model_dir", "error", "files": {name: text or None}, "shards", "unreadable":
[shard, ...], "tensors": [[name, bytes], ...], "amx"}``; ``amx`` says whether the CPU has AMX
tiles (``amx_tile`` in /proc/cpuinfo; None when unreadable), which decides vLLM's KV block
size on a CPU host serving an MLA model.
"""

from __future__ import annotations

import os
import re

from .shard_read import DTYPE_BITS, list_folder, locate, read_header, shards_on_disk

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_FILES = ["config.json", "hf_quant_config.json"]
MAX_CONFIG_BYTES = 32 * 1024 * 1024
EXPERT_NUMBER = re.compile(r"\.experts\.\d+\.")


def main(args: dict[str, Any]) -> dict[str, Any]:
    where = locate(os.path.expanduser(str(args["dir"])))
    answer: dict[str, Any] = {
        "model_dir": where["model_dir"], "error": where["error"], "files": {},
        "shards": 0, "unreadable": [], "tensors": [], "amx": cpu_has_amx(),
    }  # fmt: skip
    if where["error"]:
        return answer
    folder = where["model_dir"]
    for name in args.get("files") or CONFIG_FILES:
        answer["files"][name] = read_text(os.path.join(folder, name))
    sums: dict[str, int] = {}
    shards = shards_on_disk(list_folder(folder))
    answer["shards"] = len(shards)
    for shard in shards:
        path = os.path.join(folder, shard)
        try:
            size = os.stat(path).st_size
        except OSError:
            answer["unreadable"].append(shard)
            continue
        _, header, status, _ = read_header(path, size)
        if header is None or status != "ok":
            answer["unreadable"].append(shard)
            continue
        add_tensors(header, sums)
    answer["tensors"] = sorted([name, total] for name, total in sums.items())
    return answer


def add_tensors(header: dict[str, Any], sums: dict[str, int]) -> None:
    """Add one header's tensors' bytes to ``sums``, experts summed under one name."""
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        bits = DTYPE_BITS.get(str(entry.get("dtype")), 8)
        count = 1
        for dim in entry.get("shape") or ():
            count *= int(dim)
        key = EXPERT_NUMBER.sub(".experts.*.", name)
        sums[key] = sums.get(key, 0) + (count * bits + 7) // 8


def read_text(path: str) -> str | None:
    """A config file's text; None when it is absent, unreadable or too large to be one."""
    try:
        if os.path.getsize(path) > MAX_CONFIG_BYTES:
            return None
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_has_amx(path: str = "/proc/cpuinfo") -> bool | None:
    """Whether the first CPU's flags hold ``amx_tile``; None when they cannot be read."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        return None
    return None
