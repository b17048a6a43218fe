"""What trains: the trainer, its registries and its input.

`custom_trainer.CustomTrainer` (documented hooks over TFM's
`base_trainer.Trainer`), the registries of trainers and models
(`trainers`, `models`, on `tfm_ext.base.registry.Registry`), the host
input pipeline whose iterator is checkpointed (`inputs`), the records of
the files a config names (`input_files`), optimizers, determinism,
evaluation batch counts, the loop's summaries, and TFM's ranking recipe
(`ranking`).
"""
