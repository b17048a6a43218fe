"""The operative config: built, written, read back and checked.

`params` builds it from TFM's experiment, YAML files, `--params_override`
and gin; `params_file` writes and reads `params.yaml`; `checks` refuses
what cannot run (one table of rules, `checks.RULES`, and the checks that
need the strategy or the files), naming the field, the value and what is
accepted, before anything is written; `input_files` checks the records of
the files the config names; `config_drift` refuses a resume whose config
changed.
"""
