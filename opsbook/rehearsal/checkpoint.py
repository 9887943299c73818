"""Synthetic checkpoints shaped like ``nvidia/Kimi-K2.5-NVFP4``, for the rehearsal host and tests.

:func:`make_checkpoint` writes the real ``config.json`` of the checkpoint, an
``hf_quant_config.json`` in the shape of its sibling K2.6's, tokenizer files, the index and
sparse shards whose safetensors headers follow the documented NVFP4 tensor layout. The
default (119 shards, about 547 GB apparent) costs a few MB of disk and about a second.

Each shard lists a representative subset of its tensors with their real shapes and dtypes,
followed by one ``synthetic.fill.<NNNNN>`` U8 tensor that takes up the rest of the shard, so
that headers stay small while sizes, offsets and the index agree exactly.

The fault helpers (:func:`truncate_shard`, :func:`corrupt_header`,
:func:`start_download_simulation`) turn a good checkpoint into the field failures that the
download check must report.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_REPO_ID = "nvidia/Kimi-K2.5-NVFP4"
DEFAULT_SHARDS = 119
DEFAULT_SHARD_BYTES = 4_600_000_000
DEFAULT_REVISION = "3f1c2b8e9d4a7c6b5e0f1a2d3c4b5a6978e8f9d0"
INDEX_NAME = "model.safetensors.index.json"
LAYOUTS = ("local-dir", "hf-cache")
# Above this size a shard's real sha256 costs seconds per shard, so names are derived instead.
HASH_LIMIT = 64 * 1024 * 1024

DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
HIDDEN = 7168
EXPERTS = 384
FIRST_DENSE_LAYERS = 1
VISION_BLOCKS_LISTED = 1

TOKENIZER_CONFIG: dict[str, Any] = {
    "added_tokens_decoder": {
        "163584": {"content": "[BOS]", "special": True},
        "163585": {"content": "[EOS]", "special": True},
        "163606": {"content": "<think>", "special": False},
        "163607": {"content": "</think>", "special": False},
        "163839": {"content": "[PAD]", "special": True},
    },
    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    "bos_token": "[BOS]",
    "clean_up_tokenization_spaces": False,
    "eos_token": "[EOS]",
    "extra_special_tokens": {},
    "model_max_length": 1000000000000000019884624838656,
    "pad_token": "[PAD]",
    "tokenizer_class": "TikTokenTokenizer",
    "unk_token": "[UNK]",
}
GENERATION_CONFIG = {"bos_token_id": 163584, "eos_token_id": 163585, "max_length": 262144}
# The modules config.json and tokenizer_config.json name in auto_map (loaded with
# --trust-remote-code); the synthetic checkpoint carries placeholders under the same names.
REMOTE_CODE = (
    "configuration_kimi_k25.py",
    "modeling_kimi_k25.py",
    "configuration_deepseek.py",
    "modeling_deepseek.py",
    "tokenization_kimi.py",
)
REMOTE_CODE_STUB = '"""Placeholder for {name} of {repo} (synthetic checkpoint)."""\n'


@dataclass(frozen=True)
class TensorSpec:
    """One tensor in a shard header: its name, safetensors dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Shard:
    """A shard to write: its file name, header prefix (8-byte length + JSON) and final size."""

    name: str
    prefix: bytes
    size: int
    tensors: tuple[str, ...]


