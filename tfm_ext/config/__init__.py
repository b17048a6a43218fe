"""The operative config: built, written, read back and checked.

`params` builds it from TFM's experiment, YAML files, `--params_override`
and gin; `params_file` writes and reads `params.yaml`; `config_checks`,
`preflight`, `input_files` and `model_dir_check` refuse what cannot run,
naming the field, the value and what is accepted, before anything is
written; `config_drift` refuses a resume whose config changed.
"""
