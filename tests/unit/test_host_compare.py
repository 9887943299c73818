"""Hosts side by side: which facts differ, the findings and the table that shows them."""

from opsbook.steps.host_compare import HOSTS_DIFFER, SIDE_BY_SIDE, HostSide, compare

RTX = dict(
    model="m",
    gpus="8 × NVIDIA RTX PRO 6000 Blackwell Server Edition",
    driver="580.95.05",
    cuda="13.0",
    vllm="0.15.1",
    torch="2.9.1",
    ray="2.58.0",
    kv_cache_dtype="auto",
    attention_backend="FLASH_ATTN",
    engine_from="predicted",
    script_sha256="a" * 64,
)


def side(host: str, **changes: str) -> HostSide:
    return HostSide(host=host, **{**RTX, **changes})


def test_hosts_that_agree_give_no_finding_and_the_table_still_lists_every_host() -> None:
    found = compare([side("host-a"), side("host-b")])
    assert found.agree and found.differences == ()
    assert found.findings_for("host-a") == []
    assert [row[0] for row in found.table().rows] == ["host-a", "host-b"]
    assert "the 2 hosts agree" in found.summary()
    # Each host's row is kept in its record as an info finding, when all agree too.
    row = found.row_finding("host-b")
    assert row is not None and row.severity == "info" and row.code == SIDE_BY_SIDE
    assert "vLLM 0.15.1" in row.message and "KV cache dtype auto" in row.message
    assert row.message.endswith("agrees with the 1 other host(s) serving m")
    assert found.row_finding("host-z") is None


def test_a_host_on_another_vllm_and_kv_dtype_is_named_with_each_hosts_value() -> None:
    odd = side("host-c", vllm="0.33.0", kv_cache_dtype="fp8", gpus="8 × NVIDIA B200")
    found = compare([side("host-a"), side("host-b"), odd])
    named = {d.fact.name: d.text() for d in found.warnings()}
    assert named["vLLM"] == "hosts differ: vLLM: host-a 0.15.1, host-b 0.15.1, host-c 0.33.0"
    assert named["KV cache dtype"].endswith("host-c fp8")
    assert set(named) == {"vLLM", "KV cache dtype", "GPUs"}
    findings = found.findings_for("host-a")
    assert {f.severity for f in findings} == {"warning"}
    assert {f.code for f in findings} == {HOSTS_DIFFER}
    assert not found.agree
    assert found.line_for("host-c") == (
        "hosts differ: GPUs 8 × NVIDIA B200 (others 8 × NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition), vLLM 0.33.0 (others 0.15.1), KV cache dtype fp8 (others auto)"
    )
    assert found.line_for("host-a").startswith("hosts differ: GPUs 8 × NVIDIA RTX PRO")
    row = found.row_finding("host-c")
    assert (
        row is not None and "differs in GPUs, vLLM, KV cache dtype with the 2 other" in row.message
    )


def test_the_odd_host_out_is_named_last_whatever_the_order() -> None:
    found = compare([side("host-a", vllm="0.33.0"), side("host-b"), side("host-c")])
    assert found.differences[0].values[-1] == ("host-a", "0.33.0")


def test_differing_cells_are_highlighted_in_html_and_marked_in_text() -> None:
    found = compare([side("host-a"), side("host-b", vllm="0.33.0")])
    page = found._repr_html_()
    assert page.count("background:#ffebe9") == 2  # the vLLM cell of each host
    assert "<b>0.33.0</b>" in page and "<td>2.58.0</td>" in page
    text = repr(found)
    assert "*0.33.0*" in text and "*0.15.1*" in text and "*2.58.0*" not in text


def test_unknown_values_differ_from_nothing() -> None:
    found = compare([side("host-a", torch=""), side("host-b")])
    assert found.differences == ()
    assert found.table().rows[0][found.table().columns.index("torch")] == "?"


def test_only_hosts_serving_the_same_model_are_compared() -> None:
    found = compare([side("host-a"), side("host-b", model="other", vllm="0.33.0")])
    assert found.differences == ()


def test_launch_scripts_that_differ_are_shown_not_warned_of() -> None:
    found = compare([side("host-a"), side("host-b", script_sha256="b" * 64)])
    assert [d.fact.name for d in found.differences] == ["launch script"]
    assert found.agree and found.findings_for("host-a") == []
    assert found.summary().endswith("attention backend; launch script differs (not a problem)")
    assert "<b>bbbbbbbbbbbb</b>" in found._repr_html_()


def test_a_clusters_nodes_on_other_ray_or_vllm_versions_are_an_error_other_facts_a_warning() -> (
    None
):
    found = compare([side("head"), side("worker", ray="2.49.1", driver="570.1")], cluster=True)
    by_fact = {f.subject: f.severity for f in found.findings_for("worker")}
    # One engine across the nodes: a worker's predicted KV dtype is not the engine's.
    assert by_fact == {"Ray": "error", "driver": "warning"}
    assert "Ray refuses" not in by_fact  # the remedy says why, the subject names the fact
    ray = next(f for f in found.findings_for("head") if f.subject == "Ray")
    assert "install the head's Ray" in ray.remedy
