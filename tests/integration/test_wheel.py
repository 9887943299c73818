"""The package as a user gets it: a wheel built from the repository, installed with pip into a
fresh venv in an empty folder, runs `opsbook sandbox up`, `opsbook run deploy` and
`opsbook runbook copy` there, with no checkout on its path.

The venv borrows the dependencies of the tests' own environment (a ``.pth`` line added after pip
installed the wheel, and a link to their Jupyter data files): installing Jupyter anew would
take minutes. opsbook itself comes only from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import sandbox_folder

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parents[2]
ADDRESS = "127.0.7.40"  # 127.0.7.0/24: no other test uses it


@dataclass(frozen=True)
class Installed:
    """A venv holding the wheel, and the empty folder the user works in."""

    wheel: Path
    source: Path
    venv: Path
    work: Path

    @property
    def site_packages(self) -> Path:
        found = list((self.venv / "lib").glob("python*/site-packages"))
        assert len(found) == 1, found
        return found[0]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``opsbook ARGS`` from the venv, in the work folder, as the user's shell runs it."""
        return subprocess.run(
            [str(self.venv / "bin" / "opsbook"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.work,
            env=user_environment(self.venv),
        )


def user_environment(venv: Path) -> dict[str, str]:
    """The tests' environment less what points at the checkout (PYTHONPATH) or another venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def repository_files() -> list[str]:
    """The repository's files as git knows them, tracked or new (not ignored), still present."""
    listed = subprocess.run(
        ["git", "-C", str(REPOSITORY), "ls-files", "-z", "--cached", "--others"]
        + ["--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted({n for n in listed.split("\0") if n and os.path.lexists(REPOSITORY / n)})


def copy_repository(into: Path) -> Path:
    """The repository's files alone, links kept as links: no build/ or egg-info left by an
    earlier build can reach the wheel, and the checkout stays untouched."""
    for name in repository_files():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPOSITORY / name, target, follow_symlinks=False)
    return into


def pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=user_environment(python.parent.parent),
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    source = copy_repository(root / "source")
    dist = root / "dist"
    pip(Path(sys.executable), "wheel", "--no-deps", "--quiet", "-w", str(dist), str(source))
    (wheel,) = dist.glob("opsbook-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip(venv / "bin" / "python", "install", "--no-deps", "--quiet", str(wheel))
    work = root / "work"
    work.mkdir()
    done = Installed(wheel, source, venv, work)
    # After the install, so that pip saw only the fresh venv: the dependencies, never opsbook
    # (a path line adds a folder; the editable install's own .pth in it is not run).
    tests_site = sysconfig.get_path("purelib")
    (done.site_packages / "test-dependencies.pth").write_text(tests_site + "\n")
    # The dependencies' data files (nbconvert's templates, the kernel spec) are installed under
    # the environment's prefix, not its site-packages.
    (venv / "share").mkdir(exist_ok=True)
    (venv / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")
    return done


@pytest.fixture(scope="module")
def box_folder(installed: Installed) -> Iterator[Path]:
    """A rehearsal host started by the installed `opsbook sandbox up`, stopped by its `down`."""
    folder = sandbox_folder("wheel")
    up = installed.run("sandbox", "up", "--dir", str(folder), "--address", ADDRESS)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield folder
    finally:
        down = installed.run("sandbox", "down", "--dir", str(folder))
        shutil.rmtree(folder, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr


def test_the_wheel_holds_every_file_of_the_package_and_the_notebooks(
    installed: Installed,
) -> None:
    package = installed.source / "opsbook"
    expected = {
        str(Path(top).relative_to(installed.source) / name)
        for top, dirs, files in os.walk(package, followlinks=True)
        for name in files
        if "__pycache__" not in Path(top).parts
    }
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if name.startswith("opsbook/")}
    assert shipped == expected
    notebooks = {f"opsbook/notebooks/{p.name}" for p in (REPOSITORY / "notebooks").glob("*.ipynb")}
    assert notebooks and notebooks <= shipped


def test_the_installed_package_is_the_wheels_not_the_checkout(installed: Installed) -> None:
    code = (
        "import json, opsbook; from opsbook.runner import runbook; "
        "print(json.dumps([opsbook.__file__, str(runbook.notebooks_dir())]))"
    )
    done = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=installed.work,
        env=user_environment(installed.venv),
        check=True,
    )
    module, notebooks = (Path(p) for p in json.loads(done.stdout))
    assert module.is_relative_to(installed.site_packages), module
    assert Path(notebooks) == installed.site_packages / "opsbook" / "notebooks"
    path = installed.run("runbook", "path")
    assert path.returncode == 0, path.stderr
    assert path.stdout.strip() == str(notebooks)


def test_the_installed_opsbook_deploys_on_a_rehearsal_host(
    installed: Installed, box_folder: Path
) -> None:
    runs = installed.work / "runs"
    deployed = installed.run(
        "run", "deploy", "-f", str(box_folder / "deployment.yml"), "--runs-dir", str(runs)
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    (record,) = runs.iterdir()
    summary = json.loads((record / "summary.json").read_text())
    assert summary["exit_code"] == 0, summary["message"]
    executed = [entry["notebook"] for entry in summary["notebooks"]]
    assert len(executed) == 6 and all((record / name).is_file() for name in executed), executed


def test_the_installed_runbook_copies_into_the_users_folder(installed: Installed) -> None:
    copied = installed.run("runbook", "copy", "nb/")
    assert copied.returncode == 0, copied.stdout + copied.stderr
    names = sorted(p.name for p in (REPOSITORY / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (installed.work / "nb").iterdir()) == names
    for name in names:
        assert f"copied    nb/{name}" in copied.stdout
        shipped = installed.site_packages / "opsbook" / "notebooks" / name
        assert (installed.work / "nb" / name).read_bytes() == shipped.read_bytes()


def test_the_conda_environment_installs_the_package_itself() -> None:
    """environment.yml keeps no dependency list of its own: pip installs the package, whose
    pyproject.toml is the one list."""
    doc = yaml.safe_load((REPOSITORY / "environment.yml").read_text())
    (pip_entries,) = [d["pip"] for d in doc["dependencies"] if isinstance(d, dict)]
    targets = [entry.split()[-1].strip("\"'") for entry in pip_entries]
    assert targets and all(t == "." or t.startswith(".[") for t in targets), pip_entries
