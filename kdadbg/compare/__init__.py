"""One comparison path for whole tensors, per-chunk output rows and taps: the metric
(:mod:`.metrics`), the quantities and their dataflow order (:mod:`.quantities`), cells and labels
(:mod:`.cells`) and the result of a diff (:mod:`.result`)."""

from .cells import Cells, compare_cells, judge, output_rows, unrepresentable
from .metrics import (ABS_PASS, Compare, cell_metrics, compare, nan_positions_agree, nonfinite_inputs, nonfinite_note,
                      passes)
from .quantities import ORDER, QUANTITIES, ROW_NAMES, TAP_ORDER, ChunkInfo, dataflow_key, valid_mask
from .result import DiffResult

__all__ = ["ABS_PASS", "Cells", "ChunkInfo", "Compare", "DiffResult", "ORDER", "QUANTITIES", "ROW_NAMES",
           "TAP_ORDER", "cell_metrics", "compare", "nan_positions_agree", "nonfinite_inputs", "nonfinite_note", "compare_cells", "dataflow_key", "judge", "output_rows",
           "passes", "unrepresentable", "valid_mask"]
