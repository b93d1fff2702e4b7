"""git_sha names the code that ran: HEAD when clean; with edits, a digest that changes with them and that a
commit holding those edits reproduces."""

import hashlib
import shutil
import subprocess

import pytest

from sdbench.measure import environment

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root,
                          capture_output=True, check=True)
    return done.stdout.decode().strip()


def test_git_sha_digests_the_edits_a_commit_can_reproduce(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "kernel.cu").write_text("int a = 1;\n")
    _git(tmp_path, "add", "kernel.cu")
    _git(tmp_path, "commit", "-q", "-m", "base")
    base = _git(tmp_path, "rev-parse", "HEAD")
    assert environment._git_sha(tmp_path) == base
    (tmp_path / "notes.txt").write_text("untracked files are not the code")
    assert environment._git_sha(tmp_path) == base

    (tmp_path / "kernel.cu").write_text("int a = 2;\n")
    edited = environment._git_sha(tmp_path)
    sha, digest = edited.split("-dirty+")
    assert sha == base and len(digest) == environment.DIFF_DIGEST_CHARS
    (tmp_path / "kernel.cu").write_text("int a = 3;\n")
    assert environment._git_sha(tmp_path) != edited  # other edits on the same commit: another digest

    (tmp_path / "kernel.cu").write_text("int a = 2;\n")  # the first edits again, then committed
    assert environment._git_sha(tmp_path) == edited
    _git(tmp_path, "commit", "-q", "-am", "edit")
    commit = _git(tmp_path, "rev-parse", "HEAD")
    diff = subprocess.run(["git", "diff", "--full-index", "--binary", base, commit], cwd=tmp_path,
                          capture_output=True, check=True).stdout
    assert hashlib.sha256(diff).hexdigest()[:environment.DIFF_DIGEST_CHARS] == digest


def test_git_sha_outside_a_checkout_is_none(tmp_path):
    assert environment._git_sha(tmp_path) is None


def test_every_column_is_collected_and_the_gpu_ones_are_null_on_the_cpu():
    collected = environment.collect("cpu")
    assert set(collected) == set(environment.ENV_COLUMNS)
    assert {name: collected[name] for name in ("gpu_name", "gpu_uuid", "gpu_sms")} == dict.fromkeys(
        ("gpu_name", "gpu_uuid", "gpu_sms"))
    assert collected["torch_version"]
