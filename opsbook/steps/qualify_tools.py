"""06_qualify's optional tool-call check: when the server parses tool calls
(``--enable-auto-tool-choice --tool-call-parser X``), a few fixed prompts that each want one
tool, and each returned call checked: a tool that was offered, and arguments that are JSON
valid against that tool's JSON schema (``jsonschema``, which opsbook has through nbformat).

Tool-call schema accuracy is where a deployment's parser and template show: 76-87% for Kimi K2
models served by vLLM against ~100% for the vendor's own (MoonshotAI/K2-Vendor-Verifier). The
rate goes in the receipt; below 1 is a warning (0 an error), lower than the last good run's an
error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.qualify_matrix import PROBE, REQUEST_TIMEOUT, Target

ANSWER_TOKENS = 256
CODE_TOOL_CALLS = "qualify-tool-calls-invalid"
CODE_TOOL_REGRESSION = "qualify-tool-call-regression"


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


WEATHER = _tool(
    "get_weather",
    "The current weather in a city.",
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city", "unit"],
)
ADD = _tool(
    "add", "The sum of two numbers.", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"]
)
SEARCH = _tool(
    "search_orders",
    "Orders of a customer, newest first.",
    {"customer_id": {"type": "integer"}, "limit": {"type": "integer", "minimum": 1}},
    ["customer_id"],
)
# Each prompt with the tools it is offered; the first is the one it wants.
PROMPTS: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = (
    ("What is the weather in Paris right now, in celsius?", (WEATHER, ADD)),
    ("Add 1234.5 and 87.25 with the tool.", (ADD, SEARCH)),
    ("Show the last 3 orders of customer 4711.", (SEARCH, WEATHER)),
)


@dataclass(frozen=True)
class ToolCalls:
    """What the check found: the parser, how many prompts, how many answered with a valid
    call, the rate, and per invalid answer why."""

    parser: str
    asked: int
    valid: int
    rate: float
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parser_of(deployment: Deployment) -> str:
    """The deployment's tool-call parser when auto tool choice is on, else ""."""
    args = deployment.serve_args
    if not args.get("enable-auto-tool-choice"):
        return ""
    return str(args.get("tool-call-parser") or "")


def check_tool_calls(host: RemoteHost, target: Target, parser: str) -> ToolCalls:
    """Send the fixed prompts (greedy) and judge the calls that come back."""
    bodies = [
        {
            "messages": [{"role": "user", "content": prompt}],
            "tools": list(tools),
            "tool_choice": "auto",
            "temperature": 0,
            "max_tokens": ANSWER_TOKENS,
        }
        for prompt, tools in PROMPTS
    ]
    args: dict[str, Any] = {
        "port": target.port, "model": target.model, "chat": bodies, "timeout": REQUEST_TIMEOUT,
    }  # fmt: skip
    if target.api_key:
        args["bearer"] = target.api_key
    answers = host.probe(PROBE, args, timeout=REQUEST_TIMEOUT * len(bodies) + 30)["answers"]
    return judge(parser, [tools for _, tools in PROMPTS], answers)


def judge(
    parser: str, offered: Sequence[Sequence[Mapping[str, Any]]], answers: Sequence[Mapping]
) -> ToolCalls:
    """Each answer against the tools its prompt offered."""
    problems = []
    for n, (tools, answer) in enumerate(zip(offered, answers, strict=True), 1):
        why = call_problem(tools, answer)
        if why:
            problems.append(f"prompt {n}: {why}")
    valid = len(answers) - len(problems)
    rate = round(valid / len(answers), 4) if answers else 0.0
    return ToolCalls(parser, len(answers), valid, rate, problems)


def call_problem(tools: Sequence[Mapping[str, Any]], answer: Mapping[str, Any]) -> str:
    """Why an answer is no valid tool call, or "" when it is."""
    if not answer.get("ok"):
        return f"request failed: {answer.get('error')}"
    calls = (answer.get("message") or {}).get("tool_calls") or []
    if not calls:
        return "no tool call (the parser found none in the reply)"
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    for call in calls:
        function = call.get("function") or {}
        name = function.get("name")
        if name not in schemas:
            return f"called {name!r}, not an offered tool"
        try:
            arguments = json.loads(function.get("arguments") or "")
        except ValueError:
            return f"{name}: arguments are not JSON: {str(function.get('arguments'))[:80]!r}"
        problem = schema_problem(arguments, schemas[name])
        if problem:
            return f"{name}: {problem}"
    return ""


def schema_problem(instance: Any, schema: Mapping[str, Any]) -> str:
    """Why ``instance`` is not valid against ``schema``, or "" when it is.

    jsonschema is imported here, on the first tool call checked, not with this module: every
    stage's kernel imports the runbook's stages, and importing jsonschema there imports each
    optional format checker installed beside it (rfc3987_syntax compiles its grammars at
    import: 0.9 s of this machine's CPU, see :mod:`opsbook.core.optional_imports`), in a
    kernel, where opsbook does not skip them.
    """
    import jsonschema

    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as error:
        return str(error.message)
    return ""


def own_findings(found: ToolCalls) -> list[Finding]:
    """Invalid calls: a warning naming the first problem (a model may miss a schema now and
    then), an error when no call at all was valid (the parser or template is broken)."""
    if not found.problems:
        return []
    return [
        Finding(
            "error" if found.valid == 0 else "warning",
            f"tool calls ({found.parser})",
            f"{found.valid} of {found.asked} tool call(s) valid against their schema: "
            f"{found.problems[0]}",
            "check the tool-call parser and the chat template the server uses "
            "(MoonshotAI/K2-Vendor-Verifier measures the same)",
            code=CODE_TOOL_CALLS,
        )
    ]


def against_last_good(
    now: Mapping[str, Any], good: Mapping[str, Any], source: str = ""
) -> list[Finding]:
    """A lower valid rate than the last good run's (same prompts) is an error."""
    if float(now.get("rate", 0.0)) >= float(good.get("rate", 0.0)):
        return []
    return [
        Finding(
            "error",
            f"tool calls ({now.get('parser')})",
            f"valid tool calls fell from {good['rate']:.0%} in the last good run to "
            f"{now['rate']:.0%}",
            "compare the parser, the chat template and the release with the last good run",
            source=source,
            code=CODE_TOOL_REGRESSION,
        )
    ]
