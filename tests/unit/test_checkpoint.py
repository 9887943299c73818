import hashlib
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from opsbook.rehearsal import checkpoint
from opsbook.rehearsal.checkpoint import DTYPE_BYTES, make_checkpoint

REVISION = checkpoint.DEFAULT_REVISION


def read_header(path: Path) -> tuple[int, dict[str, Any], bytes]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        raw = handle.read(length)
    return length, json.loads(raw), raw


def shard_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("model-*-of-*.safetensors"))


@pytest.fixture(scope="module")
def default_local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    started = time.monotonic()
    model_dir = make_checkpoint(tmp_path_factory.mktemp("default") / "Kimi-K2.5-NVFP4")
    return model_dir, time.monotonic() - started


def test_default_checkpoint_is_large_apparent_small_on_disk(
    default_local: tuple[Path, float],
) -> None:
    model_dir, seconds = default_local
    shards = shard_files(model_dir)
    assert [s.name for s in shards[:2]] == [
        "model-00001-of-00119.safetensors",
        "model-00002-of-00119.safetensors",
    ]
    assert len(shards) == 119
    apparent = sum(s.stat().st_size for s in shards)
    on_disk = sum(p.stat().st_blocks * 512 for p in model_dir.rglob("*") if p.is_file())
    assert 500e9 < apparent < 600e9
    assert on_disk < 20e6
    assert seconds < 3.0


def test_headers_are_valid_safetensors(default_local: tuple[Path, float]) -> None:
    for shard in shard_files(default_local[0]):
        length, header, raw = read_header(shard)
        assert length % 8 == 0 and raw.startswith(b"{")
        spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert shard.stat().st_size == 8 + length + spans[-1][1]
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                begin, end = entry["data_offsets"]
                assert count * DTYPE_BYTES[entry["dtype"]] == end - begin, name


def test_index_and_headers_agree(default_local: tuple[Path, float]) -> None:
    model_dir = default_local[0]
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    in_headers = {}
    for shard in shard_files(model_dir):
        for name in read_header(shard)[1]:
            if name != "__metadata__":
                in_headers[name] = shard.name
    assert index["weight_map"] == in_headers
    assert index["metadata"]["total_size"] > 0


