"""Makes docs/diff_plot_example.png: ``kdadbg diff --plot`` on a 200-chunk dump with one planted bug.

The dump is ``kdadbg gen --preset basic --B 1 --T 3200 --H 1 --K 16 --V 16``; the test-only fault
hook (``tests/kernel_faults.py``) passes ``dS`` on transposed at chunk 120, so the figure shows the
first divergence there and the wrong gradient it feeds into chunk 119's backward taps. Run from the
repository root (about 40 s on the CPU under the Triton interpreter): ``python docs/diff_plot_example.py``.
"""

import os
import pathlib
import sys
import tempfile

from kdadbg.diff import diff_paths, write_plot
from kdadbg.gen import generate

OUT = pathlib.Path(__file__).resolve().parent / "diff_plot_example.png"
sys.path.insert(0, str(OUT.parents[1] / "tests"))
from kernel_faults import plant  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    generate("wide.safetensors", "basic", B=1, T=3200, H=1, K=16, V=16)
    with plant("dS_untransposed", 120):
        res = diff_paths(["wide.safetensors"], device="cpu")
    print(res.first_divergence["tap"], res.first_divergence["chunk"], write_plot(res, OUT))