def make_checkpoint(
    path: Path,
    *,
    shards: int = DEFAULT_SHARDS,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    layout: str = "local-dir",
    repo_id: str = DEFAULT_REPO_ID,
    layers: int = 61,
    experts_per_shard: int = 4,
    revision: str = DEFAULT_REVISION,
    kv_cache_fp8: bool = True,
    hashes: bool | None = None,
) -> Path:
    """Write a synthetic checkpoint and return the directory a server would be pointed at.

    Args:
        path: for ``local-dir``, the model directory; for ``hf-cache``, the hub cache root
            (what ``HF_HUB_CACHE`` names).
        shards: number of ``model-NNNNN-of-NNNNN.safetensors`` files.
        shard_bytes: apparent size of each shard (larger if its listed tensors need more).
        layout: ``local-dir`` (``hf download --local-dir``) or ``hf-cache`` (the hub cache).
        repo_id: the repository the files claim to come from.
        layers: decoder layers to spread over the shards.
        experts_per_shard: routed experts listed in full in each MoE shard.
        revision: the 40-hex commit of the snapshot and of the local-dir metadata.
        kv_cache_fp8: keep the checkpoint's FP8 KV-cache settings (the incident's cause).
        hashes: compute real sha256 of shards (blob names, etags); by default only when
            ``shard_bytes`` is at most 64 MiB. Otherwise names are derived from the header
            and size, and a full hash check reports them as mismatches.

    Returns:
        The model directory: ``path`` itself, or ``snapshots/<revision>`` in the cache.

    Raises:
        ValueError: on an unknown layout or a non-positive shard count.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if shards < 1 or layers < 1:
        raise ValueError("shards and layers must be at least 1")
    real_hashes = shard_bytes <= HASH_LIMIT if hashes is None else hashes
    plan = [
        build_shard(k, shards, tensors, shard_bytes)
        for k, tensors in enumerate(plan_tensors(shards, layers, experts_per_shard))
    ]
    small = small_files(plan, kv_cache_fp8)
    if layout == "local-dir":
        return write_local_dir(Path(path), small, plan, revision, real_hashes)
    return write_hf_cache(Path(path), repo_id, small, plan, revision, real_hashes)


def plan_tensors(shards: int, layers: int, experts_per_shard: int) -> list[list[TensorSpec]]:
    """Spread the model's tensors over ``shards`` files, in the order a real export writes them.

    Args:
        shards: number of shards.
        layers: number of decoder layers.
        experts_per_shard: routed experts listed per MoE shard.

    Returns:
        One list of tensors per shard.
    """
    shard_layers = [
        0 if shards == 1 else round(k * (layers - 1) / (shards - 1)) for k in range(shards)
    ]
    per_layer = {layer: shard_layers.count(layer) for layer in set(shard_layers)}
    plan: list[list[TensorSpec]] = []
    for k, layer in enumerate(shard_layers):
        tensors: list[TensorSpec] = []
        if k == 0:
            tensors += embedding_tensors()
        position = shard_layers[:k].count(layer)
        if position == 0:
            tensors += layer_head_tensors(layer)
        if layer >= FIRST_DENSE_LAYERS:
            tensors += expert_tensors(layer, position, per_layer[layer], experts_per_shard)
        if k == shards - 1:
            tensors += final_tensors()
        plan.append(tensors)
    return plan


def expert_tensors(
    layer: int, position: int, shards: int, experts_per_shard: int
) -> list[TensorSpec]:
    """The routed experts' tensors in the ``position``-th of a layer's ``shards`` shards.

    When the layer has more shards than its experts fill (``experts_per_shard`` each), the
    experts are listed again in later rounds, each round holding its own share of every
    expert's tensors, as an export splits an expert across files: no tensor is in two shards.
    """
    rounds = -(-shards * experts_per_shard // EXPERTS)
    start = position * experts_per_shard
    first, turn = start % EXPERTS, start // EXPERTS
    tensors: list[TensorSpec] = []
    for expert in range(first, min(first + experts_per_shard, EXPERTS)):
        linear = nvfp4_linear(f"{_layer(layer)}.mlp.experts.{expert}", 2048)
        tensors += linear[turn::rounds]
    return tensors


def embedding_tensors() -> list[TensorSpec]:
    """Token embedding, a representative vision block and the multimodal projector (BF16)."""
    block = "vision_tower.encoder.blocks"
    tensors = [
        TensorSpec("language_model.model.embed_tokens.weight", "BF16", (163840, HIDDEN)),
        TensorSpec("vision_tower.patch_embed.proj.weight", "BF16", (1152, 3, 14, 14)),
        TensorSpec("vision_tower.patch_embed.proj.bias", "BF16", (1152,)),
        TensorSpec("vision_tower.patch_embed.pos_emb.weight", "BF16", (64, 64, 1152)),
    ]
    for k in range(VISION_BLOCKS_LISTED):
        tensors += [
            TensorSpec(f"{block}.{k}.wqkv.weight", "BF16", (3456, 1152)),
            TensorSpec(f"{block}.{k}.wqkv.bias", "BF16", (3456,)),
            TensorSpec(f"{block}.{k}.wo.weight", "BF16", (1152, 1152)),
            TensorSpec(f"{block}.{k}.norm0.weight", "BF16", (1152,)),
            TensorSpec(f"{block}.{k}.mlp.fc0.weight", "BF16", (4304, 1152)),
            TensorSpec(f"{block}.{k}.mlp.fc1.weight", "BF16", (1152, 4304)),
        ]
    return tensors + [
        TensorSpec("vision_tower.encoder.final_layernorm.weight", "BF16", (1152,)),
        TensorSpec("mm_projector.pre_norm.weight", "BF16", (1152,)),
        TensorSpec("mm_projector.proj.0.weight", "BF16", (4608, 4608)),
        TensorSpec("mm_projector.proj.2.weight", "BF16", (HIDDEN, 4608)),
    ]


def layer_head_tensors(layer: int) -> list[TensorSpec]:
    """Norms, MLA attention (BF16, FP8 KV scales) and the dense MLP or router + shared expert."""
    prefix = _layer(layer)
    attn = f"{prefix}.self_attn"
    tensors = [
        TensorSpec(f"{prefix}.input_layernorm.weight", "BF16", (HIDDEN,)),
        TensorSpec(f"{attn}.q_a_proj.weight", "BF16", (1536, HIDDEN)),
        TensorSpec(f"{attn}.q_a_layernorm.weight", "BF16", (1536,)),
        TensorSpec(f"{attn}.q_b_proj.weight", "BF16", (12288, 1536)),
        TensorSpec(f"{attn}.kv_a_proj_with_mqa.weight", "BF16", (576, HIDDEN)),
        TensorSpec(f"{attn}.kv_a_layernorm.weight", "BF16", (512,)),
        TensorSpec(f"{attn}.kv_b_proj.weight", "BF16", (16384, 512)),
        TensorSpec(f"{attn}.o_proj.weight", "BF16", (HIDDEN, 8192)),
        TensorSpec(f"{attn}.k_proj.k_scale", "F32", ()),
        TensorSpec(f"{attn}.v_proj.v_scale", "F32", ()),
        TensorSpec(f"{prefix}.post_attention_layernorm.weight", "BF16", (HIDDEN,)),
    ]
    if layer < FIRST_DENSE_LAYERS:
        return tensors + nvfp4_linear(f"{prefix}.mlp", 18432)
    return tensors + [
        TensorSpec(f"{prefix}.mlp.gate.weight", "BF16", (EXPERTS, HIDDEN)),
        TensorSpec(f"{prefix}.mlp.gate.e_score_correction_bias", "BF16", (EXPERTS,)),
        *nvfp4_linear(f"{prefix}.mlp.shared_experts", 2048),
    ]


def nvfp4_linear(prefix: str, intermediate: int) -> list[TensorSpec]:
    """gate/up/down projections in NVFP4: packed U8 weight, F8 block scales, F32 scalars."""
    tensors: list[TensorSpec] = []
    for proj, rows, cols in (
        ("gate_proj", intermediate, HIDDEN),
        ("up_proj", intermediate, HIDDEN),
        ("down_proj", HIDDEN, intermediate),
    ):
        name = f"{prefix}.{proj}"
        tensors += [
            TensorSpec(f"{name}.weight", "U8", (rows, cols // 2)),
            TensorSpec(f"{name}.weight_scale", "F8_E4M3", (rows, cols // 16)),
            TensorSpec(f"{name}.weight_scale_2", "F32", ()),
            TensorSpec(f"{name}.input_scale", "F32", ()),
        ]
    return tensors


def final_tensors() -> list[TensorSpec]:
    """The final norm and the (unquantized) output head."""
    return [
        TensorSpec("language_model.model.norm.weight", "BF16", (HIDDEN,)),
        TensorSpec("language_model.lm_head.weight", "BF16", (163840, HIDDEN)),
    ]


def shard_name(index: int, total: int) -> str:
    """The huggingface_hub file name of shard ``index`` (1-based) of ``total``."""
    return f"model-{index:05d}-of-{total:05d}.safetensors"


def build_shard(k: int, total: int, tensors: Sequence[TensorSpec], shard_bytes: int) -> Shard:
    """Lay ``tensors`` out in shard ``k`` (0-based) and fill it to ``shard_bytes``.

    Tensors that do not fit the budget are left out, so small test shards keep the small
    tensors (norms, scales) and drop the large ones.

    Args:
        k: 0-based shard position.
        total: number of shards.
        tensors: candidate tensors, in order.
        shard_bytes: wanted file size.

    Returns:
        The shard's name, header prefix, final size and tensor names.
    """
    budget = shard_bytes - 8 - 256 - 200 * len(tensors)
    kept: list[TensorSpec] = []
    for tensor in tensors:
        if tensor.nbytes <= budget:
            kept.append(tensor)
            budget -= tensor.nbytes
    fill_name = f"synthetic.fill.{k + 1:05d}"
    fill = 0
    for _ in range(8):
        prefix = header_prefix(kept, fill_name, fill)
        wanted = shard_bytes - len(prefix) - sum(t.nbytes for t in kept)
        if wanted == fill or (wanted < 0 and fill == 0):
            break
        fill = max(wanted, 0)
    prefix = header_prefix(kept, fill_name, fill)
    size = len(prefix) + sum(t.nbytes for t in kept) + fill
    names = tuple(t.name for t in kept) + ((fill_name,) if fill else ())
    return Shard(shard_name(k + 1, total), prefix, size, names)


def header_prefix(tensors: Sequence[TensorSpec], fill_name: str, fill: int) -> bytes:
    """The first bytes of a safetensors file: u64 LE header length, then the padded JSON.

    Args:
        tensors: tensors in storage order (offsets are contiguous from 0).
        fill_name: name of the trailing fill tensor.
        fill: bytes of the fill tensor; it is omitted when 0.

    Returns:
        The 8-byte length followed by the JSON header, padded with spaces to a multiple of 8.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        end = offset + tensor.nbytes
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    if fill:
        header[fill_name] = {
            "dtype": "U8",
            "shape": [fill],
            "data_offsets": [offset, offset + fill],
        }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def small_files(plan: Sequence[Shard], kv_cache_fp8: bool) -> dict[str, bytes]:
    """config.json, hf_quant_config.json, tokenizer files and the index, as file contents."""
    config = load_config()
    quant = build_hf_quant_config(config)
    if not kv_cache_fp8:
        config["quantization_config"].pop("kv_cache_scheme", None)
        quant["quantization"].pop("kv_cache_quant_algo", None)
    weight_map = {name: shard.name for shard in plan for name in shard.tensors}
    total = sum(shard.size - len(shard.prefix) for shard in plan)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return {
        "config.json": _json_bytes(config, 4),
        "hf_quant_config.json": _json_bytes(quant, 4),
        "generation_config.json": _json_bytes(GENERATION_CONFIG, 2),
        "tokenizer_config.json": _json_bytes(TOKENIZER_CONFIG, 2),
        **{
            name: REMOTE_CODE_STUB.format(name=name, repo=DEFAULT_REPO_ID).encode()
            for name in REMOTE_CODE
        },
        "tiktoken.model": b"IQ== 0\nIg== 1\nIw== 2\nJA== 3\n",
        INDEX_NAME: _json_bytes(index, 2),
    }


