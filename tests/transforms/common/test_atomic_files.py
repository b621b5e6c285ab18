"""Write-then-rename of published files (transforms.common.atomic_files) on local paths."""

from __future__ import annotations

import pytest

from transforms.common import atomic_files
from transforms.common.atomic_files import TEMPORARY_DIR


def test_a_local_publish_makes_its_directories_and_replaces_an_earlier_attempt(tmp_path):
    root = tmp_path / "out"  # missing: made on the first publish
    path = atomic_files.publish_bytes(str(root), "reports/part-00000", b"first")
    assert path == str(root / "reports" / "part-00000")
    assert (root / "reports" / "part-00000").read_bytes() == b"first"
    again = atomic_files.publish_bytes(str(root), "reports/part-00000", b"second")
    assert again == path and (root / "reports" / "part-00000").read_bytes() == b"second"
    assert not list((root / TEMPORARY_DIR).iterdir())  # every attempt renamed into place


def test_a_failed_local_write_leaves_the_published_file_untouched(tmp_path):
    atomic_files.publish_bytes(str(tmp_path), "part", b"whole")

    def half(sink):
        sink.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_files.publish(str(tmp_path), "part", half)
    assert (tmp_path / "part").read_bytes() == b"whole"  # no reader sees the half
    assert atomic_files.remove_temporary(str(tmp_path))  # the attempt's file, removed after
    assert not (tmp_path / TEMPORARY_DIR).exists()
