"""The deploy's batches, thresholds, health check, hooks and rollback, with the stages faked:
which hosts each stage is given, and when the run stops."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from opsbook.core.deployment import parse_deployment
from opsbook.core.redact import Redactor
from opsbook.core.results import Finding, HostResult, State
from opsbook.runner import deploy, rolling

HOSTS = ["a", "b", "c", "d"]


class Fleet:
    """A deploy run over four hosts whose stages are faked: ``fail`` maps a host to the stage
    it fails at; ``unhealthy`` the hosts the health check finds not ok."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **doc_extra) -> None:
        self.fail: dict[str, str] = {}
        self.would: dict[str, str] = {}
        self.unhealthy: set[str] = set()
        self.checks: list[list[str]] = []
        self.rolled: list[tuple[list[str], set[str]]] = []
        doc = {"hosts": HOSTS, "model": {"path": "/m"}, **doc_extra}
        self.dep = parse_deployment(doc, source=str(tmp_path / "d.yml"))
        self.run = deploy._DeployRun(
            tmp_path / "d.yml",
            self.dep,
            tmp_path,
            Redactor([]),
            True,
            10,
            (None, None),
            None,
            None,
        )
        monkeypatch.setattr(deploy, "_run_stage", self._stage)
        monkeypatch.setattr(rolling, "health_check", self._check)
        monkeypatch.setattr(rolling, "take_snapshots", lambda *a: {"snap": True})
        monkeypatch.setattr(rolling, "roll_back", self._roll_back)

    def _stage(self, run, stage, hosts, where):
        results = [HostResult(h, stage.name, self._state(h, stage.name), "") for h in hosts]
        run.results += results
        return results

    def _state(self, host: str, stage: str) -> State:
        if self.fail.get(host) == stage:
            return State.FAILED
        return State.WOULD_CHANGE if self.would.get(host) == stage else State.OK

    def _check(self, dep, hosts, forks, journal=None):
        self.checks.append(list(hosts))
        return [
            HostResult(h, "diagnose", State.FAILED if h in self.unhealthy else State.OK, "down")
            for h in hosts
        ]

    def _roll_back(self, dep, hosts, snapshots, patched, forks, journal=None):
        assert snapshots == {"snap": True}
        self.rolled.append((list(hosts), set(patched)))
        return [HostResult(h, rolling.ROLLBACK, State.CHANGED, "rolled back") for h in hosts]

    def deploy(self, serial, max_fail=None):
        deploy._deploy_batches(self.run, deploy.plan_batches(HOSTS, serial), HOSTS, max_fail)
        return self.run

    def ran(self, stage: str) -> list[str]:
        return [r.host for r in self.run.results if r.stage == stage]


@pytest.fixture
def fleet(tmp_path, monkeypatch) -> Fleet:
    return Fleet(tmp_path, monkeypatch)


def test_a_failed_batch_within_the_percentage_does_not_stop_the_roll(fleet) -> None:
    fleet.fail = {"c": "launch"}
    run = fleet.deploy(1, max_fail=30)  # 1 of 4 failed: 25%
    assert run.stopped == ""
    assert fleet.ran("launch") == HOSTS
    assert fleet.ran("diagnose") == HOSTS


def test_without_a_percentage_the_first_failed_batch_stops_the_roll(fleet) -> None:
    fleet.fail = {"c": "launch"}
    run = fleet.deploy(1)
    assert run.stopped.startswith("batch 3 of 4 failed on c")
    assert fleet.ran("launch") == ["a", "b", "c"]


def test_a_dry_run_of_a_roll_goes_on_past_hosts_that_would_change(fleet) -> None:
    # Its apply would change them and go on: the dry run says so for every batch.
    fleet.run.apply = False
    fleet.would = {h: "launch-script" for h in HOSTS}
    run = fleet.deploy(1)
    assert run.stopped == ""
    assert fleet.ran("launch-script") == HOSTS


def test_a_failed_batch_past_the_percentage_stops_the_roll(fleet) -> None:
    fleet.fail = {"b": "download", "c": "launch"}
    run = fleet.deploy(1, max_fail=30)  # b: 25% goes on; c: 50% stops
    assert run.stopped == "more than 30% of the hosts failed: the run was stopped"
    assert fleet.ran("launch") == ["a", "c"]
    assert "d" not in fleet.ran("preflight")


