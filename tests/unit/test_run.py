from pathlib import Path

import nbformat
import pytest

from opsbook.core.exceptions import RunError
from opsbook.core.results import EXIT_TOOL_FAILED, EXIT_UNREACHABLE, HostResult, State
from opsbook.runner import deploy, execution, parameters


@pytest.fixture
def notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    cell = nbformat.v4.new_code_cell("deployment = 'x.yml'\nport = 8000")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    path = tmp_path / "00_check.ipynb"
    nbformat.write(nb, path)
    return path


def test_unknown_parameters_are_refused(notebook) -> None:
    parameters.check_parameters(notebook, {"deployment": "d.yml", "port": 1})
    with pytest.raises(RunError, match="no parameter") as e:
        parameters.check_parameters(notebook, {"prot": 1})
    assert "deployment, port" in (e.value.remedy or "")


def test_run_folders_are_never_reused(tmp_path, notebook) -> None:
    first = execution.new_run_folder(tmp_path / "runs", notebook.stem, "gpu-01")
    second = execution.new_run_folder(tmp_path / "runs", notebook.stem, "gpu-01")
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.endswith("-00_check-gpu-01")


def test_notebooks_are_found_by_stage_name() -> None:
    assert parameters.find_notebook("00_preflight").name == "00_preflight.ipynb"
    assert parameters.find_notebook("preflight").name == "00_preflight.ipynb"
    with pytest.raises(RunError, match="no notebook named"):
        parameters.find_notebook("nope")


@pytest.mark.parametrize(
    "ename, code",
    [
        ("ConnectionRefused", EXIT_UNREACHABLE),
        ("UnknownHostName", EXIT_UNREACHABLE),
        ("ProbeError", EXIT_TOOL_FAILED),
        ("ZeroDivisionError", EXIT_TOOL_FAILED),
    ],
)
def test_exit_codes_follow_the_exception(ename: str, code: int) -> None:
    assert execution.exit_code_for(ename) == code


