import signal

import pytest

from opsbook.core.redact import MASK, Redactor

TOKEN = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"


def test_declared_secret_values_are_masked() -> None:
    r = Redactor(["s3cr3t-value"])
    assert r.redact("export X=s3cr3t-value; echo s3cr3t-value") == f"export X={MASK}; echo {MASK}"


def test_token_shaped_strings_are_masked_without_declaration() -> None:
    r = Redactor()
    text = f"HF_TOKEN={TOKEN} curl -H 'Authorization: Bearer abcdefghijklmnop1234' --api-key k-123"
    clean = r.redact(text)
    assert TOKEN not in clean
    assert "abcdefghijklmnop1234" not in clean
    assert "k-123" not in clean
    assert clean.startswith("HF_TOKEN=")


def test_ordinary_text_is_left_alone() -> None:
    text = "vllm serve /models/Kimi-K2.5-NVFP4 --tensor-parallel-size 8 --port 8000"
    assert Redactor(["ab"]).redact(text) == text


def test_longer_secret_is_masked_whole() -> None:
    r = Redactor(["abcd", "abcdefgh"])
    assert r.redact("abcdefgh") == MASK


def test_a_value_under_a_secret_key_is_masked_in_a_repr_or_json() -> None:
    r = Redactor()
    for text in ("{'op': 'http', 'bearer': 'plain-key-1234'}", '{"api_key": "plain-key-1234"}'):
        clean = r.redact(text)
        assert "plain-key-1234" not in clean and MASK in clean
    assert r.redact("{'op': 'http', 'port': 8000}") == "{'op': 'http', 'port': 8000}"


# A key block's markers, spelt so that the source itself holds no such marker (a secret scan).
BEGIN_KEY = "-----BEGIN RSA PRIVATE" + " KEY-----"
END_KEY = "-----END RSA PRIVATE" + " KEY-----"

# A 100 kB value of each shape that made one of the patterns try every position and scan the
# rest of the text from it (a 100 kB server.env value hung a dry run of 03 for minutes).
LONG_VALUES = {
    "one letter": "x" * 100_000,
    "a name's tail": "TOKEN" * 20_000,
    "JWT starts": "eyJ" * 33_000,
    "key headers": f"{BEGIN_KEY}\n" * 3_200,
    "underscores": "_" * 100_000,
    "base64": "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0MTIzNDU2Nzg5" * 2_000,
}
# Each takes milliseconds; quadratic, the first took about 300 s. Far above any machine's
# noise, and short enough that a regression fails instead of hanging the suite.
BOUND_S = 5


class TooSlow(Exception):
    pass


@pytest.mark.parametrize("shape", sorted(LONG_VALUES))
def test_a_long_value_is_redacted_in_linear_time(shape: str) -> None:
    def stop(signum: int, frame: object) -> None:
        raise TooSlow(f"redacting 100 kB of {shape!r} took over {BOUND_S} s")

    text = f"export A={LONG_VALUES[shape]}\nexec vllm serve\n"
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(BOUND_S)
    try:
        clean = Redactor(["a-declared-secret"]).redact(text + text)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert clean.endswith("exec vllm serve\n")


def test_the_patterns_that_start_at_a_word_still_mask_what_they_did() -> None:
    r = Redactor()
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n"
    key = f"{BEGIN_KEY}\nMIIEow\n{END_KEY}"
    for text in (
        f"Bearer-less {jwt} x",
        f"token={jwt}",
        key,
        f"{key}\n{key}",
        "MY_API_KEY=abcdefgh1",
    ):
        clean = r.redact(text)
        assert MASK in clean
        for secret in (jwt, "MIIEow", "abcdefgh1"):
            assert secret not in clean, (text, clean)
    assert r.redact("MY_API_KEY=abcdefgh1") == f"MY_API_KEY={MASK}"
