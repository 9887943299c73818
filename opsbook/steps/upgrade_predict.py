"""Before an upgrade stops anything: what the new release will make of this deployment, from
the facts read from each release's source (:mod:`opsbook.knowledge.vllm_facts`).

- every serve flag of the launch script against the new release's parser (a flag it lacks
  makes the new server exit at once: the upgrade is refused before the stop);
- every ``VLLM_*`` variable of the server's env against the variables the new release reads
  (one the old release read and the new one does not stops working without a word before
  0.31.0: refused too, vllm issue 50292);
- the ``/metrics`` names a dashboard loses (:func:`opsbook.knowledge.metric_names.lost_in_upgrade`);
- the planned downtime, from the host's last records: the stop, the last start's seconds to
  ready, and the qualification.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Table
from opsbook.knowledge import metric_names, vllm_facts
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import last_good
from opsbook.steps.config_answers import ConfigState
from opsbook.steps.patch import BACKUP_SUFFIX

# Codes of the prediction's findings, for code that acts on a kind of them.
FLAG_GONE = "upgrade-flag-gone"
ENV_UNREAD = "upgrade-env-unread"
METRIC_LOST = "upgrade-metric-lost"
PATCH_UNNEEDED = "upgrade-patch-unneeded"
NO_FACTS = "upgrade-no-facts"
# What replaced a variable a release stopped reading, as its last reader's warning says:
# vLLM 0.14.1 vllm/config/attention.py ("Using VLLM_ATTENTION_BACKEND environment variable is
# deprecated ... Please use --attention-config.backend command line argument"); vLLM 0.15.1
# vllm/config/parallel.py ("VLLM_ALL2ALL_BACKEND environment variable is deprecated ... Please
# use the --all2all-backend command-line argument instead").
ENV_REPLACED_BY = {
    "VLLM_ATTENTION_BACKEND": "the serve flag attention-backend",
    "VLLM_ALL2ALL_BACKEND": "the serve flag all2all-backend",
}
# Seconds a quick qualification takes beyond the start, when no record says (the quick profile
# is about a minute, opsbook.steps.qualify_matrix).
QUICK_QUALIFY_S = 60.0


@dataclass(frozen=True)
class Downtime:
    """The planned stop of service: the stop's grace, the last start's seconds to ready (from
    the run named), and the qualification's."""

    stop_s: float
    start_s: float | None
    qualify_s: float
    from_run: str = ""

    @property
    def total_s(self) -> float | None:
        return None if self.start_s is None else self.stop_s + self.start_s + self.qualify_s

    def line(self) -> str:
        if self.start_s is None:
            return (
                f"planned downtime: the stop (up to {self.stop_s:.0f} s), the new start (no "
                f"record of an earlier start to say how long) and the qualification "
                f"(about {self.qualify_s:.0f} s)"
            )
        return (
            f"planned downtime about {self.total_s:.0f} s: stop up to {self.stop_s:.0f} s, "
            f"start {self.start_s:.0f} s (the last start, run {self.from_run}), qualification "
            f"about {self.qualify_s:.0f} s; no zero-downtime on one host"
        )


@dataclass
class UpgradePrediction:
    """What the new release will make of the deployment, said before anything stops."""

    old: str | None
    new: str
    findings: list[Finding] = field(default_factory=list)
    downtime: Downtime | None = None

    @property
    def refused(self) -> list[Finding]:
        """The findings that stop the upgrade before the stop."""
        return [f for f in self.findings if f.is_problem]

    def table(self) -> Table:
        rows = [[f.severity, f.subject, f.message, f.remedy, f.source] for f in self.findings]
        return Table(["severity", "what", "found", "remedy", "source"], rows)


def release_facts(version: str | None) -> vllm_facts.ReleaseFacts | None:
    """The facts of the release at or below ``version`` (None: unknown or older than all)."""
    if not version:
        return None
    try:
        return vllm_facts.for_version(version)
    except OpsbookError:
        return None


def flag_findings(
    serve_args: Mapping[str, Any],
    new: vllm_facts.ReleaseFacts,
    old: vllm_facts.ReleaseFacts | None = None,
) -> list[Finding]:
    """An error per serve flag the new release's parser lacks (a dotted flag is its head's)."""
    findings = []
    for name in new.flags_refused(serve_args):
        flag = "--" + name.split(".")[0]
        had = old is not None and flag in old.serve_flags
        findings.append(
            Finding(
                "error",
                flag,
                f"vLLM {new.version} has no {flag}"
                + (f" (vLLM {old.version} had)" if had and old is not None else "")
                + ": the new server would exit at once",
                f"remove {flag.removeprefix('--')} from server.args, then upgrade again "
                f"(vLLM {new.version}'s --help lists its flags)",
                source=new.source("serve flags: vllm/engine/arg_utils.py and cli_args.py"),
                code=FLAG_GONE,
            )
        )
    return findings


