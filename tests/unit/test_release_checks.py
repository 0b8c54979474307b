"""Release checks that need no container: a dirty tree is refused."""

from __future__ import annotations

import subprocess

import pytest

from pipeline import release
from pipeline.release import DirtyTreeError


@pytest.fixture
def repo(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    return tmp_path


def test_a_clean_tree_passes(repo):
    release.check_tree(allow_dirty=False, root=repo)


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_a_dirty_tree_is_refused_unless_allowed(repo, change):
    if change == "modified":
        (repo / "a.txt").write_text("b\n")
    else:
        (repo / "new.txt").write_text("n\n")
    with pytest.raises(DirtyTreeError) as err:
        release.check_tree(allow_dirty=False, root=repo)
    assert "uncommitted change" in str(err.value) and "--allow-dirty" in str(err.value)
    assert ("a.txt" if change == "modified" else "new.txt") in str(err.value)
    release.check_tree(allow_dirty=True, root=repo)
