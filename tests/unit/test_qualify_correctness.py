"""Greedy determinism and degenerate output, judged from the client's answers."""

from opsbook.steps import qualify_correctness as correctness

PROMPTS = ("a", "b")


def answer(digest: str, ids: list[int] | None = None, text: str = "x y", ok: bool = True) -> dict:
    ids = list(range(20)) if ids is None else ids
    return {"ok": ok, "ids_sha256": digest, "tokens": len(ids), "ids_head": ids, "text_head": text}


def test_the_same_tokens_alone_and_together_pass() -> None:
    alone = [answer("h1"), answer("h2")]
    found = correctness.judge(PROMPTS, alone, [answer("h1"), answer("h2")] * 2, 2)
    assert found.deterministic and found.findings() == []
    assert found.alone == {"a": "h1", "b": "h2"}


def test_tokens_that_change_with_the_batch_are_a_flip() -> None:
    found = correctness.judge(
        PROMPTS, [answer("h1"), answer("h2")], [answer("h1"), answer("zz")], 2
    )
    assert found.flips == ["b"]
    (finding,) = found.findings()
    assert (
        finding.code == correctness.CODE_NONDETERMINISTIC
        and "concurrency 1 and 2" in finding.message
    )


def test_degenerate_answers_are_named() -> None:
    assert "repeated 20 times" in correctness.degenerate_reason(
        correctness.Answer.of(0, answer("h", [0] * 20, "!" * 20))
    )
    assert correctness.degenerate_reason(correctness.Answer.of(0, answer("h", []))) == "no tokens"
    assert "replacement" in correctness.degenerate_reason(
        correctness.Answer.of(0, answer("h", text="caf\ufffd"))
    )
    # Without token ids (a server that does not return them) the text alone tells.
    assert "repeated" in correctness.degenerate_reason(
        correctness.Answer(0, True, "", 20, (), "!" * 20)
    )
    assert correctness.degenerate_reason(correctness.Answer.of(0, answer("h"))) == ""


def test_failed_requests_are_a_finding_and_not_compared() -> None:
    alone = [answer("h1"), answer("", ok=False)]
    found = correctness.judge(PROMPTS, alone, [answer("h1"), answer("h2")], 2)
    codes = [f.code for f in found.findings()]
    assert codes == [correctness.CODE_FAILED_REQUESTS] and "b" not in found.alone
