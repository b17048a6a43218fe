"""Running a job: from the command line to an exit code.

`launcher` (the `tfm-ext-train` command; `cli` and `python -m tfm_ext` call
it) parses the flags and builds the operative config (`tfm_ext.config`);
`driver` owns running it: `prepare` checks it all before anything is
written, `run` runs the plan as a job (log file, signals, recovery, the
trainer lease, exit codes); `assembly` builds every part before Orbit's
controller runs; `modes` is the table of modes (`continuous_eval` is the
evaluator beside a trainer); `experiment` is TFM's `run_experiment`.
`preemption` and `waits` handle signals; `strategies` the distribution
strategy. The error boundary, start-up and devices are on the ground
floor (`tfm_ext.base`).
"""
