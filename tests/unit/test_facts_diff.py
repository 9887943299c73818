"""What changed between two runs' facts: each fact old and new, numbers with how they moved."""

from opsbook.core.facts_diff import diff_facts, flatten
from opsbook.core.facts_schema import (
    EngineFacts,
    HostRunFacts,
    LaunchFacts,
    ModelFacts,
    RunFacts,
    StartupFacts,
)


def run(name: str, host: str = "ops@a:22", **sections: object) -> RunFacts:
    return RunFacts(run=name, deployment="/d.yml", hosts={host: HostRunFacts(**sections)})


OLD = run(
    "r1",
    engine=EngineFacts(vllm="0.15.1", kv_cache_dtype="auto"),
    model=ModelFacts(configs={"config.json": "aa"}),
    launch=LaunchFacts(flags={"max-model-len": "32768"}),
    startup=StartupFacts(ready_s=300.0),
)


def test_flatten_names_each_fact_by_its_section_and_key() -> None:
    flat = flatten(OLD.hosts["ops@a:22"])
    assert flat["engine.vllm"] == "0.15.1"
    assert flat["model.configs.config.json"] == "aa"
    assert flat["launch.flags.max-model-len"] == "32768"
    assert "engine.torch" not in flat  # unknown: left out


def test_the_diff_names_each_changed_fact_with_old_and_new_and_counts_per_section() -> None:
    new = run(
        "r2",
        engine=EngineFacts(vllm="0.33.0", kv_cache_dtype="fp8_e4m3", torch="2.10.0"),
        model=ModelFacts(configs={"config.json": "bb"}),
        launch=LaunchFacts(flags={"max-model-len": "32768"}),
        startup=StartupFacts(ready_s=420.0),
    )
    diff = diff_facts(OLD, new)
    got = {c.key: (c.old, c.new, c.kind) for c in diff.changes}
    assert got == {
        "engine.vllm": ("0.15.1", "0.33.0", "changed"),
        "engine.torch": (None, "2.10.0", "added"),
        "engine.kv_cache_dtype": ("auto", "fp8_e4m3", "changed"),
        "model.configs.config.json": ("aa", "bb", "changed"),
        "startup.ready_s": (300.0, 420.0, "changed"),
    }
    assert diff.stat() == [("engine", 3), ("model", 1), ("startup", 1)]
    assert diff.head().startswith("5 fact(s) differ from r1 to r2: 4 changed, 1 added, 0 removed")
    [ready] = [c for c in diff.changes if c.key == "startup.ready_s"]
    assert ready.moved() == "+120 (x1.40)"
    assert [c.moved() for c in diff.changes if c.key == "engine.vllm"] == [""]
    # In the schema's order: the engine before the model and the startup.
    assert [c.section for c in diff.changes] == ["engine"] * 3 + ["model", "startup"]


def test_two_one_host_runs_are_compared_whatever_the_hosts_names() -> None:
    diff = diff_facts(OLD, run("r2", host="ops@b:22", engine=EngineFacts(vllm="0.33.0")))
    assert diff.pairs == [("ops@a:22", "ops@b:22")]
    assert "hosts compared: ops@a:22 -> ops@b:22" in diff.head()


def test_runs_on_other_hosts_compare_nothing_and_say_so() -> None:
    a = RunFacts(run="a", deployment="d", hosts={"x": HostRunFacts(), "y": HostRunFacts()})
    b = RunFacts(run="b", deployment="d", hosts={"z": HostRunFacts(), "w": HostRunFacts()})
    diff = diff_facts(a, b)
    assert diff.changes == [] and "no host in both runs" in diff.head()


def test_the_same_facts_differ_in_nothing() -> None:
    assert diff_facts(OLD, OLD.model_copy(update={"run": "r2"})).changes == []