def load_config() -> dict[str, Any]:
    """The real config.json of nvidia/Kimi-K2.5-NVFP4 (shipped in ``opsbook/rehearsal/data``)."""
    text = (
        resources.files("opsbook.rehearsal").joinpath("data/kimi-k25-nvfp4-config.json").read_text()
    )
    config: dict[str, Any] = json.loads(text)
    return config


def build_hf_quant_config(config: dict[str, Any]) -> dict[str, Any]:
    """An hf_quant_config.json in the shape of Kimi-K2.6-NVFP4's, matching ``config``.

    ModelOpt writes ``config.json``'s ``quantization_config.ignore`` from the same list as
    ``exclude_modules``, so the K2.5 file is rebuilt from K2.5's own config in K2.6's shape.
    """
    text = resources.files("opsbook.rehearsal").joinpath("data/kimi-k26-nvfp4-hf_quant_config.json")
    shape: dict[str, Any] = json.loads(text.read_text())
    quant = config["quantization_config"]
    shape["producer"] = dict(quant["producer"])
    shape["quantization"] = {
        "quant_algo": quant["quant_algo"],
        "kv_cache_quant_algo": "FP8",
        "group_size": quant["config_groups"]["group_0"]["weights"]["group_size"],
        "exclude_modules": list(quant["ignore"]),
    }
    return shape


