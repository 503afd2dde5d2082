#!/usr/bin/env bash
# Build FlashKDA on the GPU machine (no network): benchmarks/build_flashkda.sh upstream|fork [PEER_DIR]
#
# PEER_DIR (default .peer, an ignored folder of the checkout) holds flashkda-1ce47ea-src.tar.gz,
# flashkda-fork-bwd-src.tar.gz and nvidia_cutlass-4.2.0.0-py3-none-any.whl (from shared/peer/). The tree
# is unpacked into PEER_DIR/build-WHICH/, CUTLASS headers go to <tree>/cutlass/ (the wheel's
# cutlass_library/source/{include,tools,examples}); the fork gets kdadbg/impls/flashkda_fork_taps.patch
# (keeps its backward workspace and dgc). Prints the PYTHONPATH line for the tree on its last line.
# About 90 s per build on an H200 (16 jobs).
set -euo pipefail
which=${1:?usage: build_flashkda.sh upstream|fork [PEER_DIR]}
peer=$(cd "${2:-.peer}" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
case "$which" in
  upstream) tarball=flashkda-1ce47ea-src.tar.gz; top=flashkda ;;
  fork) tarball=flashkda-fork-bwd-src.tar.gz; top=flashkda-fork ;;
  *) echo "build_flashkda.sh: expected upstream or fork, found $which" >&2; exit 2 ;;
esac
wheel="$peer/nvidia_cutlass-4.2.0.0-py3-none-any.whl"
for f in "$peer/$tarball" "$wheel"; do
  [ -f "$f" ] || { echo "build_flashkda.sh: $f: missing (copy it from shared/peer/)" >&2; exit 2; }
done
dest="$peer/build-$which"
rm -rf "$dest" && mkdir -p "$dest"
tar xzf "$peer/$tarball" -C "$dest"
tree="$dest/$top"
python3 - "$wheel" "$tree/cutlass" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/"
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    for n in names:
        target = out + "/" + n[len(prefix):]
        import os; os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(n) as src, open(target, "wb") as dst:
            dst.write(src.read())
print(f"cutlass: {len(names)} files -> {out}", file=sys.stderr)
PY
if [ "$which" = fork ]; then
  (cd "$tree" && patch -p1 --forward < "$repo/kdadbg/impls/flashkda_fork_taps.patch") >&2
fi
(cd "$tree" && FLASH_KDA_CUDA_ARCHS=90a MAX_JOBS=${MAX_JOBS:-16} NVCC_THREADS=${NVCC_THREADS:-8} \
  python3 setup.py build_ext --inplace > build.log 2>&1) || { tail -40 "$tree/build.log" >&2; exit 1; }
ls "$tree"/flash_kda_C*.so > /dev/null
echo "export PYTHONPATH=$tree:\$PYTHONPATH"
