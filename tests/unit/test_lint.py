"""Hazards of ad-hoc remote commands: the incident's one-liner, safe forms, and the claims
behind the rules proven with local bash and zsh (counting PIDs; nothing is killed)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from opsbook.knowledge.lint import (
    BACKGROUND_JOB,
    PARSE,
    PATTERN_KILL,
    SIGKILL_FIRST,
    SLEEP_WAIT,
    UNQUOTED_SPACE,
    ZSH_GLOB,
    bracketed,
    has_unquoted_glob,
    lint_command,
    lint_result,
    parse,
    rule_of,
    tokenize,
)

# DESIGN.md section 1, the launch that printed nothing and started nothing.
INCIDENT = (
    'pkill -9 -f "python3.*vllm"; sleep 3; rm -f /dev/shm/psm_* /dev/shm/sem.mp-*; '
    "NCCL_PROTO=LL NCCL_P2P_LEVEL=SYS nohup python3 -m vllm.entrypoints.openai.api_server "
    "--model /data/models/Kimi-K2.5-NVFP4 > log 2>&1 & echo PID"
)

SAFE = [
    "ls -la /data/models",
    "nvidia-smi --query-gpu=index --format=csv",
    "kill -TERM -- -1234",
    "setsid nohup ./launch.sh > log 2>&1 < /dev/null &",
    "find /dev/shm -maxdepth 1 -name 'psm_*' -delete",
    "df -h /dev/shm && free -g",
    "tail -n 50 ~/opsbook/vllm.log | grep -i error",
    "echo $? $((6*7)) \"$HOME\"/x '[v]llm' 2>/dev/null",
    "kill -TERM -- -1234; while kill -0 -- -1234 2>/dev/null; do sleep 1; done",
    "timeout 60 tail --pid=1234 -f /dev/null",
    "cp /etc/hosts backup/hosts",
    "[ -f /tmp/x ] && [[ $a == b* ]] && echo ok",
    "ps -eo pid,pgid,args | grep '[V]LLM::'",
    "curl -s 'http://127.0.0.1:8000/v1/models?x=1'",
    "echo 'pkill -9 -f vllm; rm /dev/shm/*'",
    "bash -c 'rm -f /dev/shm/psm_*'",
    "cat /data/models/x/config.json # show *.json",
]


def rules(command: str) -> set[str]:
    return {rule_of(f) for f in lint_command(command)}


def test_the_incident_one_liner_shows_every_hazard() -> None:
    findings = lint_command(INCIDENT)
    assert {rule_of(f) for f in findings} == {
        PATTERN_KILL,
        ZSH_GLOB,
        BACKGROUND_JOB,
        SIGKILL_FIRST,
        SLEEP_WAIT,
    }
    by_rule = {rule_of(f): f for f in findings}
    kill = by_rule[PATTERN_KILL]
    assert kill.severity == "error" and "matches this command line itself" in kill.message
    assert "VLLM::EngineCore" in kill.message
    assert "kill -TERM -- -PGID" in kill.remedy and "[p]ython3.*vllm" in kill.remedy
    # The line also launches python3 -m vllm, so the bracketed pattern would match it too.
    assert "even the bracket trick fails" in kill.remedy
    globs = [f for f in findings if rule_of(f) == ZSH_GLOB]
    assert [f.subject for f in globs] == [
        "zsh-glob: /dev/shm/psm_*",
        "zsh-glob: /dev/shm/sem.mp-*",
    ]
    assert "find /dev/shm -maxdepth 1 -name 'psm_*' -user \"$USER\" -delete" in globs[0].remedy
    background = by_rule[BACKGROUND_JOB]
    assert "setsid" in background.message and "< /dev/null" in background.message
    assert "setsid nohup ./launch.sh > launch.log 2>&1 < /dev/null &" in background.remedy
    assert "SIGTERM first" in by_rule[SIGKILL_FIRST].remedy
    assert "tail --pid=PID" in by_rule[SLEEP_WAIT].remedy
    result = lint_result(INCIDENT)
    assert not result.ok and result.evidence.rules == sorted(by_rule)
    assert result.evidence.command == INCIDENT


@pytest.mark.parametrize("command", SAFE)
def test_safe_commands_have_no_findings(command: str) -> None:
    assert lint_command(command) == []
    assert lint_result(command).ok


@pytest.mark.parametrize(
    "command",
    [
        "pkill -f vllm; echo stopped",
        "pgrep -f 'vllm serve' | xargs kill",
        "kill $(pgrep -f api_server) && echo ok",
        "sudo pkill --full python3.*vllm && sleep 1",
        "pkill -f '[v]llm' ; nohup vllm serve /m > log 2>&1 < /dev/null &",
    ],
)
def test_a_pattern_that_matches_its_own_line_is_an_error(command: str) -> None:
    found = [f for f in lint_command(command) if rule_of(f) == PATTERN_KILL]
    assert len(found) == 1 and found[0].severity == "error", found


@pytest.mark.parametrize(
    "command",
    [
        "pkill -f vllm",  # a single command: bash execs pkill, no shell is left to match
        "sleep 3; pkill -f vllm",
        "pkill -f '[v]llm.entrypoints'; echo done",
        "pkill -A -f vllm; echo done",
        "pkill --ignore-ancestors -f vllm && echo done",
    ],
)
def test_a_pattern_kill_that_cannot_hit_its_own_shell_is_a_warning(command: str) -> None:
    found = [f for f in lint_command(command) if rule_of(f) == PATTERN_KILL]
    assert [f.severity for f in found] == ["warning"]


def test_name_kills_and_api_server_patterns_mention_renamed_children() -> None:
    (killall,) = lint_command("killall python3")
    assert rule_of(killall) == PATTERN_KILL and "VLLM::EngineCore" in killall.message
    (api,) = [f for f in lint_command("pkill -f api_server") if rule_of(f) == PATTERN_KILL]
    assert "VLLM::EngineCore" in api.message
    (titles,) = [f for f in lint_command("pkill -f '^VLLM::'") if rule_of(f) == PATTERN_KILL]
    assert "rename themselves" not in titles.message


def test_sigkill_is_fine_after_a_sigterm() -> None:
    assert SIGKILL_FIRST in rules("kill -9 1234")
    assert SIGKILL_FIRST in rules("kill -s KILL 1234")
    assert SIGKILL_FIRST in rules("kill -SIGKILL -- -1234")
    assert SIGKILL_FIRST in rules("pkill --signal=KILL -x myserver")
    assert SIGKILL_FIRST not in rules("kill -TERM 1234; kill -0 1234 && kill -9 1234")
    assert SIGKILL_FIRST not in rules("kill -0 1234")


def test_sleep_after_a_kill_is_a_guess_but_a_poll_loop_is_not() -> None:
    assert SLEEP_WAIT in rules("kill 1234; sleep 5; ./launch.sh")
    assert SLEEP_WAIT in rules("kill -TERM -- -1234 && sleep 10")
    assert SLEEP_WAIT not in rules("sleep 5; kill 1234")
    assert SLEEP_WAIT not in rules("kill 1; until ! kill -0 1 2>/dev/null; do sleep 1; done")


@pytest.mark.parametrize(
    ("command", "severity", "missing"),
    [
        ("python3 -m http.server &", "error", "stdout redirection"),
        ("nohup ./launch.sh &", "error", "stdout redirection"),
        ("./launch.sh > log 2>&1 &", "warning", "nohup or setsid"),
        ("nohup ./launch.sh > log &", "error", "stderr redirection"),
        ("nohup ./launch.sh > log 2>&1 &", "info", "setsid"),
        ("setsid nohup ./launch.sh &> log &", "info", "< /dev/null"),
    ],
)
def test_background_jobs_need_detaching(command: str, severity: str, missing: str) -> None:
    (found,) = [f for f in lint_command(command) if rule_of(f) == BACKGROUND_JOB]
    assert found.severity == severity and missing in found.message


def test_unquoted_paths_with_spaces() -> None:
    path = "/data/models/Kimi K2.5"
    (known,) = lint_command(f"ls {path}/config.json", paths=[path])
    assert rule_of(known) == UNQUOTED_SPACE and known.severity == "warning"
    assert "'/data/models/Kimi K2.5'" in known.remedy
    assert lint_command(f"ls '{path}/config.json'", paths=[path]) == []
    assert lint_command("ls /data/models/Kimi\\ K2.5/x", paths=[path]) == []
    (split,) = lint_command("cat /data/My Models/config.json")
    assert rule_of(split) == UNQUOTED_SPACE and split.severity == "info"


def test_globs_are_found_only_outside_quotes() -> None:
    assert has_unquoted_glob("/dev/shm/psm_*")
    assert has_unquoted_glob("[v]llm") and has_unquoted_glob("x?")
    for word in [
        "'psm_*'",
        '"psm_*"',
        "psm_\\*",
        "$?",
        "$*",
        "[",
        "[[",
        "a]b",
        "${A[@]}",
        "${x%%*/}",
    ]:
        assert not has_unquoted_glob(word), word
    assert ZSH_GLOB in rules("pkill -f [v]llm")  # the bracket trick must be quoted
    (listing,) = lint_command("ls /data/models/*/config.json")
    assert rule_of(listing) == ZSH_GLOB and listing.severity == "info"
    assert lint_result("ls /data/models/*/config.json").ok
    assert ZSH_GLOB not in rules("noglob rm -f /dev/shm/psm_*")


def test_tokens_keep_their_source_and_operators_are_unquoted_only() -> None:
    tokens = tokenize("echo 'a;b' \"c d\"; ls>x 2>&1")
    assert [(t.text, t.operator) for t in tokens] == [
        ("echo", False),
        ("a;b", False),
        ("c d", False),
        (";", True),
        ("ls", False),
        (">", True),
        ("x", False),
        ("2", False),
        (">&", True),
        ("1", False),
    ]
    assert tokens[1].raw == "'a;b'" and tokens[2].raw == '"c d"'
    commands = parse("A=1 sudo -u me nohup x > out 2>&1 < /dev/null & y | z && w")
    assert [c.argv for c in commands] == [["sudo", "-u", "me", "nohup", "x"], ["y"], ["z"], ["w"]]
    assert [c.after for c in commands] == ["&", "|", "&&", ""]
    assert [(r.fd, r.op, r.target) for r in commands[0].redirects] == [
        ("", ">", "out"),
        ("2", ">&", "1"),
        ("", "<", "/dev/null"),
    ]
    assert commands[0].unwrapped() == (["x"], {"sudo", "nohup"})


def test_an_unclosed_quote_is_reported_not_raised() -> None:
    (found,) = lint_command("echo 'oops")
    assert rule_of(found) == PARSE and found.severity == "error"


def test_bracketed() -> None:
    assert bracketed("python3.*vllm") == "[p]ython3.*vllm"
    assert bracketed("^VLLM::") == "^[V]LLM::"
    assert bracketed("[v]llm") == "[v]llm"


def pgrep_pids(script: str) -> list[int]:
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    return [int(line) for line in done.stdout.split()]


@pytest.mark.parametrize(
    "template",
    [
        "pgrep -f '{p}'; true",
        "true; pgrep -f '{p}' 2>&1",
        "pgrep -f '{p}' | cat",
        "echo $(pgrep -f '{p}')",
        "if true; then pgrep -f '{p}'; fi",
    ],
)
def test_pkill_pattern_self_match_is_real(template: str) -> None:
    """Counts PIDs only: while the shell running the line stays alive, the unbracketed pattern
    matches that shell (the line's own text); the bracketed one does not; and the linter says
    the same."""
    marker = f"xyz-marker-{uuid.uuid4().hex[:12]}"
    # The bash -c running the line, and for a pipeline possibly its forked side that has not
    # yet exec'd `cat` (seen under load): at least one.
    assert len(pgrep_pids(template.format(p=marker))) >= 1
    assert pgrep_pids(template.format(p=bracketed(marker))) == []
    as_pkill = template.replace("pgrep", "pkill")
    assert severities(as_pkill.format(p=marker)) == ["error"]
    assert severities(as_pkill.format(p=bracketed(marker))) == ["warning"]


@pytest.mark.parametrize(
    "template", ["pgrep -f '{p}'", "sleep 0.1; pgrep -f '{p}'", "true && pgrep -f '{p}'"]
)
def test_a_lone_last_command_is_execd_and_cannot_match_its_shell(template: str) -> None:
    marker = f"xyz-marker-{uuid.uuid4().hex[:12]}"
    assert pgrep_pids(template.format(p=marker)) == []
    assert severities(template.replace("pgrep", "pkill").format(p=marker)) == ["warning"]


def severities(command: str) -> list[str]:
    return [f.severity for f in lint_command(command) if rule_of(f) == PATTERN_KILL]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_refuses_a_command_whose_glob_matches_nothing(tmp_path: Path) -> None:
    leftover = tmp_path / "sem.mp-abc"
    leftover.write_text("")
    line = f"rm -f {tmp_path}/psm_* {tmp_path}/sem.mp-* && echo removed"
    under_zsh = subprocess.run(["zsh", "-f", "-c", line], capture_output=True, text=True)
    assert "no matches found" in under_zsh.stderr and "removed" not in under_zsh.stdout
    assert leftover.exists()  # rm never ran, not even for the pattern that matched
    assert ZSH_GLOB in rules(line)
    under_bash = subprocess.run(["bash", "-c", line], capture_output=True, text=True)
    assert under_bash.stdout == "removed\n" and not leftover.exists()


# -- lines handed to another shell (issue 13) ------------------------------------------------

WRAPPED = "pkill -f vllm; nohup python3 -m vllm.entrypoints.openai.api_server --model /m &"


def rule_severities(command: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for f in lint_command(command):
        found.setdefault(rule_of(f), set()).add(f.severity)
    return found


@pytest.mark.parametrize(
    "command",
    [
        f"ssh gpu '{WRAPPED}'",
        f"ssh -p 2222 -i ~/.ssh/id -o BatchMode=yes ubuntu@gpu '{WRAPPED}'",
        f"ssh -tt gpu '{WRAPPED}'",
        f"ssh gpu \"bash -c '{WRAPPED}'\"",
        f"bash -c '{WRAPPED}'",
        f"bash -lc '{WRAPPED}'",
        f"sh -c '{WRAPPED}'",
        f"sudo bash -c '{WRAPPED}'",
        f"su - ops -c '{WRAPPED}'",
        f"su ops --command='{WRAPPED}'",
        f"ssh gpu <<'EOF'\n{WRAPPED}\nEOF",
        f"ssh gpu \"ssh inner '{WRAPPED}'\"",
    ],
)
def test_the_incidents_line_is_found_inside_ssh_and_shells(command: str) -> None:
    found = rule_severities(command)
    # The shell running the line outlives pkill and matches its pattern: it kills itself.
    assert "error" in found.get(PATTERN_KILL, set()), found
    assert "error" in found.get(BACKGROUND_JOB, set()), found


def test_a_nested_finding_says_where_it_is() -> None:
    messages = [f.message for f in lint_command(f"ssh gpu '{WRAPPED}'")]
    assert any(m.startswith("inside ssh host '...': ") for m in messages)


@pytest.mark.parametrize(
    "command",
    [
        "ssh gpu 'cat /etc/hostname'",
        "ssh -p 22 gpu",  # a login, no command
        "bash -c 'rm -f /dev/shm/psm_*'",  # bash leaves an unmatched glob as it is
        "ssh gpu 'systemctl status vllm'",
    ],
)
def test_harmless_wrapped_lines_stay_clean(command: str) -> None:
    assert lint_result(command).ok, lint_result(command)


def test_a_glob_inside_ssh_is_a_zsh_glob_but_not_inside_bash_c() -> None:
    assert ZSH_GLOB in rule_severities("ssh gpu 'rm -f /dev/shm/psm_*'")
    assert ZSH_GLOB not in rule_severities("ssh gpu bash -c \"'rm -f /dev/shm/psm_*'\"")


@pytest.mark.parametrize("command", ["", "   ", "\n\n", "# only a comment", "  # c\n"])
def test_an_empty_command_is_bad_input(command: str, capsys) -> None:
    from opsbook import cli
    from opsbook.runner import run

    assert cli.main(["lint", command]) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert "nothing to lint" in err and "remedy:" in err


def _lint_seconds(size: int) -> float:
    import time

    repeated = "; ".join([INCIDENT] * (size // len(INCIDENT) + 1))
    command = f"ssh gpu '{repeated[:size].rsplit(';', 1)[0]}'"
    # CPU seconds of this process: a neighbour's load (the other test worker) does not count.
    began = time.process_time()
    result = lint_result(command)
    assert not result.ok
    return time.process_time() - began


def test_lint_time_grows_linearly_with_the_command() -> None:
    # A ratio measured in the same run, not a wall-clock bound: 10x the size must cost about
    # 10x the time (a quadratic scan costs 100x; 120 KB once took 198 s). Best of three each.
    small = min(_lint_seconds(12_000) for _ in range(3))
    large = min(_lint_seconds(120_000) for _ in range(3))
    assert large / small < 30, (small, large)


# -- a kill hidden behind an alias, a function, eval or a variable (issue 32, item 6) ---------


@pytest.mark.parametrize(
    "command",
    [
        "alias k='pkill -f vllm'; k",
        "alias stop='pkill -f vllm' ll='ls -l'\nstop",
        "k() { pkill -f vllm; }; k",
        "function k { pkill -f vllm; }; k",
        "function k() {\n  pkill -f vllm\n}\nk",
        "eval 'pkill -f vllm'",
        "eval pkill -f vllm",
        'eval "pkill -f $PAT vllm"',
        "sudo eval 'pkill -f vllm'",
        "x='pkill -f vllm'; $x",
        "x='pkill -f'; $x vllm",
        "export K='pkill -f vllm'; ${K}",
        "declare -r K='pkill -f vllm'; $K",
        "ssh gpu \"eval 'pkill -f vllm'\"",
        "bash -c \"alias k='pkill -f vllm'; k\"",
        "sh -c 'eval \"pkill -f vllm\"'",
        "eval \"eval 'pkill -f vllm'\"",
        "if true; then eval 'pkill -f vllm'; fi",
    ],
)
def test_a_pattern_kill_behind_an_alias_function_eval_or_variable_is_found(command: str) -> None:
    result = lint_result(command)
    assert not result.ok, result
    assert PATTERN_KILL in result.evidence.rules


def test_a_hidden_kill_says_where_it_hides() -> None:
    for command, where in [
        ("alias k='pkill -f vllm'; k", "inside alias k='...': "),
        ("eval 'pkill -f vllm'", "inside eval '...': "),
        ("x='pkill -f vllm'; $x", "inside $x: "),
    ]:
        messages = [f.message for f in lint_command(command) if rule_of(f) == PATTERN_KILL]
        assert any(m.startswith(where) for m in messages), messages


@pytest.mark.parametrize(
    "command",
    [
        "alias ll='ls -l'; ll",
        'eval "$(ssh-agent -s)"',
        "eval 'echo vllm'",
        "x='pkill -f vllm' env | grep x",  # an environment for one command, not a variable
        "x=ls; $x -l",
        "$UNSET_VARIABLE --version",
        "function show { systemctl status vllm; }; show",
        "alias",
        "eval",
    ],
)
def test_harmless_aliases_functions_and_evals_stay_clean(command: str) -> None:
    assert lint_result(command).ok, lint_result(command)


def test_a_glob_in_eval_is_judged_by_the_shell_running_it() -> None:
    # eval runs in the line's own shell: under zsh (ssh) an unmatched glob stops it.
    assert ZSH_GLOB in rule_severities("ssh gpu \"eval 'rm -f /dev/shm/psm_*'\"")
    assert ZSH_GLOB not in rule_severities("bash -c \"eval 'rm -f /dev/shm/psm_*'\"")