def write_local_dir(
    model_dir: Path,
    small: dict[str, bytes],
    plan: Sequence[Shard],
    revision: str,
    real_hashes: bool,
) -> Path:
    """Write the ``hf download --local-dir`` layout, with ``.cache/huggingface`` metadata."""
    download = model_dir / ".cache" / "huggingface" / "download"
    download.mkdir(parents=True, exist_ok=True)
    (model_dir / ".cache" / "huggingface" / ".gitignore").write_text("*\n")
    etags: dict[str, str] = {}
    for name, content in small.items():
        (model_dir / name).write_bytes(content)
        etags[name] = _small_file_etag(name, content)
    for shard in plan:
        write_sparse(model_dir / shard.name, shard)
        etags[shard.name] = shard_etag(model_dir / shard.name, shard, real_hashes)
    # Written after the files: huggingface_hub trusts metadata only if mtime - 1 <= timestamp.
    for name, etag in etags.items():
        (download / f"{name}.metadata").write_text(f"{revision}\n{etag}\n{time.time()}\n")
    return model_dir


def write_hf_cache(
    cache: Path,
    repo_id: str,
    small: dict[str, bytes],
    plan: Sequence[Shard],
    revision: str,
    real_hashes: bool,
) -> Path:
    """Write the hub cache layout: blobs named by hash, snapshot symlinks, ``refs/main``."""
    repo = cache / repo_folder(repo_id)
    blobs = repo / "blobs"
    snapshot = repo / "snapshots" / revision
    for folder in (blobs, snapshot, repo / "refs"):
        folder.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for name, content in small.items():
        blob = _small_file_etag(name, content)
        (blobs / blob).write_bytes(content)
        _relink(snapshot / name, f"../../blobs/{blob}")
    for shard in plan:
        staging = blobs / f"{shard.name}.staging"
        write_sparse(staging, shard)
        blob = shard_etag(staging, shard, real_hashes)
        os.replace(staging, blobs / blob)
        _relink(snapshot / shard.name, f"../../blobs/{blob}")
    return snapshot


