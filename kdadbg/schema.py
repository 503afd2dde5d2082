"""Schema numbers of the ``--json`` documents: what the writers put in ``"schema"`` and what ``--help``
quotes (no torch here, so the command line can read them without importing it)."""

RUN_JSON = 2    # kdadbg run --json: kdadbg.run.RunResult.as_json (README, "kdadbg run")
DIFF_JSON = 2   # kdadbg diff --json: kdadbg.compare.result.DiffResult.as_json (README, "kdadbg diff")
