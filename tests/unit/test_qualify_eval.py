"""06_qualify's evaluation file: exact-match scoring, the Wilson interval and the exact McNemar
test, against published values and sums done by hand."""

import json

import pytest

from opsbook.core.exceptions import RunError
from opsbook.remote.testing import FakeHost
from opsbook.steps import qualify_eval as evaluation
from opsbook.steps import qualify_matrix as matrix


@pytest.mark.parametrize(
    ("correct", "n", "low", "high"),
    [
        # Newcombe, "Two-sided confidence intervals for the single proportion: comparison of
        # seven methods", Statistics in Medicine 17 (1998) 857-872, Table II, method 3 (Wilson).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        # None right of n: the upper end is z^2 / (n + z^2); all right: the lower is n / (n + z^2).
        (0, 10, 0.0, 3.8415 / 13.8415),
        (10, 10, 10 / 13.8415, 1.0),
    ],
)
def test_the_wilson_interval_matches_published_values(
    correct: int, n: int, low: float, high: float
) -> None:
    found = evaluation.wilson_interval(correct, n)
    assert found == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))


def test_the_exact_mcnemar_p_is_twice_the_binomial_tail_of_the_smaller_discordant_count() -> None:
    # 1 vs 9 discordant pairs: 2 * (C(10,0) + C(10,1)) / 2^10 = 22 / 1024.
    assert evaluation.mcnemar_exact(1, 9) == 22 / 1024
    assert evaluation.mcnemar_exact(9, 1) == 22 / 1024
    # 3 vs 12: 2 * (1 + 15 + 105 + 455) / 2^15.
    assert evaluation.mcnemar_exact(3, 12) == 2 * 576 / 32768
    assert evaluation.mcnemar_exact(0, 5) == 2 / 32
    assert evaluation.mcnemar_exact(5, 5) == 1.0 and evaluation.mcnemar_exact(0, 0) == 1.0
    # Large counts stay exact (integers) and in range.
    assert 0.0 < evaluation.mcnemar_exact(400, 480) < 0.01
    assert evaluation.binomial_cdf_half(2000, 4000) == pytest.approx(0.5063, abs=1e-4)


@pytest.mark.parametrize(
    ("reply", "expected", "right"),
    [
        ("She sells 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "18", True),
        ("so the total is $1,250.00.", "1250", True),
        ("It takes 3 hours, not 4", "3", False),  # the last number is the answer
        ("no number here", "7", False),
        (" Paris. ", "paris", True),
        ("The answer is Paris", "paris", False),
        ("#### 72\nQuestion: next one 5", "72", True),
    ],
)
def test_exact_match_takes_the_marked_answer_else_the_last_number_else_the_text(
    reply: str, expected: str, right: bool
) -> None:
    assert (evaluation.extracted(reply, expected) == expected) is right


def test_a_gsm8k_file_is_read_into_items_with_their_expected_answers() -> None:
    text = "\n".join(
        [
            json.dumps({"question": "2 + 2?", "answer": "2 + 2 = 4\n#### 4"}),
            "",
            json.dumps({"prompt": "Capital of France:", "answer": "Paris"}),
            json.dumps({"question": "How much?", "answer": "#### 1,000.50"}),
        ]
    )
    items = evaluation.parse_items(text, "/data/eval.jsonl")
    assert [(i.prompt, i.expected) for i in items] == [
        ("Question: 2 + 2?\nAnswer:", "4"),
        ("Capital of France:", "paris"),
        ("Question: How much?\nAnswer:", "1000.5"),
    ]
    assert len({i.key for i in items}) == 3
    with pytest.raises(RunError, match="line 2 is not a JSON object with a question"):
        evaluation.parse_items('{"question": "q", "answer": "1"}\n{"question": "q"}', "/f")
    with pytest.raises(RunError, match="holds no item"):
        evaluation.parse_items("\n", "/f")


def test_a_file_on_the_host_is_answered_greedily_and_scored() -> None:
    lines = [json.dumps({"question": f"q{n}", "answer": f"#### {n}"}) for n in range(4)]
    sent = []

    def client(args: dict) -> dict:
        sent.append(args)
        texts = ["#### 0", "it is 1", "2.0", "nope"]
        return {"duration": 1.0, "answers": [{"ok": True, "text_head": t} for t in texts]}

    host = FakeHost("a", probes={"serve_client": client}, files={"/data/e.jsonl": "\n".join(lines)})
    target = matrix.Target(8000, "tiny", "/m", "/p")
    file = evaluation.read_eval_file(host, "/data/e.jsonl")
    assert len(file.items) == 4 and len(file.sha256) == 16
    found = evaluation.evaluate(host, target, file, 4)
    assert (found.items, found.correct, found.failed, found.accuracy) == (4, 3, 0, 0.75)
    assert (found.low, found.high) == (0.3006, 0.9544)  # Wilson, 3 of 4
    assert list(found.outcomes.values()) == [1, 1, 1, 0]
    (args,) = sent
    assert args["concurrency"] == 4 and args["keep_text"] == evaluation.KEEP_TEXT
    assert all(not r["ignore_eos"] for r in args["requests"])
    assert args["requests"][0]["prompt"] == "Question: q0\nAnswer:"
    assert evaluation.Evaluation.from_dict(found.to_dict()) == found


def outcomes(*bits: int) -> evaluation.Evaluation:
    marks = {f"k{n}": b for n, b in enumerate(bits)}
    right = sum(bits)
    return evaluation.Evaluation("/e", "d", len(bits), right, 0, right / len(bits), 0, 1, marks)


def test_the_paired_test_flags_a_significant_fall_only() -> None:
    good = outcomes(*[1] * 20)
    worse = outcomes(*[0] * 8, *[1] * 12)  # 8 right then wrong now, none the other way
    (fell,) = evaluation.against_last_good(worse, good, "runs/one")
    assert fell.code == evaluation.CODE_EVAL_REGRESSION and fell.source == "runs/one"
    assert "8 right then and wrong now, 0 the other way (exact McNemar p = 0.00781)" in (
        fell.message
    )
    # 3 lost is within noise (p = 0.25), and a gain is never a regression.
    (noise,) = evaluation.against_last_good(outcomes(*[0] * 3, *[1] * 17), good)
    assert noise.severity == "info" and "p = 0.25" in noise.message
    (gain,) = evaluation.against_last_good(good, worse)
    assert gain.severity == "info"
    # Items only one run answered are not paired.
    fewer = evaluation.Evaluation("/e", "d", 1, 0, 0, 0.0, 0, 1, {"other": 0})
    assert "0 item(s) paired" in evaluation.against_last_good(fewer, good)[0].message


def test_failed_requests_are_a_finding_and_count_wrong() -> None:
    items = evaluation.parse_items('{"question": "q", "answer": "#### 1"}', "/e")
    scored = evaluation.score("/e", "d", items, [{"ok": False, "error": "timeout"}])
    assert (scored.correct, scored.failed) == (0, 1)
    (found,) = evaluation.own_findings(scored)
    assert found.code == evaluation.CODE_EVAL_FAILED


def test_an_unreadable_file_is_said_with_its_remedy_before_any_measurement() -> None:
    with pytest.raises(RunError, match="the evaluation file /nope.jsonl cannot be read") as e:
        evaluation.read_eval_file(FakeHost("a"), "/nope.jsonl")
    assert "-p eval_file" in (e.value.remedy or "")
