"""The operative config: built, written, read back and checked.

`params` builds it from TFM's experiment, YAML files, `--params_override`
and gin; `added_fields` are the fields tfm_ext adds to TFM's configs;
`checks` refuses what cannot run (one table of rules, `checks.RULES`, and
the checks that need the strategy or the files), naming the field, the
value and what is accepted, before anything is written; `config_drift`
refuses a resume whose config changed. The files it is written to are
`tfm_ext.model_dir.params_file`'s.
"""
