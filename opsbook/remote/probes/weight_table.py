"""Probe: what the capacity plan reads of a checkpoint in one round trip: its config texts
and the bytes of its tensors, from every shard's safetensors header (no weight is read).

Stdlib only (Python 3.8+). A tensor's bytes are its ``data_offsets`` span (the download check
is what says whether that span is right). Tensors are summed by name with the expert number
replaced by ``*`` (``...layers.7.mlp.experts.*.down_proj.weight``): a 384-expert MoE's
quarter-million names become a few thousand rows, and how each row is split over the GPUs is
decided by the caller (opsbook.knowledge.capacity), which knows vLLM's sharding.

Args (the dict given to ``main``):
    dir: the checkpoint directory (a Hugging Face cache repo or snapshot folder too).
    files: the config files to read (default: config.json, hf_quant_config.json).
    tensors: read the shard headers (default True); without, the tensors are left empty.

Answer: ``{"model_dir", "error", "files": {name: text or None}, "shards", "unreadable":
[shard, ...], "tensors": [[name, bytes], ...], "amx"}``; ``amx`` says whether the CPU has AMX
tiles (``amx_tile`` in /proc/cpuinfo; None when unreadable), which decides vLLM's KV block
size on a CPU host serving an MLA model.
"""

from __future__ import annotations

import gc
import marshal
import os
import re

from .shard_read import list_folder, locate, read_header, shards_on_disk

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_FILES = ["config.json", "hf_quant_config.json"]
MAX_CONFIG_BYTES = 32 * 1024 * 1024
EXPERT_NUMBER = re.compile(r"\.experts\.\d+\.")
# Below this many shards a second process costs more than the second core gives back.
FORK_MIN_SHARDS = 16


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
    shards = shards_on_disk(list_folder(folder))
    answer["shards"] = len(shards)
    if args.get("tensors", True):
        answer["tensors"], answer["unreadable"] = tensor_table(folder, shards)
    return answer


def tensor_table(folder: str, shards: list[str]) -> tuple[list[list[Any]], list[str]]:
    """``[[name, bytes], ...]`` summed over the shards' headers, and the shards whose header
    could not be read.

    Decoding the headers is CPU work under the GIL (Kimi-K2.5's 119 hold 278,341 tensors):
    with a second core, a forked child sums the first half of the shards while this process
    sums the rest (a process pool needs an importable ``__main__``, which a probe read from
    stdin lacks). A child that fails leaves its half to this process.
    """
    # A large MoE's headers decode into a million small containers, none of them in a cycle:
    # the collector's passes over them and over the caller's modules were a third of the
    # time (0.19 of 0.63 s CPU for Kimi-K2.5's 278,341 tensors, the command's modules loaded).
    collecting = gc.isenabled()
    gc.disable()
    try:
        split = len(shards) // 2 if second_core_pays(shards) else 0
        child = fork_summing(folder, shards[:split]) if split else None
        sums, unreadable = sum_shards(folder, shards[split:])
        if child is not None:
            theirs = child_sums(*child) or sum_shards(folder, shards[:split])
            for name, total in theirs[0].items():
                sums[name] = sums.get(name, 0) + total
            unreadable = theirs[1] + unreadable
    finally:
        if collecting:
            gc.enable()
    return sorted([name, total] for name, total in sums.items()), unreadable


def second_core_pays(shards: list[str]) -> bool:
    """Whether this process may run on two cores or more and has enough shards to share."""
    if len(shards) < FORK_MIN_SHARDS or not hasattr(os, "fork"):
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) >= 2


def sum_shards(folder: str, shards: list[str]) -> tuple[dict[str, int], list[str]]:
    """The tensors' bytes by (expert-folded) name over ``shards``, and those unreadable."""
    sums: dict[str, int] = {}
    unreadable = []
    for shard in shards:
        path = os.path.join(folder, shard)
        try:
            size = os.stat(path).st_size
        except OSError:
            unreadable.append(shard)
            continue
        _, header, status, _ = read_header(path, size)
        if header is None or status != "ok" or not add_tensors(header, sums):
            unreadable.append(shard)
    return sums, unreadable


def fork_summing(folder: str, shards: list[str]) -> tuple[int, int] | None:
    """A child summing ``shards``, answering over a pipe: its pid and the pipe's reading end
    (None when it could not be forked)."""
    try:
        reading, writing = os.pipe()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: answer, then leave without running the parent's exit handlers
        code = 0
        try:
            os.close(reading)
            with os.fdopen(writing, "wb") as out:
                out.write(marshal.dumps(sum_shards(folder, shards)))
        except BaseException:
            code = 1
        os._exit(code)
    os.close(writing)
    return pid, reading


def child_sums(pid: int, reading: int) -> tuple[dict[str, int], list[str]] | None:
    """What the child answered, or None when it failed or answered in part."""
    with os.fdopen(reading, "rb") as answers:
        data = answers.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return None
    try:
        sums, unreadable = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None
    return sums, unreadable


def add_tensors(header: dict[str, Any], sums: dict[str, int]) -> bool:
    """Add one header's tensors' bytes (their ``data_offsets`` span) to ``sums``, an expert's
    under its name with the number replaced by ``*``; False when an entry is malformed (the
    download check names which). The header's ``__metadata__`` is dropped from it."""
    header.pop("__metadata__", None)
    names = list(header)
    # One substitution over the names joined, not a find and a slice per name: Kimi-K2.5's
    # loop 0.18 -> 0.12 s CPU. A name holding a newline would shift the split: then one by one.
    summed = EXPERT_NUMBER.sub(".experts.*.", "\n".join(names)).split("\n")
    if len(summed) != len(names):
        summed = [EXPERT_NUMBER.sub(".experts.*.", name) for name in names]
    get = sums.get
    try:
        # Equal lengths (checked above); zip(strict=) is not in the hosts' Python 3.8.
        for name, entry in zip(summed, header.values()):  # noqa: B905
            begin, end = entry["data_offsets"]
            # JSON numbers come as ints already (int() on each was 25 ms of Kimi-K2.5's plan);
            # text where a number belongs fails the subtraction.
            sums[name] = get(name, 0) + end - begin
    except (KeyError, TypeError, ValueError):
        return False
    return True


def shard_stamps(folder: str, shards: list[str]) -> list[list[Any]]:
    """Each shard's name, size and modification time: what a kept table is valid for."""
    stamps: list[list[Any]] = []
    for shard in shards:
        try:
            info = os.stat(os.path.join(folder, shard))
        except OSError:
            stamps.append([shard, None, None])
            continue
        stamps.append([shard, info.st_size, info.st_mtime_ns])
    return stamps


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
