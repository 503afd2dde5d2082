"""Schema numbers of the ``--json`` documents: what the writers put in ``"schema"`` and what ``--help``
quotes (no torch here, so the command line can read them without importing it)."""

RUN_JSON = 3    # kdadbg run --json: kdadbg.run.RunResult.as_json (README, "kdadbg run"); 3: verdict partial/
                # not_compared, pass null + reason, compared.not_compared, nulls, scale and abs_floor
DIFF_JSON = 3   # kdadbg diff --json: kdadbg.compare.result.DiffResult.as_json (README, "kdadbg diff"); 3:
                # NOT_COMPARED cells, verdict not_compared, compared.not_compared, min_tolerance counts, scales
