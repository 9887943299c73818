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
