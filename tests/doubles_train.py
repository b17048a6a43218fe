"""The launcher with the suite's test doubles registered (tests/doubles.py)."""
from absl import app
import tfm_ext.run.launcher
import doubles  # pylint: disable=unused-import
app.run(tfm_ext.run.launcher.main)
