"""The ground floor: what every other package uses, importing none of them.

`errors` (how a run ends: `UsageError`, `RunFailed`, `Preempted`,
`Stopped` and the exit codes, each defined once); `failures` (the run's
phases and the classification its one error boundary makes); `startup`
(the quiet, signal-safe start a launcher or a fork's script begins with);
`settings` (the timings from the environment, parsed once); `devices`,
`registry` (the base of every registry), `values` (type checks where
`true` is no number), `logs` (the numbers of Orbit's logs) and `console`
(the progress lines).

The packages above it, each importing only those below: `model_dir` (every
record a run keeps), `training` (the trainer and its input), `config` (the
operative config and its checks), `actions` (what runs around each loop
and evaluation), then `run` (from the command line to an exit code).
`tests/base/test_floors.py` checks that no import runs up the house and
that no two modules import each other.
"""
