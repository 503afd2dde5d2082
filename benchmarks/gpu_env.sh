# Sourced by a device call's command.sh from the repository root (`. benchmarks/gpu_env.sh [fla]`): the
# environment every GPU call needs. kdadbg and its kernels importable without pip (the repo root, and
# kernels/ under its import name through a link); with `fla`, fla-core installed from .peer/ (the device
# tool's carry must name .peer) and Triton's autotune cache unpacked from the committed autotune.tgz
# files, so that fla's first call of a head count skips minutes of autotuning; env.txt in $W (default
# $OUT): the GPU, driver, torch and triton.
export PYTHONUNBUFFERED=1 FLA_FLASH_KDA=0
W=${W:-$OUT}; mkdir -p "$W"
mkdir -p /tmp/kdadbg_path && ln -sfn "$PWD/kernels" /tmp/kdadbg_path/kdadbg_kernels
export PYTHONPATH="$PWD:/tmp/kdadbg_path"
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    > "$W/env.txt" 2>&1
if [ "${1:-}" = fla ]; then
    python3 -m pip install -q --no-index --no-deps --target "$PWD/.peer/site" .peer/fla_core-*.whl \
        || echo "gpu_env.sh: fla-core not installed (is .peer in the carry?)" >&2
    export PYTHONPATH="$PYTHONPATH:$PWD/.peer/site"
    export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache TRITON_CACHE_AUTOTUNING=1
    mkdir -p "$TRITON_CACHE_DIR"
    for f in docs/gpu/*/call*/autotune.tgz; do tar xzf "$f" -C "$TRITON_CACHE_DIR"; done
fi

# Upstream FlashKDA built on the CPUs while the GPU works (benchmarks/build_flashkda.sh, about 90 s):
# `flashkda_start` puts the build in the background (log in $W/flashkda_build.log); `flashkda_ready` waits for it
# and sources the environment line it printed, so that flash_kda imports.
flashkda_start() {
    timeout 200 bash benchmarks/build_flashkda.sh upstream .peer > "$W/flashkda_build.log" 2>&1 &
    FLASHKDA_PID=$!
}
flashkda_ready() {
    wait "$FLASHKDA_PID"; echo "flashkda build exit $? at $SECONDS s"; tail -1 "$W/flashkda_build.log" | cut -c1-200
    tail -1 "$W/flashkda_build.log" > .peer/fk_env.sh
    . .peer/fk_env.sh
}
