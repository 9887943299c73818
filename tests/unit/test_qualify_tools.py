"""06_qualify's tool-call check: which deployments get it, and each returned call judged
against the schema of the tool its prompt offered."""

import json
import subprocess
import sys

import pytest

from opsbook.core.deployment import parse_deployment
from opsbook.remote.testing import FakeHost
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import qualify_tools as tools


def deployment(**args):
    return parse_deployment({"hosts": ["a"], "model": {"path": "/m"}, "server": {"args": args}})


def test_only_a_server_that_parses_tool_calls_is_checked() -> None:
    assert tools.parser_of(deployment()) == ""
    assert tools.parser_of(deployment(**{"tool-call-parser": "kimi_k2"})) == ""
    on = deployment(**{"enable-auto-tool-choice": True, "tool-call-parser": "kimi_k2"})
    assert tools.parser_of(on) == "kimi_k2"


def called(name: str, arguments: object) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call = {"id": "t", "type": "function", "function": {"name": name, "arguments": text}}
    return {"ok": True, "message": {"content": None, "tool_calls": [call]}}


OFFERED = (tools.WEATHER, tools.ADD)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (called("get_weather", {"city": "Paris", "unit": "celsius"}), ""),
        (called("add", {"a": 1234.5, "b": 87}), ""),
        (called("get_weather", {"city": "Paris"}), "get_weather: 'unit' is a required property"),
        (
            called("get_weather", {"city": "Paris", "unit": "kelvin"}),
            "get_weather: 'kelvin' is not one of ['celsius', 'fahrenheit']",
        ),
        (called("add", {"a": "1", "b": 2}), "add: '1' is not of type 'number'"),
        (called("search_orders", {"customer_id": 1}), "called 'search_orders', not an offered"),
        (called("add", '{"a": 1, "b": '), "add: arguments are not JSON"),
        ({"ok": True, "message": {"content": "It is sunny.", "tool_calls": []}}, "no tool call"),
        ({"ok": False, "error": "HTTP 400: tools unsupported"}, "request failed: HTTP 400"),
    ],
)
def test_each_call_is_judged_against_its_offered_tools_schema(answer: dict, problem: str) -> None:
    found = tools.call_problem(OFFERED, answer)
    assert found.startswith(problem) if problem else found == ""


def test_the_rate_goes_in_the_receipt_and_invalid_calls_are_a_finding() -> None:
    sent = []

    def probe(args: dict) -> dict:
        sent.append(args)
        return {
            "answers": [
                called("get_weather", {"city": "Paris", "unit": "celsius"}),
                called("add", {"a": 1}),
                called("search_orders", {"customer_id": 4711, "limit": 3}),
            ]
        }

    host = FakeHost("a", probes={"serve_client": probe})
    target = matrix.Target(8000, "tiny", "/m", "/p", api_key="sk-key-123456789")
    found = tools.check_tool_calls(host, target, "hermes")
    assert (found.asked, found.valid, found.rate) == (3, 2, 0.6667)
    assert found.problems == ["prompt 2: add: 'b' is a required property"]
    (args,) = sent
    assert [b["tools"][0]["function"]["name"] for b in args["chat"]] == [
        "get_weather", "add", "search_orders",
    ]  # fmt: skip
    assert all(b["temperature"] == 0 and b["tool_choice"] == "auto" for b in args["chat"])
    assert args["bearer"] == "sk-key-123456789"
    (warning,) = tools.own_findings(found)
    assert warning.severity == "warning" and warning.code == tools.CODE_TOOL_CALLS
    assert "2 of 3 tool call(s) valid" in warning.message
    none = tools.judge("hermes", [OFFERED], [{"ok": True, "message": {"tool_calls": []}}])
    assert tools.own_findings(none)[0].severity == "error"


def test_a_lower_rate_than_the_last_good_runs_is_an_error() -> None:
    good = {"parser": "hermes", "rate": 1.0}
    (fell,) = tools.against_last_good({"parser": "hermes", "rate": 0.6667}, good, "runs/one")
    assert fell.code == tools.CODE_TOOL_REGRESSION and "from 100% in the last good run to 67%" in (
        fell.message
    )
    assert tools.against_last_good(good, {"parser": "hermes", "rate": 0.5}) == []


def test_the_runbook_s_kernel_imports_no_jsonschema_until_a_call_is_checked() -> None:
    # Every stage's kernel imports the runbook's stages; jsonschema would bring the format
    # checkers installed beside it (rfc3987_syntax: 0.9 s of grammar compiling at import).
    program = (
        "import sys, opsbook.stages; opsbook.stages.import_runbook(); "
        "print('jsonschema' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.stdout.split() == ["False"], done.stderr
    assert tools.schema_problem({"city": 1}, {"properties": {"city": {"type": "string"}}}) == (
        "1 is not of type 'string'"
    )
