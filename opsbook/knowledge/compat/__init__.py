"""Predict whether vLLM will serve a checkpoint on given GPUs, before it reads 540 GB.

One module per job:

- :mod:`.model_config` reads a checkpoint's ``config.json``, ``hf_quant_config.json`` and
  ``tokenizer_config.json`` into :class:`ModelFacts`: MLA or not, the head size the backend
  selector sees, the quantization and the KV-cache dtype resolved as vLLM resolves it, whether
  remote code is needed, the layer count.
- :mod:`.backend_probe` asks the installed vLLM on the host which backend it chooses
  (:func:`probe_backends`, answering :class:`InstalledVllm`); :mod:`.backend_answers` types
  the probe's answer (:class:`BackendsAnswer`).
- :mod:`.backend_select` chooses an attention backend the way vLLM's selector does
  (:func:`select_backend`): the installed vLLM's answer, else the release's own priority list
  and backend declarations (``opsbook/knowledge/data/vllm_facts``), else the fallback table.
  The :class:`BackendChoice` names its source.
- :mod:`.rules_table` is ``compat_rules.yaml`` typed and checked at load; :mod:`.rule_conditions`
  evaluates its conditions; :mod:`.prediction` runs the rules (:func:`check_compat`) into a
  :class:`Prediction` whose evidence is a :class:`PredictionEvidence`.
- :mod:`.kv_sizing` sizes the KV cache, to show what a BF16 KV cache costs against FP8.
"""

from opsbook.knowledge.compat.backend_answers import BackendsAnswer
from opsbook.knowledge.compat.backend_probe import (
    InstalledVllm,
    ProbedSelection,
    installed_vllm,
    probe_backends,
)
from opsbook.knowledge.compat.backend_select import (
    BackendChoice,
    backend_kv_dtypes,
    fact_reasons,
    facts_source,
    min_capability,
    release_facts,
    select_backend,
)
from opsbook.knowledge.compat.kv_sizing import (
    KV_DTYPE_BYTES,
    kv_budget_bytes,
    kv_cache_bytes_per_token,
    kv_cache_bytes_per_token_per_layer,
    kv_tradeoff_table,
    nvfp4_packed_bytes,
    tokens_that_fit,
)
from opsbook.knowledge.compat.model_config import (
    CONFIG_FILES,
    MLA_MODEL_TYPES,
    ModelFacts,
    facts_from_texts,
    model_facts,
    parse_json,
)
from opsbook.knowledge.compat.prediction import (
    ATTENTION_BACKEND_ARGS,
    BACKEND_CHOSEN,
    FINDING_COLUMNS,
    NO_GPU_FACTS,
    Prediction,
    PredictionEvidence,
    check_compat,
    narrow_to_release,
    normalize_serve_args,
    prediction_source,
    resolve_kv_cache_dtype,
)
from opsbook.knowledge.compat.rule_conditions import CONDITIONS
from opsbook.knowledge.compat.rules_table import (
    RULES_FILE,
    TABLE_SOURCE,
    Rule,
    RulesTable,
    When,
    capability_int,
    capability_matches,
    compute_capability,
    load_rules,
    parse_version,
    version_in,
)

__all__ = [
    "ATTENTION_BACKEND_ARGS",
    "BACKEND_CHOSEN",
    "CONDITIONS",
    "CONFIG_FILES",
    "FINDING_COLUMNS",
    "KV_DTYPE_BYTES",
    "MLA_MODEL_TYPES",
    "NO_GPU_FACTS",
    "RULES_FILE",
    "TABLE_SOURCE",
    "BackendChoice",
    "BackendsAnswer",
    "InstalledVllm",
    "ModelFacts",
    "Prediction",
    "PredictionEvidence",
    "ProbedSelection",
    "Rule",
    "RulesTable",
    "When",
    "backend_kv_dtypes",
    "capability_int",
    "capability_matches",
    "check_compat",
    "compute_capability",
    "fact_reasons",
    "facts_from_texts",
    "facts_source",
    "installed_vllm",
    "kv_budget_bytes",
    "kv_cache_bytes_per_token",
    "kv_cache_bytes_per_token_per_layer",
    "kv_tradeoff_table",
    "load_rules",
    "min_capability",
    "model_facts",
    "narrow_to_release",
    "normalize_serve_args",
    "nvfp4_packed_bytes",
    "parse_json",
    "parse_version",
    "prediction_source",
    "probe_backends",
    "release_facts",
    "resolve_kv_cache_dtype",
    "select_backend",
    "tokens_that_fit",
    "version_in",
]
