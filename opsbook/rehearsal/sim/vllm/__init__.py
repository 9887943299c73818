"""A simulated vLLM for the opsbook rehearsal host (no GPUs, standard library only).

It answers ``vllm serve MODEL`` and ``python -m vllm.entrypoints.openai.api_server`` like
the real server: it reads the model's configuration, picks an attention backend by vLLM's
rules for the simulated GPUs, logs the real startup phases and failure messages, spawns
``VLLM::EngineCore`` and ``VLLM::Worker_TP<n>`` processes that hold simulated GPU memory and
serves the OpenAI-compatible HTTP API. The version it plays comes from
``<venv>/opsbook-vllm-sim.json`` or ``$OPSBOOK_SIM_VLLM_VERSION``.
"""

from __future__ import annotations

from ._simconfig import load as _load_settings

__version__: str = _load_settings()["version"]
__version_tuple__ = tuple(__version__.split("."))

__all__ = ["__version__"]
