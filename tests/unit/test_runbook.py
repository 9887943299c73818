"""The runbook's notebooks found in the package and copied into a folder of the user's:
`opsbook runbook copy` copies what is missing, leaves what is the same, and replaces a changed
notebook only when told to (else exit 2, nothing copied)."""

import os
from pathlib import Path

import pytest

from opsbook import cli
from opsbook.core.exceptions import RunbookCopyRefused
from opsbook.runner import run
from opsbook.runner.runbook import copy_runbook, notebooks, notebooks_dir

REPOSITORY = Path(__file__).resolve().parents[2]
NAMES = sorted(p.name for p in (REPOSITORY / "notebooks").glob("*.ipynb"))


def test_a_checkout_finds_its_own_notebooks_through_the_package() -> None:
    assert notebooks_dir() == (REPOSITORY / "notebooks").resolve()
    assert [p.name for p in notebooks()] == NAMES
    assert len(NAMES) == 8


def test_the_first_copy_copies_every_notebook_and_makes_the_folder(tmp_path: Path) -> None:
    done = copy_runbook(tmp_path / "mine" / "runbook")
    assert done.copied == tuple(NAMES) and not done.replaced and not done.unchanged
    for name in NAMES:
        copy = tmp_path / "mine" / "runbook" / name
        assert copy.read_bytes() == (REPOSITORY / "notebooks" / name).read_bytes()
        assert os.access(copy, os.W_OK)


def test_a_second_copy_leaves_the_same_notebooks_alone(tmp_path: Path) -> None:
    copy_runbook(tmp_path)
    (tmp_path / "notes.md").write_text("mine")
    done = copy_runbook(tmp_path)
    assert done.unchanged == tuple(NAMES) and not done.copied and not done.replaced
    assert (tmp_path / "notes.md").read_text() == "mine"


def test_a_changed_notebook_is_kept_and_nothing_is_copied_without_force(tmp_path: Path) -> None:
    copy_runbook(tmp_path)
    changed = tmp_path / NAMES[4]
    changed.write_text("my edits")
    (tmp_path / NAMES[0]).unlink()
    with pytest.raises(RunbookCopyRefused, match=NAMES[4]) as refused:
        copy_runbook(tmp_path)
    assert "--force" in str(refused.value.remedy)
    assert changed.read_text() == "my edits"
    assert not (tmp_path / NAMES[0]).exists()

    done = copy_runbook(tmp_path, force=True)
    assert done.replaced == (NAMES[4],) and done.copied == (NAMES[0],)
    assert changed.read_bytes() == (REPOSITORY / "notebooks" / NAMES[4]).read_bytes()


def test_a_folder_under_a_notebooks_name_is_never_replaced(tmp_path: Path) -> None:
    (tmp_path / NAMES[2]).mkdir()
    (tmp_path / NAMES[2] / "keep").write_text("x")
    with pytest.raises(RunbookCopyRefused, match="something else than a file"):
        copy_runbook(tmp_path, force=True)
    assert (tmp_path / NAMES[2] / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAMES[2]]


def test_the_command_says_what_it_copied_and_exits_0(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "nb"
    assert cli.main(["runbook", "copy", str(folder)]) == run.EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [f"copied    {folder / name}" for name in NAMES]
    assert out[-1] == (
        f"8 copied, 0 replaced, 0 unchanged; step through them with: jupyter lab {folder}"
    )


def test_the_command_refuses_a_changed_notebook_with_exit_2(tmp_path: Path, capsys) -> None:
    copy_runbook(tmp_path)
    (tmp_path / NAMES[1]).write_text("my edits")
    assert cli.main(["runbook", "copy", str(tmp_path)]) == run.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"holds changed copies of {NAMES[1]}: nothing was copied" in err
    assert "remedy:" in err and "--force" in err
    assert cli.main(["runbook", "copy", str(tmp_path), "--force"]) == run.EXIT_OK
    assert f"replaced  {tmp_path / NAMES[1]}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["runbook", "copy"], "runbook copy needs a folder"),
        (["runbook", "copy", "{file}"], "is not a folder"),
    ],
)
def test_the_command_refuses_a_missing_or_wrong_folder_with_exit_2(
    argv: list[str], said: str, tmp_path: Path, capsys
) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    assert cli.main([a.format(file=file) for a in argv]) == run.EXIT_USAGE
    assert said in capsys.readouterr().err


def test_the_command_prints_where_the_notebooks_are(capsys) -> None:
    assert cli.main(["runbook", "path"]) == run.EXIT_OK
    assert capsys.readouterr().out.strip() == str(notebooks_dir())
