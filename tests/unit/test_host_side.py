"""What a host shows of the facts hosts should share: the engine's choices from its log (real
vLLM lines), predicted without one, and the one command that asks the deployment's python."""

import json
from pathlib import Path

from opsbook.core.deployment import parse_deployment
from opsbook.remote.testing import Answer, FakeHost
from opsbook.steps import host_side
from opsbook.steps.host_compare import UNKNOWN
from opsbook.steps.host_facts import HostFacts, OsInfo, PythonInfo
from opsbook.steps.smi_parse import Gpu, Topology

# vLLM 0.32.0's own lines (vllm/config/vllm.py VllmConfig.__str__, vllm/platforms/cuda.py).
ENGINE_LINE = (
    "(EngineCore_DP0 pid=2114) INFO 12-03 17:48:51 [core.py:93] Initializing a V1 LLM engine "
    "(v0.32.0) with config: model='/models/m', dtype=torch.bfloat16, quantization=None, "
    "enforce_eager=False, kv_cache_dtype=fp8, device_config=cuda, seed=0"
)
CHOSEN_LINE = (
    "(EngineCore_DP0 pid=2114) INFO 12-03 17:48:53 [cuda.py:507] Using FLASHINFER attention "
    "backend out of potential backends: ['FLASHINFER', 'TRITON_ATTN']."
)
ASKED_LINE = "(EngineCore_DP0 pid=2114) INFO 12-03 17:48:53 [cuda.py:446] Using TRITON_MLA backend."


def test_the_log_names_the_kv_dtype_and_the_backend_of_the_last_start() -> None:
    assert host_side.engine_from_log([ENGINE_LINE, CHOSEN_LINE]) == ("fp8", "FLASHINFER")
    assert host_side.engine_from_log([ENGINE_LINE, ASKED_LINE]) == ("fp8", "TRITON_MLA")
    earlier = ENGINE_LINE.replace("kv_cache_dtype=fp8", "kv_cache_dtype=auto")
    assert host_side.engine_from_log([ENGINE_LINE, CHOSEN_LINE, earlier]) == ("auto", UNKNOWN)
    assert host_side.engine_from_log(["INFO distributed_init_method=tcp backend=nccl"]) == (
        UNKNOWN,
        UNKNOWN,
    )


def facts(cap: str = "12.0", vllm: str = "0.15.1") -> HostFacts:
    gpus = [
        Gpu(i, "NVIDIA B200" if cap == "10.0" else "NVIDIA RTX PRO 6000", cap) for i in range(8)
    ]
    return HostFacts(
        host="ops@a",
        gpus=gpus,
        processes=[],
        topology=Topology(),
        driver="580.95.05",
        cuda="13.0",
        os=OsInfo(),
        python=PythonInfo("python3", "/usr/bin/python3", "3.11.9"),
        vllm_version=vllm,
        disk_free_bytes=None,
        shm_total=None,
        shm_free=None,
        listening=[],
        servers=[],
    )


DEP = parse_deployment(
    {
        "model": {"path": "/models/m"},
        "server": {"port": 8000, "args": {"kv-cache-dtype": "fp8"}},
        "hosts": [{"address": "a", "user": "ops"}],
    }
)
CONFIG = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})


def answer(**given: object) -> str:
    doc = {"versions": {"torch": "2.9.1", "ray": None, "vllm": "0.15.1"}, "script_sha256": "ab"}
    return json.dumps({**doc, **given})


def test_one_command_gives_versions_hash_and_the_engine_from_the_log() -> None:
    host = FakeHost(
        "a", commands={"-c": Answer(stdout=answer(engine_lines=[ENGINE_LINE, CHOSEN_LINE]))}
    )
    got = host_side.read_side(host, DEP)
    side = host_side.side_of("ops@a", DEP, facts(), got)
    assert (side.torch, side.ray, side.vllm, side.script_sha256) == (
        "2.9.1",
        "not installed",
        "0.15.1",
        "ab",
    )
    # vLLM's fp8 is fp8_e4m3 (vllm/config/cache.py): one name, so that hosts compare.
    assert (side.kv_cache_dtype, side.attention_backend, side.engine_from) == (
        "fp8_e4m3",
        "FLASHINFER",
        host_side.FROM_LOG,
    )
    assert side.gpus == "8 × NVIDIA RTX PRO 6000" and side.model == "m"
    [(kind, command)] = host.calls
    assert kind == "run" and " /models/m " in command and "config.json" in command


def test_without_a_log_the_engine_is_predicted_from_the_configs_gpus_and_flags() -> None:
    host = FakeHost("a", commands={"-c": answer(configs={"config.json": CONFIG})})
    side = host_side.side_of("ops@a", DEP, facts(), host_side.read_side(host, DEP))
    assert side.kv_cache_dtype == "fp8_e4m3" and side.engine_from == host_side.PREDICTED
    assert side.attention_backend not in (UNKNOWN, "none fits")


def test_a_python_that_does_not_answer_leaves_its_versions_unknown() -> None:
    host = FakeHost(
        "a", commands={"-c": Answer(stdout="zsh: no such file: python9", exit_code=127)}
    )
    got = host_side.read_side(host, DEP)
    assert got.error == "zsh: no such file: python9"
    side = host_side.side_of("ops@a", DEP, facts(), got)
    assert (side.torch, side.ray) == (UNKNOWN, UNKNOWN)
    assert side.kv_cache_dtype == "fp8_e4m3"  # the flag says so, without the configs


def test_after_a_launch_a_host_whose_log_names_no_engine_choice_has_none_to_compare() -> None:
    host = FakeHost("a", commands={"-c": answer(configs={"config.json": CONFIG})})
    got = host_side.read_side(host, DEP)
    side = host_side.side_of("ops@a", DEP, facts(), got, predict=False)
    assert (side.kv_cache_dtype, side.attention_backend, side.engine_from) == (UNKNOWN,) * 3


def test_the_side_read_digests_the_env_as_the_upgrades_probe_does_and_finds_the_revision(
    tmp_path: Path,
) -> None:
    # The deployment's python of this test is this interpreter: its env's `pip freeze` digest
    # must be the one 07_upgrade's probe reads of an env, so that the two can be compared.
    import subprocess
    import sys

    from opsbook.remote import probes

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "models--x--y" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    local = tmp_path / "local"
    (local / ".cache" / "huggingface" / "download").mkdir(parents=True)
    meta = local / ".cache" / "huggingface" / "download" / "config.json.metadata"
    meta.write_text(f"{commit}\nsome-etag\n1733000000.0\n")
    answers = {}
    for name, model in (("snapshot", snapshot), ("local", local), ("bare", tmp_path)):
        args = [sys.executable, "-c", host_side.SIDE_SCRIPT, "none", "none", str(model), "[]", "1"]
        done = subprocess.run(args, capture_output=True, text=True, check=True)
        answers[name] = host_side.SideAnswer.parse(done.stdout.strip().splitlines()[-1])
    assert (answers["snapshot"].revision, answers["snapshot"].revision_source) == (
        commit,
        "Hugging Face cache snapshot",
    )
    assert (answers["local"].revision, answers["local"].revision_source) == (commit, str(meta))
    assert answers["bare"].revision is None
    probed = probes.run_local("engine_install", {}, python=sys.executable)
    assert answers["bare"].freeze_digest == probed["freeze_digest"]
    assert answers["bare"].cmdline == Path("/proc/cmdline").read_text().strip()