def test_the_percentage_counts_the_failures_of_every_batch_so_far(fleet) -> None:
    fleet.fail = {"a": "preflight", "b": "preflight"}
    run = fleet.deploy(2, max_fail=40)  # one batch of two, both failed: 50%
    assert run.stopped.startswith("more than 40%")
    assert fleet.ran("preflight") == ["a", "b"]


def test_the_hosts_staying_up_are_checked_before_each_batch_of_a_roll(fleet) -> None:
    fleet.fail = {"b": "launch"}
    fleet.deploy(1, max_fail=30)
    # Each batch with the hosts staying up; b failed in this run, and is counted, not checked.
    assert fleet.checks == [
        ["a", "b", "c", "d"],
        ["b", "a", "c", "d"],
        ["c", "a", "d"],
        ["d", "a", "c"],
    ]


def test_an_unhealthy_host_staying_up_stops_the_roll_before_the_batch(fleet) -> None:
    fleet.unhealthy = {"c"}
    run = fleet.deploy(1, max_fail=50)
    assert run.stopped.startswith("before batch 1 of 4, not every host staying up was healthy")
    assert fleet.ran("preflight") == []
    health = [r for r in run.results if r.stage == rolling.HEALTH]
    assert [(r.host, r.state) for r in health] == [("c", State.FAILED)]
    assert health[0].message == "before batch 1: down"
    assert health[0].exit_code == 1


def test_a_deploy_all_at_once_has_no_hosts_staying_up_to_check(fleet) -> None:
    fleet.deploy(None)
    assert fleet.checks == []


def test_a_host_whose_launch_failed_is_rolled_back_with_the_configs_this_run_patched(
    tmp_path, monkeypatch
) -> None:
    fleet = Fleet(tmp_path, monkeypatch)
    fleet.run.on_failure = "rollback"
    fleet.fail = {"b": "launch", "c": "download"}

    def stage(run, stage, hosts, where):
        results = fleet._stage(run, stage, hosts, where)
        if stage.name == "config-patch":  # b's config was patched in this run
            run.results[-len(results) :] = [
                HostResult(r.host, r.stage, State.CHANGED if r.host == "b" else r.state, "")
                for r in results
            ]
        return run.results[-len(results) :]

    monkeypatch.setattr(deploy, "_run_stage", stage)
    run = fleet.deploy(None)
    # c failed before its launch: nothing of it changed, nothing to roll back.
    assert fleet.rolled == [(["b"], {"b"})]
    assert [r.host for r in run.results if r.stage == rolling.ROLLBACK] == ["b"]


def test_a_dry_run_rolls_nothing_back(fleet) -> None:
    fleet.run.on_failure = "rollback"
    fleet.run.apply = False
    fleet.fail = {"b": "launch"}
    fleet.deploy(None)
    assert fleet.rolled == []


HOOK = "import sys; sys.exit(1 if sys.argv[1] == 'b' else 0)"


def test_a_failed_pre_hook_skips_its_host_as_failed(tmp_path, monkeypatch) -> None:
    rolling_doc = {
        "pre_host": [sys.executable, "-c", HOOK, "{address}"],
        "post_host": [sys.executable, "-c", "pass", "{host}"],
    }
    fleet = Fleet(tmp_path, monkeypatch, rolling=rolling_doc)
    fleet.fail = {"d": "launch"}
    run = fleet.deploy(1, max_fail=50)
    pre = {r.host: r.state for r in run.results if r.stage == rolling.PRE_HOST}
    assert pre == {"a": State.CHANGED, "b": State.FAILED, "c": State.CHANGED, "d": State.CHANGED}
    assert fleet.ran("preflight") == ["a", "c", "d"]
    # The post hook adds back the hosts that serve: not b (never deployed), not d (its launch
    # failed and it was left as it is).
    assert fleet.ran(rolling.POST_HOST) == ["a", "c"]
    assert deploy.record_steps(run.results)[:2] == ["pre-host", "preflight"]


def test_a_dry_run_names_the_hooks_without_running_them(tmp_path, monkeypatch) -> None:
    rolling_doc = {"pre_host": ["/nonexistent/lb", "{host}"]}
    fleet = Fleet(tmp_path, monkeypatch, rolling=rolling_doc)
    fleet.run.apply = False
    run = fleet.deploy(None)
    pre = [r for r in run.results if r.stage == rolling.PRE_HOST]
    assert {r.state for r in pre} == {State.SKIPPED}
    assert pre[0].message == "dry run: an apply would run /nonexistent/lb a"
    assert fleet.ran("preflight") == HOSTS


