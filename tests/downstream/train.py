"""A downstream fork of the launcher: three lines."""
from absl import app
import tfm_ext.launcher
import downstream_registry  # pylint: disable=unused-import
app.run(tfm_ext.launcher.main)