def test_tensors_follow_the_nvfp4_layout(default_local: tuple[Path, float]) -> None:
    header = read_header(shard_files(default_local[0])[1])[1]
    expert = "language_model.model.layers.1.mlp.experts.0.gate_proj"
    assert header[f"{expert}.weight"]["dtype"] == "U8"
    assert header[f"{expert}.weight"]["shape"] == [2048, 3584]
    assert header[f"{expert}.weight_scale"]["dtype"] == "F8_E4M3"
    assert header[f"{expert}.weight_scale_2"]["dtype"] == "F32"
    assert header[f"{expert}.input_scale"]["shape"] == []
    mla = header["language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]
    assert mla == {"dtype": "BF16", "shape": [576, 7168], "data_offsets": mla["data_offsets"]}


def test_config_is_the_real_one_and_quant_config_asks_for_fp8_kv(
    default_local: tuple[Path, float],
) -> None:
    model_dir = default_local[0]
    reference = (
        Path(__file__).parents[2] / "opsbook" / "rehearsal" / "data" / "kimi-k25-nvfp4-config.json"
    )
    config = json.loads((model_dir / "config.json").read_text())
    assert config == json.loads(reference.read_text())
    assert config["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8
    quant = json.loads((model_dir / "hf_quant_config.json").read_text())
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert quant["quantization"]["exclude_modules"] == config["quantization_config"]["ignore"]
    tokenizer = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi.TikTokenTokenizer"
    assert (model_dir / "tiktoken.model").exists()


def test_checkpoint_without_fp8_kv_cache(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path, shards=2, shard_bytes=50_000, kv_cache_fp8=False)
    config = json.loads((model_dir / "config.json").read_text())
    quant = json.loads((model_dir / "hf_quant_config.json").read_text())
    assert "kv_cache_scheme" not in config["quantization_config"]
    assert "kv_cache_quant_algo" not in quant["quantization"]


def test_local_dir_metadata_has_commit_etag_timestamp(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path, shards=3, shard_bytes=60_000)
    download = model_dir / ".cache" / "huggingface" / "download"
    assert (model_dir / ".cache" / "huggingface" / ".gitignore").exists()
    shard = shard_files(model_dir)[0]
    commit, etag, stamp = (download / f"{shard.name}.metadata").read_text().splitlines()
    assert commit == REVISION
    assert etag == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert shard.stat().st_mtime - 1 <= float(stamp)


def test_hf_cache_layout(tmp_path: Path) -> None:
    snapshot = make_checkpoint(tmp_path, shards=3, shard_bytes=60_000, layout="hf-cache")
    repo = tmp_path / "models--nvidia--Kimi-K2.5-NVFP4"
    assert snapshot == repo / "snapshots" / REVISION
    assert (repo / "refs" / "main").read_text() == REVISION
    shard = shard_files(snapshot)[0]
    target = os.readlink(shard)
    assert target.startswith("../../blobs/")
    assert Path(target).name == hashlib.sha256(shard.read_bytes()).hexdigest()
    config = (snapshot / "config.json").read_bytes()
    git_id = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert os.readlink(snapshot / "config.json") == f"../../blobs/{git_id}"


def test_large_shards_get_derived_names_unless_hashes_asked(tmp_path: Path) -> None:
    snapshot = make_checkpoint(
        tmp_path, shards=1, shard_bytes=checkpoint.HASH_LIMIT + 8, layout="hf-cache"
    )
    shard = shard_files(snapshot)[0]
    assert len(Path(os.readlink(shard)).name) == 64
    assert shard.stat().st_blocks * 512 < 1_000_000


def test_small_shards_keep_small_tensors(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path, shards=5, shard_bytes=100_000)
    for shard in shard_files(model_dir):
        assert shard.stat().st_size == 100_000
    names = read_header(shard_files(model_dir)[1])[1]
    assert any(name.endswith("input_layernorm.weight") for name in names)


def test_fault_helpers(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path, shards=3, shard_bytes=60_000)
    assert checkpoint.truncate_shard(model_dir, 2, 1000).stat().st_size == 1000
    path = checkpoint.corrupt_header(model_dir, 3, "not-json")
    assert path.stat().st_size == 60_000
    with pytest.raises(json.JSONDecodeError):
        read_header(path)
    with pytest.raises(ValueError, match="unknown kind"):
        checkpoint.corrupt_header(model_dir, 1, "melted")
    with pytest.raises(FileNotFoundError):
        checkpoint.shard_path(model_dir, 9)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="layout"):
        make_checkpoint(tmp_path, layout="tarball")
    with pytest.raises(ValueError, match="at least 1"):
        make_checkpoint(tmp_path, shards=0)


@pytest.mark.parametrize("layout", ["local-dir", "hf-cache"])
def test_download_simulation_recreates_shards(tmp_path: Path, layout: str) -> None:
    model_dir = make_checkpoint(tmp_path, shards=3, shard_bytes=300_000, layout=layout)
    before = {s.name: s.read_bytes() for s in shard_files(model_dir)}
    pid = checkpoint.start_download_simulation(
        model_dir, shards=[2, 3], rate_bytes_per_s=600_000, step=0.02
    )
    partials = list(tmp_path.rglob("*.incomplete"))
    assert len(partials) == 1

    def downloaded() -> bool:
        # Between two shards no .incomplete file exists for a moment: wait for the shards.
        current = {s.name: s.read_bytes() for s in shard_files(model_dir) if s.exists()}
        return current == before and not list(tmp_path.rglob("*.incomplete"))

    deadline = time.monotonic() + 60
    while not downloaded() and time.monotonic() < deadline:
        time.sleep(0.05)
    checkpoint.stop_download_simulation(pid)
    assert {s.name: s.read_bytes() for s in shard_files(model_dir)} == before
    assert not list(tmp_path.rglob("*.lock"))


def test_download_simulation_stops_by_pid(tmp_path: Path) -> None:
    model_dir = make_checkpoint(tmp_path, shards=2, shard_bytes=300_000)
    pid = checkpoint.start_download_simulation(model_dir, rate_bytes_per_s=1000, step=0.05)
    checkpoint.stop_download_simulation(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert len(list(tmp_path.rglob("*.incomplete"))) == 1


@pytest.mark.parametrize("shards", [119, 1190, 11900])
def test_no_tensor_is_in_two_shards_however_many_shards_a_layer_has(shards: int) -> None:
    # Above 96 shards a layer (384 experts, 4 listed a shard) the experts are listed again:
    # each round must hold its own tensors, as an export splitting an expert across files does.
    plan = checkpoint.plan_tensors(shards, 61, 4)
    names = [t.name for shard in plan for t in shard]
    assert len(names) == len(set(names))
    # ...and every shard of a MoE layer still holds some routed expert's tensors.
    moe = [
        shard
        for shard in plan
        if any(".mlp.shared_experts." in t.name for t in shard)
        or any(".mlp.experts." in t.name for t in shard)
    ]
    assert all(any(".mlp.experts." in t.name for t in shard) for shard in moe)
    assert len(moe) >= shards * 59 // 61
