"""`python -m tfm_ext`: the launcher, as `tfm-ext-train` runs it."""

from tfm_ext.run import cli

cli.main()
