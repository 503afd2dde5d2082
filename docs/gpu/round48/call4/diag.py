"""Round 48 call 4: why the dA_log split of tests/test_diff.py's 5 %-off head 1 is not marked on CUDA (call 3)."""
import sys
sys.path.insert(0, "tests")
import torch
from test_diff import _Bf16Dg
from kdadbg.cases import get_case, make_inputs
from kdadbg.compare import carried as cr
from kdadbg.diff import diff_dump

seen = {}
orig = cr.unchecked_in
def spy(cells, carried):
    for n, s in carried.items():
        seen[n] = {k: (None if v is None else v.detach().cpu().tolist()) for k, v in s._asdict().items()
                   if k not in ("exact",)}
        seen[n]["label"] = cells[n].label.cpu().tolist()
        seen[n]["ratio"] = cells[n].ratio.cpu().tolist()
    return orig(cells, carried)
import kdadbg.diff as kd
kd.unchecked_in = spy
inputs, cfg = make_inputs(get_case("kimi"), seed=0)
for f in (1.0, 1.05):
    res = diff_dump(inputs, cfg, _Bf16Dg(0.0, f), device="cuda", window=0)
    print("factor", f, "passed", res.passed, "first_bug", res.first_bug and res.first_bug["tap"])
    for n, d in seen.items():
        print(" ", n, d)
    print("  notes:", [x[:160] for x in res.notes if "dA_log" in x])
