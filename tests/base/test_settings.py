"""The timings from the environment: typed, parsed once, never at import."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from tfm_ext.base import settings
from tfm_ext.base.errors import UsageError


def test_each_variable_sets_its_field_and_unset_ones_keep_their_defaults():
  environ = {name: str(10 + i) for i, (name, _) in
             enumerate(settings.VARIABLES.values())}
  parsed = settings.from_environment(environ)
  for i, field in enumerate(settings.VARIABLES):
    assert getattr(parsed, field) == 10 + i, field
  assert settings.from_environment({}) == settings.Settings()
  # TF's GCS client may read an object stale this long; a read waits it out.
  assert parsed.stale_read_seconds == parsed.gcs_stat_cache_seconds + 1


@pytest.mark.parametrize("name, value, accepted", [
    ("TFM_EXT_LEASE_STALE_SECONDS", "0", "more than 0"),
    ("TFM_EXT_CLAIM_RENEW_SECONDS", "nan", "more than 0"),
    ("TFM_EXT_EVALUATOR_STALE_SECONDS", "1e999", "more than 0"),
    ("GCS_STAT_CACHE_MAX_AGE", "-1", "0 or more"),
    ("TFM_EXT_LOOP_PROGRESS_SECONDS", "soon", "0 or more")])
def test_a_value_it_cannot_take_is_refused_naming_variable_value_and_range(
    name, value, accepted):
  with pytest.raises(UsageError) as e:
    settings.from_environment({name: value})
  assert str(e.value) == (
      f"{name}={value!r} (in the environment): give a number of seconds, "
      f"{accepted}, or unset it for its default.")


def test_importing_every_module_that_uses_them_reads_no_environment():
  code = ("import tfm_ext.model_dir.lease, tfm_ext.model_dir.eval_claims, "
          "tfm_ext.model_dir.files, tfm_ext.base.console, "
          "tfm_ext.run.continuous_eval\n"
          "from tfm_ext.base import settings\n"
          "print(settings._current)")
  run = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True,
      timeout=300, cwd=REPO,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO,
           "TFM_EXT_LEASE_STALE_SECONDS": "never"})
  assert run.returncode == 0, run.stderr
  assert run.stdout.strip() == "None", run.stdout
