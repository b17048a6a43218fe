"""A model_dir is checked before anything is written to it.

The faults a launched run meets through this check (a full or read-only
disk, a bucket that does not answer) are in tests/base/test_failures.py
and tests/e2e/test_gcs.py.
"""

import pytest

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import usable


@pytest.mark.parametrize("name", ["job[1]", "job*", "job?"])
def test_model_dir_with_glob_characters_is_refused(tmp_path, name):
  with pytest.raises(UsageError, match="glob"):
    usable.check_usable(str(tmp_path / name))


def test_model_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
  a_file = tmp_path / "f"
  a_file.write_text("x")
  with pytest.raises(UsageError, match="is a file, not a directory"):
    usable.check_usable(str(a_file))
  with pytest.raises(UsageError, match="its parent .* is a file"):
    usable.check_usable(str(a_file / "run"))


def test_model_dir_on_a_file_system_tensorflow_cannot_reach_is_refused():
  with pytest.raises(UsageError, match="nofs://bucket/run.* cannot be used"):
    usable.check_usable("nofs://bucket/run", store_timeout=30)
