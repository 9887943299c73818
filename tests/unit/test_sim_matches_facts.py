"""Contract: the simulated vLLM plays each release as the facts read from its wheel say.

For every release in ``opsbook/knowledge/data/vllm_facts`` the simulator, given the facts sheets
that the
rehearsal host installs (``opsbook.rehearsal.sim.vllm_install``), must accept that release's serve
flags, offer the flags whose presence varies (``--disable-log-requests``, ``--attention-backend``
...) exactly when the release has them, accept exactly its ``--kv-cache-dtype`` values, and pick
for the incident's checkpoint the backend that the facts-based prediction
(``opsbook.knowledge.compat.select_backend``) picks, or fail where it fails. A disagreement fails
here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from opsbook.knowledge import compat, vllm_facts
from opsbook.rehearsal.sim.vllm import _simcli, _simmodel, _simrelease
from opsbook.rehearsal.sim.vllm_install import write_facts_sheets

RELEASES = vllm_facts.releases()
# Flags whose presence changes from release to release and that the simulation plays itself.
VARYING_FLAGS = (
    "--disable-log-requests",
    "--attention-backend",
    "--attention-config",
    "--kv-cache-memory-bytes",
    "--compilation-config",
    "--hf-token",
)
# The incident's checkpoint as the selector sees it: DeepSeek-V3 MLA, qk_nope_head_dim 128.
KIMI = {
    "text_config": {
        "model_type": "deepseek_v3",
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "num_attention_heads": 64,
    }
}


@pytest.fixture(scope="module")
def sheets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sim") / "_facts"
    assert write_facts_sheets(folder) == list(RELEASES)
    return folder


def played(release: str, sheets: Path) -> _simrelease.Release:
    return _simrelease.load(release, sheets)


def parser_of(
    release: _simrelease.Release, monkeypatch: pytest.MonkeyPatch
) -> argparse.ArgumentParser:
    monkeypatch.setattr(_simrelease, "load", lambda version, folder=None: release)
    parser = argparse.ArgumentParser(prog="vllm serve")
    _simcli.add_server_arguments(parser, release.version)
    return parser


@pytest.mark.parametrize("version", RELEASES)
def test_the_simulated_parser_has_the_release_flags(
    version: str, sheets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = vllm_facts.load(version)
    release = played(version, sheets)
    assert release.facts["release"] == version
    options = set(parser_of(release, monkeypatch)._option_string_actions)
    assert facts.serve_flags <= options
    for flag in VARYING_FLAGS:
        if flag == "--attention-config" and "--attention-config" not in facts.serve_flags:
            # Only a JSON flag since 0.13.0; earlier its fields were separate flags.
            continue
        assert (flag in options) == (flag in facts.serve_flags), flag


@pytest.mark.parametrize("version", RELEASES)
def test_the_simulated_kv_dtypes_are_the_release_ones(
    version: str, sheets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = vllm_facts.load(version)
    release = played(version, sheets)
    assert release.kv_cache_dtypes == list(facts.cache_dtypes)
    action = parser_of(release, monkeypatch)._option_string_actions["--kv-cache-dtype"]
    if release.kv_dtype_checked_after_load:
        assert action.choices is None
    else:
        assert list(action.choices or []) == list(facts.cache_dtypes)


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("cc", ["9.0", "10.0", "12.0"])
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_the_simulated_backend_is_the_predicted_one(
    version: str, cc: str, kv: str, sheets: Path
) -> None:
    release = played(version, sheets)
    capability = (int(cc.split(".")[0]), int(cc.split(".")[1]))
    predicted = compat.select_backend(True, cc, kv, version, num_heads=64, head_size=576)
    try:
        chosen, valid, selected = _simmodel.select_backend(KIMI, capability, kv, release, None)
    except _simmodel.SimError as failure:
        assert predicted.name is None, f"sim: {failure.message}; predicted {predicted.name}"
        return
    if not release.selector_checks_kv_dtype:
        # 0.10.2 has no selector: its platform code picks a backend whose impl may refuse an
        # FP8 KV cache; the prediction uses the table of compat_rules.yaml. They must agree
        # on whether the server starts.
        runs = _simmodel.backend_init_error(chosen, kv, release) is None
        assert runs == (predicted.name is not None), (chosen, predicted)
        return
    if selected:
        # The 0.13-0.17 Blackwell default forces FLASHINFER_MLA before the priority list is
        # walked; the prediction must at least find it valid.
        assert chosen == "FLASHINFER_MLA" and chosen not in predicted.reasons
        return
    assert chosen == predicted.name, (valid, predicted)


def test_the_played_release_takes_the_newest_sheet_at_or_below_it(sheets: Path) -> None:
    assert _simrelease.load("0.15.1", sheets).facts["release"] == "0.15.1"
    assert _simrelease.load("0.15.0", sheets).facts["release"] == "0.14.1"
    assert _simrelease.load("0.40.2", sheets).facts["release"] == RELEASES[-1]
    older = _simrelease.load("0.9.2", sheets)
    assert older.facts == {} and older.kv_cache_dtypes  # the module's own tables
    assert _simrelease.load("0.33.0", sheets / "missing").facts == {}


def test_the_installed_package_carries_a_sheet_per_release(venv: Path) -> None:
    sheets = sorted(venv.glob("lib/python3*/site-packages/vllm/_facts/*.json"))
    assert [path.stem for path in sheets] == sorted(RELEASES, key=vllm_facts.version_key)
    played = _simrelease.load("0.33.0", sheets[0].parent)
    assert "--kv-cache-memory-bytes" in (played.serve_flags or set())


@pytest.mark.parametrize("version", RELEASES)
def test_the_simulated_parser_has_no_flag_the_release_lacks(
    version: str, sheets: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unknown-arg check: a long flag the release's source does not define is refused."""
    facts = vllm_facts.load(version)
    options = set(parser_of(played(version, sheets), monkeypatch)._option_string_actions)
    long_flags = {o for o in options if o.startswith("--") and o != "--help"}
    # The sheet lists each boolean field once; vLLM's parser also offers its --no- form.
    negated = {"--no-" + f[2:] for f in facts.serve_flags}
    assert long_flags <= facts.serve_flags | negated, sorted(long_flags - facts.serve_flags)
