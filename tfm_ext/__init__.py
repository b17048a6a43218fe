"""tfm_ext: pluggable trainers for TensorFlow Model Garden.

    import tfm_ext

    @tfm_ext.register_trainer("mine")
    class MyTrainer(tfm_ext.CustomTrainer):
      def train_loop_end(self):
        logs = super().train_loop_end()
        ...
        return logs

    @tfm_ext.register_model("my_convnet")
    def build(model_config):
      return tf_keras.Sequential([...])

    @tfm_ext.register_action("notify", phase="eval")
    def notify(context: tfm_ext.ActionContext):
      return lambda output: ...  # After every evaluation of every run.

Select the trainer with `--trainer=mine`, `--params_override=trainer.name=mine`
or the gin binding `tfm_ext.trainer.name = 'mine'`. Experiments and tasks stay
in TFM's `exp_factory` and `task_factory`. The driver is `tfm_ext.launcher`
(it defines absl flags, so it is not imported here).
"""

from tfm_ext.actions import ActionContext
from tfm_ext.actions import register_action
from tfm_ext.custom_trainer import CustomTrainer
from tfm_ext.errors import UsageError
from tfm_ext.experiment import run_experiment
from tfm_ext.models import build_model
from tfm_ext.models import MODELS
from tfm_ext.models import register_model
from tfm_ext.registry import Registry
from tfm_ext.registry import RegistryError
from tfm_ext.trainers import get_trainer
from tfm_ext.trainers import register_trainer
from tfm_ext.trainers import TrainerConfig
from tfm_ext.trainers import TRAINERS

__version__ = "0.1.0"
