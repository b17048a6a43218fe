"""The doubles launcher on two logical CPU devices (two replicas)."""
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
import tfm_ext.run.launcher
import doubles  # pylint: disable=unused-import
app.run(tfm_ext.run.launcher.main)
