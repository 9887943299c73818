"""Published baselines: each cited, matched to the model and GPU model, and shown beside this
run's nearest cell for information."""

from opsbook.steps import qualify_baselines as baselines
from tests.unit.test_qualify_gate import cell

RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_every_baseline_names_its_public_source_and_a_known_figure() -> None:
    known = baselines.load()
    assert len({b.id for b in known}) == len(known) >= 4
    for b in known:
        assert b.source.startswith("https://github.com/"), b.id
        assert b.figure in (baselines.PER_REQUEST, baselines.AGGREGATE)
        assert 0 < b.low <= b.high


def test_a_baseline_applies_to_its_model_and_gpu_model_only() -> None:
    nvfp4 = baselines.matching("kimi /models/nvidia/Kimi-K2.5-NVFP4", RTX)
    assert [b.id for b in nvfp4] == ["kimi-k25-nvfp4-sglang-cc1"]
    assert (nvfp4[0].low, nvfp4[0].high, nvfp4[0].shown) == (53, 55, "53-55")
    int4 = baselines.matching("moonshotai/Kimi-K2.5", RTX)
    assert [b.id for b in int4] == ["kimi-k25-int4-vllm-dcp8-turin", "kimi-k25-int4-vllm-c100-40k"]
    assert baselines.matching("moonshotai/Kimi-K2.5", "NVIDIA H200") == []
    assert baselines.matching("tiny-llama /models/tiny", RTX) == []


def test_the_table_puts_each_figure_beside_the_nearest_cell_of_the_same_kind() -> None:
    cells = [cell(40.0, prompt=128, concurrency=1), cell(120.0, prompt=128, concurrency=4),
             cell(100.0, prompt=1024, concurrency=4)]  # fmt: skip
    found = baselines.matching("moonshotai/Kimi-K2.5", RTX)
    table = baselines.baselines_table(found, cells, gpu_count=8)
    single, many = table.rows
    # One stream: the 128 x 1 cell's per-request tok/s (40 / 4 in these test cells).
    assert (single[3], single[4]) == ("128 x 1", 10.0)
    assert single[0] == "vLLM on 8 x RTX PRO 6000" and single[5].endswith("kimi-k25.md")
    # 100 at 40K context: the widest, longest cell's aggregate tok/s.
    assert (many[3], many[4]) == ("1024 x 4", 100.0)
    assert "(other count)" in baselines.baselines_table(found, cells, gpu_count=4).rows[0][0]
    assert baselines.baselines_table(found, [], 8).rows[0][3:5] == ["", None]
