"""The model registry: a model is a builder `fn(model_config) -> tf_keras.Model`.

Tasks look their model up by the `name` field of their model config, so one
task can train any registered model:

    @tfm_ext.register_model("my_convnet")
    def build(config):
      return tf_keras.Sequential([...])
"""

from tfm_ext.base import registry

MODELS = registry.Registry("model")


def register_model(name: str):
  """Decorator: registers a model builder function as `name`."""
  register = MODELS.register(name)

  def decorator(builder):
    if not callable(builder):
      raise registry.RegistryError(
          f"register_model({name!r}) needs a callable builder, got "
          f"{builder!r}.")
    return register(builder)

  return decorator


def build_model(name: str, config):
  """Builds the model registered as `name` from its config."""
  return MODELS.get(name)(config)
