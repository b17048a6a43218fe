"""A downstream fork of the launcher: three lines."""
from absl import app
import tfm_ext.run.launcher
import downstream_registry  # pylint: disable=unused-import
app.run(tfm_ext.run.launcher.main)