def repo_folder(repo_id: str) -> str:
    """The cache folder of a model repository: ``models--org--name``."""
    return "models--" + repo_id.replace("/", "--")


def write_sparse(path: Path, shard: Shard) -> None:
    """Write the header, then extend the file to its size without writing the data blocks."""
    with open(path, "wb") as handle:
        handle.write(shard.prefix)
        handle.truncate(shard.size)


def shard_etag(path: Path, shard: Shard, real_hashes: bool) -> str:
    """sha256 of the shard's content, or a stand-in derived from its header and size."""
    if real_hashes:
        return sha256_file(path)
    return hashlib.sha256(shard.prefix + str(shard.size).encode()).hexdigest()


def sha256_file(path: Path, chunk: int = 8 * 1024 * 1024) -> str:
    """sha256 of a file's content, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a file, which names non-LFS blobs in the hub cache."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def shard_path(model_dir: Path, index: int) -> Path:
    """The file of shard ``index`` (1-based) in ``model_dir``, following cache symlinks.

    Raises:
        FileNotFoundError: when no shard has that index.
    """
    matches = sorted(model_dir.glob(f"model-{index:05d}-of-*.safetensors"))
    if not matches:
        raise FileNotFoundError(f"no shard {index} in {model_dir}")
    return matches[0].resolve()


def truncate_shard(model_dir: Path, index: int, to_bytes: int) -> Path:
    """Cut shard ``index`` (1-based) to ``to_bytes``, as an interrupted copy leaves it.

    Returns:
        The file that was truncated.
    """
    path = shard_path(model_dir, index)
    os.truncate(path, to_bytes)
    return path


def corrupt_header(model_dir: Path, index: int, kind: str = "not-json") -> Path:
    """Damage the header of shard ``index`` (1-based) without changing the file size.

    Args:
        model_dir: the model directory.
        index: 1-based shard number.
        kind: ``not-json`` (garbage in the JSON), ``length`` (header length beyond the file),
            ``overlap`` (two tensors share bytes).

    Returns:
        The damaged file.

    Raises:
        ValueError: on an unknown kind.
    """
    path = shard_path(model_dir, index)
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if kind == "not-json":
            handle.seek(8)
            handle.write(b"{\x00garbage")
        elif kind == "length":
            handle.seek(0)
            handle.write(struct.pack("<Q", path.stat().st_size + 4096))
        elif kind == "overlap":
            header = json.loads(handle.read(length))
            handle.seek(8)
            handle.write(_overlapping(header, length))
        else:
            raise ValueError(f"unknown kind {kind!r}: use not-json, length or overlap")
    return path


def _overlapping(header: dict[str, Any], length: int) -> bytes:
    names = [name for name in header if name != "__metadata__"]
    if len(names) >= 2:
        begin, end = header[names[1]]["data_offsets"]
        header[names[1]]["data_offsets"] = [max(begin - 1, 0), end - 1]
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * max(length - len(text), 0)


_DOWNLOAD_WORKER = r"""
import base64, json, os, sys, time
plan = json.load(sys.stdin)
rate, step = plan["rate"], plan["step"]
for item in plan["items"]:
    if item["lock"]:
        open(item["lock"], "a").close()
    mode = "r+b" if os.path.exists(item["incomplete"]) else "wb"
    with open(item["incomplete"], mode) as handle:
        handle.seek(0)
        handle.write(base64.b64decode(item["prefix"]))
        present = handle.tell()
        while present < item["size"]:
            time.sleep(step)
            present = min(item["size"], present + max(int(rate * step), 1))
            handle.truncate(present)
            handle.flush()
    os.replace(item["incomplete"], item["final"])
    if item["link"]:
        os.symlink(item["link_target"], item["link"])
    if item["metadata"]:
        with open(item["metadata"], "w") as handle:
            handle.write(item["metadata_text"] % time.time())
    if item["lock"]:
        os.unlink(item["lock"])