def env_findings(
    env_names: Iterable[str],
    new: vllm_facts.ReleaseFacts,
    old: vllm_facts.ReleaseFacts | None = None,
) -> list[Finding]:
    """An error per ``VLLM_*`` variable of the server's env that the old release reads and
    the new one does not; a warning for one neither reads (it did nothing before either)."""
    if not new.env_vars:
        return []
    findings = []
    for name in sorted(n for n in env_names if n.startswith("VLLM_")):
        if new.reads_env(name):
            continue
        was_read = old is not None and old.reads_env(name)
        instead = ENV_REPLACED_BY.get(name)
        remedy = f"remove {name} from server.env" + (f" and set {instead}" if instead else "")
        findings.append(
            Finding(
                "error" if was_read else "warning",
                name,
                (
                    f"vLLM {new.version} no longer reads {name} (vLLM {old.version if old else '?'}"
                    " did): the setting would be dropped without a word"
                    if was_read
                    else f"neither vLLM {old.version if old else '?'} nor {new.version} reads "
                    f"{name}: it does nothing"
                ),
                remedy,
                source=new.source(new.env_vars_source),
                code=ENV_UNREAD,
            )
        )
    return findings


def metric_findings(old: str | None, new: str) -> list[Finding]:
    """A warning per ``/metrics`` name the old release exports and the new one no longer
    does (a dashboard or alert reading it goes blank)."""
    if not old:
        return []
    try:
        lost = metric_names.lost_in_upgrade(old, new)
    except OpsbookError:
        return []
    return [
        Finding(
            "warning",
            item.name,
            f"/metrics of vLLM {new}: {item}",
            f"query {item.replacement} in dashboards and alerts"
            if item.replacement
            else "drop it from dashboards and alerts",
            source=f"vLLM {new} vllm/v1/metrics/*.py",
            code=METRIC_LOST,
        )
        for item in lost
    ]


def patch_findings(patched: Sequence[str], stock_ok_on_new: bool | None, new: str) -> list[Finding]:
    """Information when 02 patched the checkpoint's configs (``patched``: the files with a
    backup) and the new release would serve the checkpoint as shipped (the compat rules on
    its original configs): the patch can be reverted."""
    if not patched or not stock_ok_on_new:
        return []
    files = ", ".join(patched)
    return [
        Finding(
            "info",
            "config patch",
            f"the patch 02 made to {files} is no longer needed on vLLM {new}: its rules "
            "predict the checkpoint as shipped will serve",
            "once the upgrade passed, restore the originals with 02_config_patch's restore "
            "(or keep the patch: it still serves)",
            source=f"compat rules for vLLM {new}",
            code=PATCH_UNNEEDED,
        )
    ]


def original_configs(host: RemoteHost, model_dir: str, names: Iterable[str]) -> dict[str, str]:
    """The texts of the configs 02 backed up before it patched them (``<name>.opsbook-orig``),
    by the patched file's name; one round trip."""
    backups = {name + BACKUP_SUFFIX: name for name in names}
    if not backups:
        return {}
    answer = host.probe("configs", {"action": "read", "dir": model_dir, "files": list(backups)})
    texts = ConfigState.parse(answer).texts()
    return {backups[name]: text for name, text in texts.items() if name in backups}


def no_facts_finding(version: str) -> Finding:
    return Finding(
        "warning",
        f"vLLM {version}",
        f"no facts read from vLLM {version}'s own source: its flags and variables were not "
        "checked before the stop",
        "run tools/vllm_facts.py on its wheel",
        code=NO_FACTS,
    )


def planned_downtime(
    runs_dir: Path | None, deployment: str, host: str, stop_s: float, qualify_s: float
) -> Downtime:
    """The downtime from the host's newest run of the deployment that knows its start's
    seconds to ready."""
    start_s, from_run = None, ""
    if runs_dir is not None and runs_dir.is_dir():
        key = last_good.deployment_key(deployment) if deployment else ""
        for run in last_good.run_facts(runs_dir):
            facts = run.hosts.get(host)
            if run.deployment == key and facts is not None and facts.startup.ready_s:
                start_s, from_run = facts.startup.ready_s, run.run
                break
    return Downtime(stop_s, start_s, qualify_s, from_run)


def predict(
    serve_args: Mapping[str, Any], env_names: Iterable[str], old: str | None, new: str
) -> UpgradePrediction:
    """The flags, variables and metrics of the deployment against the new release."""
    new_facts = release_facts(new)
    # Only the release's own facts judge its flags: a flag added in a patch release would be
    # refused by the facts of the release before it.
    if new_facts is None or new.split("+")[0] != new_facts.version:
        return UpgradePrediction(old, new, [no_facts_finding(new), *metric_findings(old, new)])
    old_facts = release_facts(old)
    findings = [
        *flag_findings(serve_args, new_facts, old_facts),
        *env_findings(env_names, new_facts, old_facts),
        *metric_findings(old, new),
    ]
    return UpgradePrediction(old, new, findings)
