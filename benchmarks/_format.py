"""How `RESULTS.md` names the variants and writes rates, times and sizes."""

VARIANT_NAMES = {
    "ours": "ours (`launchers/train.py`)",
    "stock_tfm": ("stock TFM (`train_lib.run_experiment`, "
                  "`base_trainer.Trainer`)"),
    "handwritten": "hand-written `tf.function` loop",
    "keras_fit": "Keras `Model.fit`",
    "keras_fit_tensorboard": ("Keras `Model.fit` with its `TensorBoard` "
                              "callback (the same summaries as ours)"),
    "ours_steps_per_loop_200": "ours, `steps_per_loop=200`",
    "ours_xla": "ours, `runtime.xla_on_cpu=true`",
    "ours_one_replica_mirror": ("ours, `runtime.mirror_one_device=true` "
                                "(TFM's one-replica `MirroredStrategy`)"),
    "ours_no_strategy": ("ours, `runtime.mirror_one_device=false` (no "
                         "strategy for `mirrored` on one CPU)"),
    "ours_private_pool": ("ours, a private input pool of half the cores "
                          "(`runtime.dataset_num_private_threads`)"),
    "ours_bfloat16": "ours, `runtime.mixed_precision_dtype=bfloat16`",
}


def variant(name: str) -> str:
  """A training-loop variant as the tables name it."""
  return VARIANT_NAMES.get(name, name)


def rate(per_second: float) -> str:
  """Examples or images a second: whole above 100, else one decimal."""
  return f"{per_second:.0f}" if per_second >= 100 else f"{per_second:.1f}"


def ratio(value: float) -> str:
  """A ratio: three decimals, whole from 100 up."""
  return f"{value:.3f}" if value < 100 else f"{value:.0f}"


def ms(seconds: float) -> str:
  """Milliseconds, with two decimals below one."""
  if seconds < 1e-3:
    return f"{seconds * 1e3:.2f} ms"
  return f"{seconds * 1e3:.1f} ms"


def mib(size: float) -> str:
  """Bytes as MiB."""
  return f"{size / 2**20:.2f} MiB"
