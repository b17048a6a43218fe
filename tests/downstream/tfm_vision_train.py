"""A downstream fork of TFM's vision trainer onto tfm_ext: four lines."""
from absl import app
import tfm_ext.run.launcher
import official.vision.registry_imports  # pylint: disable=unused-import
app.run(tfm_ext.run.launcher.main)
