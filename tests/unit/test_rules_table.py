"""Contract: every flag rule of ``compat_rules.yaml`` agrees with each release's serve parser.

A flag rule is one whose conditions name serve flags (``serve_arg_set``, ``serve_arg_missing``)
or ``--kv-cache-dtype`` values (``kv_flag``). For every release in
``opsbook/knowledge/data/vllm_facts`` (the serve flags read from its vllm/engine/arg_utils.py and
entrypoints cli_args.py by tools/vllm_facts.py):

- a rule that predicts ``unrecognized arguments`` fires exactly on the releases whose parser
  lacks the flag;
- any other flag rule, on the releases its version range covers, names only flags the parser
  has (in its conditions and in its remedy) and only ``--kv-cache-dtype`` values it accepts.
"""

from __future__ import annotations

import re

import pytest

from opsbook.knowledge import compat, vllm_facts
from opsbook.knowledge.compat import rules_table
from opsbook.knowledge.compat.rules_table import Rule, parse_version, version_in

RELEASES = vllm_facts.releases()
FLAG_IN_TEXT = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")


def flag_rules(table: rules_table.RulesTable | None = None) -> list[Rule]:
    rules = (table or compat.load_rules()).rules
    return [r for r in rules if r.when.serve_arg_set or r.when.serve_arg_missing or r.when.kv_flag]


def _flag(name: str) -> str:
    # "attention-config.backend" is a key of --attention-config.
    return "--" + name.split(".")[0]


def disagreements(rule: Rule, release: str) -> list[str]:
    facts = vllm_facts.load(release)
    in_range = version_in(parse_version(release), rule.when.vllm_version)
    named = [*(rule.when.serve_arg_set or ()), *(rule.when.serve_arg_missing or ())]
    out = []
    if "unrecognized arguments" in rule.failure:
        for flag in map(_flag, named):
            lacks = flag not in facts.serve_flags
            if bool(in_range) != lacks:
                out.append(f"{rule.id} on {release}: fires={in_range}, parser lacks {flag}={lacks}")
        return out
    if not in_range:
        return out
    for flag in sorted({*map(_flag, named), *FLAG_IN_TEXT.findall(rule.remedy)}):
        if flag not in facts.serve_flags:
            out.append(f"{rule.id} on {release}: names {flag}, not a serve flag of {release}")
    for value in rule.when.kv_flag or ():
        if not facts.kv_dtype_known(value):
            out.append(f"{rule.id} on {release}: --kv-cache-dtype {value} is not accepted")
    return out


def test_the_table_has_flag_rules_and_the_facts_every_release() -> None:
    ids = {r.id for r in flag_rules()}
    assert {"disable-log-requests-removed", "tool-parser-without-auto-choice"} <= ids
    assert RELEASES[0] == "0.10.2" and "0.33.0" in RELEASES and len(RELEASES) >= 26


@pytest.mark.parametrize("rule", flag_rules(), ids=[r.id for r in flag_rules()])
def test_every_flag_rule_agrees_with_every_release_parser(rule: Rule) -> None:
    found = [d for release in RELEASES for d in disagreements(rule, release)]
    assert found == []


def test_0_33_0_accepts_disable_log_requests_again() -> None:
    """EnableDisableAction (vLLM 0.33.0 vllm/utils/argparse_utils.py) pairs
    --enable-log-requests with --disable-log-requests; 0.17.1-0.32.0 have neither."""
    for release, has in (("0.16.0", True), ("0.17.1", False), ("0.32.0", False), ("0.33.0", True)):
        assert ("--disable-log-requests" in vllm_facts.load(release).serve_flags) is has, release
    rule = next(r for r in flag_rules() if r.id == "disable-log-requests-removed")
    assert version_in(parse_version("0.33.0"), rule.when.vllm_version) is False


def test_the_contract_fails_when_a_removal_rule_has_no_upper_bound() -> None:
    rule = next(r for r in flag_rules() if r.id == "disable-log-requests-removed")
    open_ended = rule.model_copy(
        update={"when": rule.when.model_copy(update={"vllm_version": ">=0.17"})}
    )
    assert disagreements(open_ended, "0.33.0") == [
        "disable-log-requests-removed on 0.33.0: fires=True, parser lacks "
        "--disable-log-requests=False"
    ]


def test_the_contract_fails_when_a_rule_names_a_flag_the_release_lacks() -> None:
    rule = next(r for r in flag_rules() if r.id == "tool-parser-without-auto-choice")
    wrong = rule.model_copy(update={"remedy": "Add --enable-auto-tool-choise."})
    assert disagreements(wrong, "0.20.2") == [
        "tool-parser-without-auto-choice on 0.20.2: names --enable-auto-tool-choise, "
        "not a serve flag of 0.20.2"
    ]
