"""Everything a run keeps in its `model_dir`, through `tf.io.gfile`.

`usable` checks a model_dir can be written before anything is; `files`
writes whole records and reads them fresh (an object store has no append
and no atomic rename); `claim` is the one mechanism of a record one
process owns (the trainer `lease`, the evaluators' `eval_claims`);
`checkpoint_state`, `checkpointing` and `retention` the checkpoints and
what a save may delete; `best_checkpoints` the best checkpoints and their
exporter; `eval_ledger` what the evaluators evaluated; `params_file` the
operative config's `params.yaml`; `run_summary` the run's record;
`log_files` its log; `export` and `tfm_serving` the SavedModel export.
"""
