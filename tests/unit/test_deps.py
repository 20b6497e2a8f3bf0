"""runtime.host.deps: which file lists a project's dependencies, and where they go (no pip here)."""

import pytest

from runtime.host.deps import DependencyError, digest, install, requirements
from tests.integration.dev_server import REPO


def test_requirements_txt_first_then_pyproject_dependencies(tmp_path):
    assert requirements(tmp_path) == ([], None)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "w"\ndependencies = ["six>=1", " idna "]\n')
    assert requirements(tmp_path) == (["six>=1", "idna"], tmp_path / "pyproject.toml")
    (tmp_path / "requirements.txt").write_text("# pinned\nsix==1.17.0  # the one\n\nidna\n")
    assert requirements(tmp_path) == (["six==1.17.0", "idna"], tmp_path / "requirements.txt")


def test_pip_options_and_bad_pyproject_are_refused_naming_the_file(tmp_path):
    (tmp_path / "requirements.txt").write_text("--index-url http://evil/\nsix\n")
    with pytest.raises(DependencyError, match="'--index-url http://evil/': only requirement lines"):
        requirements(tmp_path)
    (tmp_path / "requirements.txt").unlink()
    (tmp_path / "pyproject.toml").write_text("[project]\ndependencies = 'six'\n")
    with pytest.raises(DependencyError, match="project.dependencies must be a list of strings"):
        requirements(tmp_path)


def test_the_runtimes_own_pyproject_is_not_a_projects():
    assert requirements(REPO) == ([], None)  # make dev serves from the checkout: no torch install


def test_the_folder_is_per_list_and_nothing_is_installed_without_one(tmp_path):
    assert digest(["six", "idna"]) == digest(["idna", "six"]) != digest(["six"])
    assert install(tmp_path, tmp_path / ".edge") is None and not (tmp_path / ".edge").exists()
    (tmp_path / "requirements.txt").write_text("six\n")
    done = tmp_path / ".edge" / "python" / digest(["six"])
    done.mkdir(parents=True)
    (done / ".complete").write_text("six\n")
    assert install(tmp_path, tmp_path / ".edge", log=None) == done  # installed once: pip not run again
