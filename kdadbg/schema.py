"""Schema numbers of the ``--json`` documents: what the writers put in ``"schema"`` and what ``--help``
quotes (no torch here, so the command line can read them without importing it)."""

INSPECT_JSON = 3   # kdadbg inspect --json: kdadbg.dump.describe_dump (README, "kdadbg inspect"); 2: nonfinite
                  # (per tensor holding NaN/Inf: counts, first index and where), such a dump "valid"; 3: kind
                  # ("dump" or "taps file"), taps_file (a taps file described, roles output/gradient/tap/index)
TAPS_JSON = 2      # kdadbg taps --json: the summary of kdadbg.export.export_taps (README, "kdadbg taps"); 2:
                   # decay_note (our kernels' outputs NaN/Inf past a 16-row block's exp limit: where), or null
RUN_JSON = 7    # kdadbg run --json: kdadbg.run.RunResult.as_json (README, "kdadbg run"); 3: verdict partial/
                # not_compared, pass null + reason, compared.not_compared, nulls, scale and abs_floor; 4: a
                # tensor's carried_in_from_dg (dA_log/ddt_bias whose own sum is right: not a failure); 5: a
                # tensor's precision_floor (the noise floor's ratio where it was over tolerance: UNREP within 10x),
                # coherent (dA_log/ddt_bias whose dg error sums coherently: not carried in); 6:
                # nonfinite_inputs.left_out (what NaN/Inf inputs can reach, left out: kdadbg.reach); 7: a tensor's
                # sum_not_checkable (dA_log/ddt_bias over tolerance, dg returned in 16 bits: {carried, own, reach})
DIFF_JSON = 12  # kdadbg diff --json: kdadbg.compare.result.DiffResult.as_json (README, "kdadbg diff"); 3:
                # NOT_COMPARED cells, verdict not_compared, compared.not_compared, min_tolerance counts, scales;
                # 4: tensors (each output and gradient judged as run judges it; the verdict fails with them),
                # origin.label and origin.floor (the window rerun against its noise floor); 5: origin and
                # amplification follow the first BUG where there is one (origin.of names the cell), tensors
                # filled for diff A B; 6: origin_first_divergence (a DRIFT first divergence's own rerun),
                # outputs_not_compared, carried_in_from_dg {"ratio", "own"} or null in tensors (as run's)
                # and in a cell carried in (was a bool there, the ratio here); 7: precision_floor in tensors,
                # taps_not_provided (taps named with --taps not provided: verdict partial), origin.carried_by;
                # 8: a tensor's lead (a failing tensor's first cell over its tolerance, else null),
                # nonfinite_inputs.left_out; 9: the exp(-gc) taps (ki, dqd, dkd) judged at each cell's own
                # scale: scales.<n>.per_cell, abs_floor null there and given per cell (cells[].abs_floor);
                # 10: amplification[].labels (each chunk's label: an UNREP one is no ratio to read); 11: the
                # exp(-gc) taps judged weighted by exp(gc) (scales.<n>.weighted_by, cells[].weighted_by;
                # ratio and max_abs of the weighted values, kernel and reference the tap's own); diff A B
                # with A not the float64 reference: files.computed_at, files.tol_sum, tensors[].tol_sum and
                # a DRIFT cell's reason (within the sum of both files' tolerances); repeat.output, .chunk, .head, .token,
                # .elements, .taps_compared (where no tap differs, the first output element that does); origin.first_in_window
                # the rerun's first BUG cell with a chunk (was its first divergence, DRIFT or a per-head sum too);
                # 12: a dA_log/ddt_bias cell's sum_not_checkable ({carried, own, reach}: dg returned in 16 bits)
