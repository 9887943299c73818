import marshal
import stat
import subprocess
from pathlib import Path

import pytest

from opsbook.core.exceptions import ProbeError
from opsbook.remote import probes
from opsbook.steps.config_answers import ConfigState


def test_decode_failure_carries_stderr() -> None:
    with pytest.raises(ProbeError) as e:
        probes.decode("x", "", "Traceback...\nZeroDivisionError: division by zero", 1, "h")
    assert "ZeroDivisionError" in str(e.value)
    assert "Traceback" in e.value.stderr


def test_decode_refuses_non_json() -> None:
    with pytest.raises(ProbeError, match="did not answer JSON"):
        probes.decode("x", "Welcome to the host!\n{}", "", 0)


def test_unknown_probe_is_named() -> None:
    with pytest.raises(ProbeError, match="no probe named 'nope'"):
        probes.source("nope")


def test_a_login_banner_around_the_answer_does_not_break_the_probe() -> None:
    import subprocess

    # What ssh returns when ~/.zshenv echoes a banner (and a logout script another line).
    script = "echo 'Welcome to gpu-01'; python3 -; echo 'bye'"
    proc = subprocess.run(
        ["bash", "-c", script],
        input=probes.assemble("configs", {"dir": "/nonexistent"}),
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.startswith("Welcome to gpu-01\n")
    answer = ConfigState.parse(probes.decode("configs", proc.stdout, proc.stderr, proc.returncode))
    assert answer.exists is False


def test_an_unframed_answer_is_refused() -> None:
    with pytest.raises(ProbeError, match="did not answer JSON"):
        probes.decode("x", '{"ok": true}', "", 0)


def _framed_run(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["python3", "-"], input=program, capture_output=True, text=True, check=True
    )


def test_a_large_answer_leaves_compressed_and_reads_back_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = {"dir": "/nonexistent"}
    plain = _framed_run(probes.assemble("configs", args))
    monkeypatch.setattr(probes, "COMPRESS_OVER", 10)  # this small answer counts as large
    packed = _framed_run(probes.assemble("configs", args))

    body = packed.stdout.split(probes.BEGIN)[1].split(probes.END)[0].strip()
    assert body.startswith(probes.COMPRESSED) and "{" not in body
    assert probes.decode("configs", packed.stdout, "", 0) == probes.decode(
        "configs", plain.stdout, "", 0
    )


@pytest.mark.parametrize("damaged", ["z:not base64!", "z:" + "QUJD" * 4])
def test_a_damaged_compressed_answer_is_refused(damaged: str) -> None:
    stdout = f"\n{probes.BEGIN}\n{damaged}\n{probes.END}\n"
    with pytest.raises(ProbeError, match="did not answer JSON"):
        probes.decode("x", stdout, "", 0)


# -- the compiled probe kept on the host ---------------------------------------------------


TAG = (
    "import sys, _frozen_importlib_external as e; "
    "print(sys.implementation.cache_tag + '-' + e.MAGIC_NUMBER.hex())"
)


def run_configs(cache: Path) -> dict[str, object]:
    answer: dict[str, object] = probes.run_local(
        "configs", {"dir": "/nonexistent"}, env={"XDG_CACHE_HOME": str(cache)}
    )
    return answer


def kept_files(cache: Path) -> list[Path]:
    return sorted((cache / "opsbook" / "probes").glob("configs-*.bin"))


def test_a_probe_is_compiled_once_and_its_code_kept_for_the_next_run(tmp_path: Path) -> None:
    assert ConfigState.parse(run_configs(tmp_path)).exists is False
    folder = tmp_path / "opsbook" / "probes"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    [kept] = kept_files(tmp_path)
    assert kept.name.startswith(f"configs-{probes.probe_body('configs')[1]}.")
    # The next run executes the kept code, not the text it is sent: a stand-in proves it.
    kept.write_bytes(marshal.dumps(compile("def main(args): return {'kept': True}", "x", "exec")))
    assert run_configs(tmp_path) == {"kept": True}


def test_a_damaged_or_older_kept_probe_is_replaced(tmp_path: Path) -> None:
    run_configs(tmp_path)
    [kept] = kept_files(tmp_path)
    older = kept.with_name("configs-0000000000000000" + kept.name[len("configs-") + 16 :])
    older.write_bytes(b"old")
    kept.write_bytes(b"\x00 not marshal data")
    assert ConfigState.parse(run_configs(tmp_path)).exists is False
    assert kept_files(tmp_path) == [kept] and kept.read_bytes() != b"\x00 not marshal data"


def test_a_cache_folder_others_may_write_to_is_neither_read_nor_written(tmp_path: Path) -> None:
    folder = tmp_path / "opsbook" / "probes"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    tag = subprocess.run(
        ["/usr/bin/python3", "-c", TAG], capture_output=True, text=True, check=True
    ).stdout.strip()
    planted = folder / f"configs-{probes.probe_body('configs')[1]}.{tag}.bin"
    planted.write_bytes(marshal.dumps(compile("def main(args): return {}", "x", "exec")))
    assert ConfigState.parse(run_configs(tmp_path)).exists is False  # the planted code was not run
    assert list(folder.iterdir()) == [planted]


def test_a_probe_runs_when_no_cache_folder_can_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert ConfigState.parse(run_configs(blocker)).exists is False


def test_the_launcher_runs_a_probe_as_python_dash_would(tmp_path) -> None:
    import subprocess

    program = probes.assemble("configs", {"dir": str(tmp_path)})
    answers = [
        subprocess.run(argv, input=program, capture_output=True, text=True, check=True).stdout
        for argv in (probes.interpreter_argv("python3"), ["python3", "-"])
    ]
    decoded = [ConfigState.parse(probes.decode("configs", out, "", 0)) for out in answers]
    assert decoded[0] == decoded[1] and decoded[0].exists is True


# --- a probe split in parts ---------------------------------------------------------------


def test_a_probe_in_parts_goes_as_one_program_holding_each_part_once(tmp_path: Path) -> None:
    body, key = probes.probe_body("download")
    assert "from ." not in body and body.count("from __future__ import annotations") == 1
    assert body.startswith(probes.source("download").split("\n", 1)[0])
    for function in ("def check(", "def read_header(", "def find_partials(", "def hash_op("):
        assert body.count(function) == 1, function
    # run as the host runs it (relative imports would fail there: no package), and kept
    answer = probes.run_local(
        "download",
        {"op": "progress", "path": "/nonexistent"},
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert "does not exist" in answer["findings"][0]["message"]
    assert [p.name.split(".")[0] for p in (tmp_path / "opsbook" / "probes").iterdir()] == [
        f"download-{key}"
    ]


def parts(monkeypatch: pytest.MonkeyPatch, texts: dict[str, str]) -> None:
    monkeypatch.setattr(probes, "source", lambda name: texts[name])


def test_parts_are_joined_once_each_in_the_order_first_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parts(
        monkeypatch,
        {
            "p": "from __future__ import annotations\nfrom .q import f\nfrom .r import g\n"
            "TYPE_CHECKING = False\ndef main(args): return f() + g()\n",
            "q": "from __future__ import annotations\nfrom .r import g\nTYPE_CHECKING = False\n"
            "def f(): return g() * 10\n",
            "r": "from __future__ import annotations\n\ndef g(): return 1\n",
        },
    )
    program = probes.joined("p")
    assert program.count("from __future__") == 1 and "from ." not in program
    assert program.index("def main") < program.index("def f") < program.index("def g")
    namespace: dict[str, object] = {}
    exec(compile(program, "p", "exec"), namespace)
    assert namespace["main"]({}) == 11  # type: ignore[operator]


def test_two_parts_binding_one_name_otherwise_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    parts(monkeypatch, {"p": "from .q import f\nLIMIT = 1\ndef main(args): return f()\n",
                        "q": "LIMIT = 2\ndef f(): return LIMIT\n"})  # fmt: skip
    with pytest.raises(ProbeError, match="'p' and 'q' both define 'LIMIT'"):
        probes.joined("p")


def test_parts_binding_a_name_by_one_statement_with_other_comments_are_no_conflict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A statement is compared as the parser spans it: over lines, its comment left out, with
    # columns counted in UTF-8 bytes ("é" is two), and \r\n ends as the parser reads them.
    statement = 'NAMES = {\n    "é": 1,  # one\n    "b": "éé"}'
    parts(monkeypatch, {"p": f"from .q import f\r\n{statement}#p\r\ndef main(args): return f()\n",
                        "q": f"{statement}#q\ndef f(): return NAMES['é']\n"})  # fmt: skip
    namespace: dict[str, object] = {}
    exec(compile(probes.joined("p"), "p", "exec"), namespace)
    assert namespace["main"]({}) == 1  # type: ignore[operator]


def test_a_statement_is_spanned_as_the_parser_spans_it_in_every_probe() -> None:
    import ast
    import io

    for name in ("facts", "shard_read", "configs"):
        text = probes.source(name)
        lines = io.StringIO(text, newline="").readlines()
        for node in ast.parse(text).body:
            assert probes._segment(lines, node) == ast.get_source_segment(text, node)


def test_a_part_from_outside_the_probes_folder_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    parts(monkeypatch, {"p": "from ..hosts import Host\ndef main(args): return 1\n"})
    with pytest.raises(ProbeError, match="imports ..hosts"):
        probes.joined("p")


def test_probes_assembled_in_many_threads_at_once_all_come_out_whole() -> None:
    # A fleet's hosts assemble their probes in threads at once (ast.parse is not thread-safe
    # in CPython 3.11: python/cpython issue 106905).
    from concurrent.futures import ThreadPoolExecutor

    names = ["download", "facts", "launch", "configs"] * 8
    probes._assembled.cache_clear()
    with ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(probes.probe_body, names))
    assert len(set(bodies)) == 4
    assert bodies == [probes.probe_body(name) for name in names]
