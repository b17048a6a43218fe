"""Everything a run keeps in its `model_dir`, through `tf.io.gfile`.

`usable` checks a model_dir can be written before anything is; `_files`
writes whole records and reads them fresh (an object store has no append
and no atomic rename); `claim` is the one mechanism of a record one
process owns (the trainer `lease`, the evaluators' `eval_claims`);
`checkpoint_state`, `checkpointing` and `retention` the checkpoints and
what a save may delete; `_best_checkpoint_files` the best checkpoints;
`run_summary` the run's record; `export` the SavedModel export.
"""