def test_the_record_shows_the_steps_around_the_stages_in_their_order() -> None:
    results = [
        HostResult("a", step, State.CHANGED, "")
        for step in (rolling.POST_HOST, rolling.ROLLBACK, rolling.PRE_HOST, rolling.HEALTH)
    ]
    assert deploy.record_steps(results) == [
        "health-check",
        "pre-host",
        "preflight",
        "download",
        "config-patch",
        "launch-script",
        "launch",
        "rollback",
        "post-host",
        "diagnose",
    ]
    stages = ["preflight", "download", "config-patch", "launch-script", "launch", "diagnose"]
    assert deploy.record_steps([]) == stages


def test_the_results_of_the_steps_around_the_stages_are_masked(fleet) -> None:
    fleet.run.redactor = Redactor(["hunter2-secret"])
    leaky = HostResult(
        "a",
        rolling.ROLLBACK,
        State.FAILED,
        "rollback failed: --api-key hunter2-secret",
        findings=(Finding("error", "a", "saw hunter2-secret", "drop hunter2-secret"),),
    )
    kept = deploy._record(fleet.run, leaky)
    assert "hunter2-secret" not in repr(kept) and "hunter2-secret" not in repr(fleet.run.results)


def test_the_restarts_a_deploy_lets_through_unchecked_are_the_launchs_own() -> None:
    # run_deploy skips the launch's check (and its imports) for these values only: each must be
    # one the launch takes, or a deploy would start with a value its launch stage refuses.
    from opsbook.steps import restart_rule

    assert set(deploy.KNOWN_RESTARTS) <= set(restart_rule.RESTART_WHEN)


def test_qualify_is_the_last_stage_of_each_batch_on_the_hosts_that_launched(fleet) -> None:
    fleet.run.qualify = "quick"
    fleet.fail = {"b": "launch"}
    fleet.deploy(2, max_fail=50)
    assert fleet.ran("qualify") == ["a", "c", "d"]
    stages_of_a = [r.stage for r in fleet.run.results if r.host == "a"]
    assert stages_of_a[-2:] == ["qualify", "diagnose"]


def test_without_qualify_or_in_a_dry_run_the_deploy_is_unchanged(fleet) -> None:
    fleet.deploy(None)
    assert fleet.ran("qualify") == [] and fleet.ran("launch") == HOSTS
    fleet.run.results.clear()
    fleet.run.qualify, fleet.run.apply = "quick", False
    fleet.deploy(None)
    assert fleet.ran("qualify") == []
    filled = deploy._with_skipped(fleet.run.results, HOSTS, "", deploy._qualifies(fleet.run))
    assert "qualify" not in {r.stage for r in filled}
    assert "qualify" not in deploy.record_steps(filled)


def test_a_run_whose_hosts_were_all_settled_shows_one_column() -> None:
    results = [HostResult(h, deploy.SETTLED, State.OK, "nothing to do") for h in HOSTS]
    assert deploy.record_steps(results) == ["settled"]


def test_only_a_plain_deploy_of_single_hosts_asks_whether_they_are_settled(
    tmp_path, monkeypatch
) -> None:
    run = Fleet(tmp_path, monkeypatch).run
    assert deploy._may_be_settled(run)
    for told in ({"recheck": True}, {"restart": "always"}, {"qualify": "quick"}):
        assert not deploy._may_be_settled(replace(run, **told)), told
    cluster = Fleet(
        tmp_path,
        monkeypatch,
        cluster={"head": "a", "tensor_parallel_size": 8, "pipeline_parallel_size": 4},
    ).run
    assert not deploy._may_be_settled(cluster)


class _NotingGroup:
    def __init__(self, names: list[str], noted: list[str]) -> None:
        self.names, self.noted = names, noted

    def map(self, work):
        self.noted += self.names
        return {}

    def close(self) -> None:
        pass


def test_after_an_apply_only_the_hosts_whose_every_step_went_through_are_noted(
    fleet, monkeypatch
) -> None:
    noted: list[str] = []
    monkeypatch.setattr(
        rolling, "host_group", lambda dep, names, forks, journal: _NotingGroup(names, noted)
    )
    fleet.fail = {"b": "launch"}
    run = fleet.deploy(serial=None, max_fail=100)
    deploy._note_settled(run, HOSTS)
    assert noted == ["a", "c", "d"]
    noted.clear()
    deploy._note_settled(replace(run, apply=False), HOSTS)
    assert noted == []