def test_run_folders_are_absolute(tmp_path, notebook, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = execution.new_run_folder(Path("runs"), "deploy", "gpu-01")
    assert folder.is_absolute() and folder.parent == tmp_path / "runs"


@pytest.mark.parametrize(
    "serial, sizes",
    [
        (None, [5]),
        (0, [5]),
        (1, [1, 1, 1, 1, 1]),
        (2, [2, 2, 1]),
        ("40%", [2, 2, 1]),
        ("10%", [1] * 5),
    ],
)
def test_a_rolling_run_goes_in_batches(serial, sizes) -> None:
    hosts = list("abcde")
    batches = deploy.plan_batches(hosts, serial)
    assert [len(b) for b in batches] == sizes and sum(batches, []) == hosts


@pytest.mark.parametrize("serial", [-1, "x", "0%"])
def test_a_bad_batch_size_is_refused(serial) -> None:
    with pytest.raises(RunError, match="serial"):
        deploy.plan_batches(["a"], serial)


def test_the_run_stops_when_more_than_the_percentage_failed() -> None:
    results = [
        HostResult("a", "preflight", State.FAILED, ""),
        HostResult("a", "download", State.SKIPPED, ""),
        HostResult("b", "preflight", State.UNREACHABLE, ""),
        HostResult("c", "preflight", State.OK, ""),
    ]
    assert not deploy.too_many_failed(results, 4, None)
    assert not deploy.too_many_failed(results, 4, 50)
    assert deploy.too_many_failed(results, 4, 49)


def test_every_host_and_stage_of_a_run_has_a_result_saying_why_it_was_skipped() -> None:
    results = [
        HostResult("a", "preflight", State.OK, ""),
        HostResult("a", "download", State.FAILED, "truncated"),
        HostResult("b", "preflight", State.OK, ""),
    ]
    filled = deploy._with_skipped(results, ["a", "b"], "batch 1 failed")
    assert len(filled) == 12
    skipped = {(r.host, r.stage): r.message for r in filled if r.state is State.SKIPPED}
    assert skipped[("a", "launch")] == "not run: failed at download"
    assert skipped[("b", "download")] == "not run: batch 1 failed"


def _notebook_printing(path, text: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def test_a_record_with_a_secret_is_rewritten_masked(tmp_path) -> None:
    from opsbook.core.redact import Redactor

    path = _notebook_printing(tmp_path / "s.ipynb", "vllm serve --api-key s3cr3t-value\n")
    execution.redact_notebook(path, Redactor(["s3cr3t-value"]))
    assert "s3cr3t-value" not in path.read_text()
    assert "--api-key ***" in nbformat.read(path, as_version=4).cells[0].outputs[0]["text"]


def test_a_record_without_secrets_is_left_as_written(tmp_path) -> None:
    from opsbook.core.redact import Redactor

    path = _notebook_printing(tmp_path / "clean.ipynb", "8 GPUs, all idle\n")
    path.write_text(path.read_text() + "\n")  # bytes nbformat would not write back
    written = path.read_bytes()
    execution.redact_notebook(path, Redactor(["s3cr3t-value"]))
    assert path.read_bytes() == written


@pytest.mark.parametrize("cut_after_secret", [False, True])
def test_a_notebook_whose_writing_a_signal_cut_short_is_masked_as_text(
    tmp_path, cut_after_secret
) -> None:
    # A SIGTERM during papermill's save leaves an empty or half-written file (seen in an
    # interrupted deploy, which then exited 1 with a traceback instead of sealing its record).
    from opsbook.core.redact import Redactor

    path = _notebook_printing(tmp_path / "cut.ipynb", "vllm serve --api-key s3cr3t-value\n")
    whole = path.read_text()
    cut = whole.index("s3cr3t-value") + len("s3cr3t-value") + 3 if cut_after_secret else 0
    path.write_text(whole[:cut])
    execution.redact_notebook(path, Redactor(["s3cr3t-value"]))
    assert "s3cr3t-value" not in path.read_text()
    assert path.read_text().startswith(whole[: min(cut, whole.index("s3cr3t-value"))])


# -- a runs folder that cannot hold a run (issue 32, item 7) ----------------------------------


def _run_in(tmp_path: Path, runs: Path, notebook: str = "00_preflight") -> int:
    from opsbook import cli

    dep = tmp_path / "d.yml"
    dep.write_text("hosts: [{address: 127.0.2.250, port: 42250}]\nmodel: {path: /m}\n")
    return cli.main(["run", notebook, "-f", str(dep), "--runs-dir", str(runs)])


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda t: (t / "file").write_text("x") and t / "file" / "runs", "not a directory"),
        (lambda t: (t / "file").write_text("x") and t / "file", "file exists"),
        (lambda t: Path("/proc/opsbook-runs"), "no such file or directory"),
        (lambda t: Path("/proc/version/runs"), "not a directory"),
    ],
)
def test_a_runs_folder_that_cannot_be_made_exits_2_without_a_traceback(
    tmp_path, capsys, make, said: str
) -> None:
    runs = make(tmp_path)
    assert _run_in(tmp_path, runs) == execution.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"cannot create a run folder in {runs}" in err and said in err, err
    assert "--runs-dir" in err and "Traceback" not in err


@pytest.mark.parametrize("notebook", ["00_preflight", "deploy"])
def test_a_full_runs_folder_is_refused_before_any_host(
    tmp_path, capsys, monkeypatch, notebook: str
) -> None:
    real = execution.os.statvfs

    def nearly_full(path: object) -> object:
        stats = real(path)  # type: ignore[arg-type]

        class Full:
            f_bavail, f_frsize = 3, stats.f_frsize

        return Full()

    monkeypatch.setattr(execution.os, "statvfs", nearly_full)
    runs = tmp_path / "runs"
    assert _run_in(tmp_path, runs, notebook) == execution.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"the runs folder {runs} is full" in err and "--runs-dir" in err, err
    assert list(runs.iterdir()) == []