"""

_SIMULATIONS: dict[int, subprocess.Popen[bytes]] = {}


def start_download_simulation(
    model_dir: Path,
    *,
    shards: Sequence[int] | None = None,
    rate_bytes_per_s: float = 4.6e9,
    step: float = 0.2,
    python: str = sys.executable,
) -> int:
    """Turn shards back into a download in progress, finished by a background writer.

    The named shards are removed; the writer then recreates them one at a time as
    huggingface_hub does: a ``.incomplete`` file (``blobs/<hash>.incomplete`` in the cache,
    ``.cache/huggingface/download/<file>.<etag>.incomplete`` in a local dir) growing at
    ``rate_bytes_per_s``, renamed into place when complete, then the snapshot link or the
    metadata file. The first partial file exists when this returns.

    Args:
        model_dir: a directory made by :func:`make_checkpoint`.
        shards: 1-based shard numbers to download (default: all).
        rate_bytes_per_s: simulated download speed.
        step: seconds between growth steps.
        python: interpreter that runs the writer.

    Returns:
        The writer's PID; stop it with :func:`stop_download_simulation`.
    """
    model_dir = Path(model_dir)
    total = len(list(model_dir.glob("model-*-of-*.safetensors")))
    numbers = list(shards) if shards is not None else list(range(1, total + 1))
    items = [_undownload(model_dir, number) for number in numbers]
    if items:
        first = items[0]
        Path(first["incomplete"]).write_bytes(base64.b64decode(first["prefix"]))
        if first["lock"]:
            Path(first["lock"]).touch()
    plan = {"rate": rate_bytes_per_s, "step": step, "items": items}
    proc = subprocess.Popen(
        [python, "-c", _DOWNLOAD_WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(plan).encode())
    proc.stdin.close()
    _SIMULATIONS[proc.pid] = proc
    return proc.pid


def stop_download_simulation(pid: int, timeout: float = 5.0) -> None:
    """Stop a writer started by :func:`start_download_simulation` (and reap it)."""
    proc = _SIMULATIONS.pop(pid, None)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    if proc is not None:
        proc.wait(timeout=timeout)


def _undownload(model_dir: Path, number: int) -> dict[str, Any]:
    """Remove one shard and describe how the writer recreates it."""
    link = next(iter(model_dir.glob(f"model-{number:05d}-of-*.safetensors")))
    final = link.resolve()
    with open(final, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(0)
        prefix = handle.read(8 + length)
    item: dict[str, Any] = {
        "prefix": base64.b64encode(prefix).decode(),
        "size": final.stat().st_size,
        "final": str(final),
        "link": None,
        "link_target": None,
        "metadata": None,
        "metadata_text": None,
        "lock": None,
    }
    if link.is_symlink():
        item.update(_undownload_cached(model_dir, link, final))
    else:
        item.update(_undownload_local(model_dir, link))
    final.unlink()
    return item


def _undownload_cached(model_dir: Path, link: Path, blob: Path) -> dict[str, Any]:
    repo = model_dir.parent.parent
    locks = repo.parent / ".locks" / repo.name
    locks.mkdir(parents=True, exist_ok=True)
    target = os.readlink(link)
    link.unlink()
    return {
        "incomplete": f"{blob}.incomplete",
        "link": str(link),
        "link_target": target,
        "lock": str(locks / f"{blob.name}.lock"),
    }


def _undownload_local(model_dir: Path, path: Path) -> dict[str, Any]:
    download = model_dir / ".cache" / "huggingface" / "download"
    download.mkdir(parents=True, exist_ok=True)
    metadata = download / f"{path.name}.metadata"
    commit, etag = DEFAULT_REVISION, "0" * 64
    if metadata.exists():
        lines = metadata.read_text().splitlines()
        commit, etag = lines[0], lines[1]
        metadata.unlink()
    return {
        "incomplete": str(download / f"{path.name}.{etag}.incomplete"),
        "metadata": str(metadata),
        "metadata_text": f"{commit}\n{etag}\n%s\n",
        "lock": str(download / f"{path.name}.lock"),
    }


def _small_file_etag(name: str, content: bytes) -> str:
    # tiktoken.model is stored with Git LFS upstream (sha256); the rest are git objects (sha1).
    if name == "tiktoken.model":
        return hashlib.sha256(content).hexdigest()
    return git_blob_sha1(content)


def _relink(link: Path, target: str) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _json_bytes(data: dict[str, Any], indent: int) -> bytes:
    return (json.dumps(data, indent=indent, ensure_ascii=False) + "\n").encode()


def _layer(layer: int) -> str:
    return f"language_model.model.layers.{layer}"
