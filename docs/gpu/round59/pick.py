"""From probe_wu.py's log (``pick.py LOG [CASE]``): the knob sets whose every case (or case CASE alone) gave o
and ht within 5e-2 of FWD_FUSE_WU=0's (training and inference forward) and no bad U row, printed as bench.py
--ab flags with FWD_FUSE_WU=1 (one per line)."""
import re
import sys

ok, seen = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+(\S+)\s+(.*)", line)
    if not m or m.group(1).startswith(("probe", "out")):
        continue
    case, sets, rest = m.groups()
    if len(sys.argv) > 2 and case != sys.argv[2]:
        continue
    errs = [float(x) for x in re.findall(r"(?:o|ht) ([0-9.e+-]+|nan)", rest) if x != "nan"] if "FAILED" not in rest else []
    good = len(errs) == 4 and max(errs) < 5e-2 and "no bad U row" in rest and "nan" not in rest
    seen[sets] = seen.get(sets, 0) + 1
    ok[sets] = ok.get(sets, True) and good
for sets, good in ok.items():
    if good and seen[sets] >= (1 if len(sys.argv) > 2 else 2):
        extra = "" if sets == "default" else "," + ",".join(f"KDADBG_{kv}" for kv in sets.split(","))
        print(f"KDADBG_FWD_FUSE_WU=1{extra}")
