#!/usr/bin/env bash
# The whole GPU check in one call on the device machine (torch, triton, pytest preinstalled, no
# network): the GPU-facing tests on CUDA, `kdadbg run` end to end, the reference timing, and the
# benchmark against fla (whose first call autotunes for minutes per new shape) and, with FLASHKDA_BUILD,
# FlashKDA. Logs land in $OUT (default .out/); bench writes $OUT/benchmarks.json (docs/benchmarks.json's
# form). Each part fits one 10-minute device call: run `tests run` in one call and `bench` in another.
#   bash benchmarks/gpu_check.sh [tests|run|profile|bench|diag|stages|all]...   (default: all; run in this order)
# "all" is tests, run and bench. diag: benchmarks/realistic_diag.py on the model-size realistic cases. stages: stage_bench.py once per line of $VARIANTS (a file; each line
# "default" or comma-separated KDADBG_*=value overrides, then after a space stage_bench options, e.g.
# "--H 32 --varlen"); profile: kernel_profile.py at H16/H32 T16384 and on the varlen batch, or at the
# option sets of PROFILE_SHAPES, separated by ';' (e.g. "--H 32 --settings pregated,softplus,lower_bound":
# the in-kernel gate's cost kernel by kernel). BENCH_ARGS passes options to bench.py (--ab, --commit).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
what=${*:-all}

# kdadbg importable without pip: the repo root, plus kernels/ under its import name. KERNELS_DIR
# (a copy of kernels/ from another commit, carried in an ignored folder) times that copy instead: A/B
# runs of stages/profile/bench in one call.
KERNELS_DIR=$(cd "${KERNELS_DIR:-$PWD/kernels}" && pwd) || exit 2
mkdir -p /tmp/kdadbg_path && ln -sfn "$KERNELS_DIR" /tmp/kdadbg_path/kdadbg_kernels
echo "gpu_check.sh: kernels from $KERNELS_DIR" >&2
export PYTHONPATH="$PWD:/tmp/kdadbg_path:${PYTHONPATH:-}"
if [ -d .peer ] && ls .peer/fla_core-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target "$PWD/.peer/site" .peer/fla_core-*.whl \
        && export PYTHONPATH="$PWD/.peer/site:$PYTHONPATH"
else
    # a call without .peer in carry loses its fla timing: say it before anything runs
    echo "gpu_check.sh: WARNING: no .peer/fla_core-*.whl here, so fla is not importable and will not be timed" \
         "(copy shared/peer/ to .peer/ and name .peer in the device tool's carry)" >&2
fi
export FLA_FLASH_KDA=0 PYTHONUNBUFFERED=1
status=0
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
    > "$OUT/env.txt" 2>&1

has() { [[ " $what " == *" all "* || " $what " == *" $1 "* ]]; }
# FLASHKDA_BUILD=fork|upstream: build FlashKDA from .peer in the background (about 100 s, on the CPUs)
# while the parts before bench run; bench then times it
if [ -n "${FLASHKDA_BUILD:-}" ] && has bench; then
    bash benchmarks/build_flashkda.sh "$FLASHKDA_BUILD" .peer > "$OUT/flashkda_build.log" 2>&1 &
    fk_pid=$!
fi
named() { [[ " $what " == *" $1 "* ]]; }   # parts that "all" leaves out

if has tests; then
    # the tests that touch the GPU (the rest run in CI on a CPU). With pytest-xdist (the GPU machine has it)
    # in TESTS_WORKERS processes at once: compilation is CPU-bound, the GPU's memory is shared. A cap keeps
    # the call inside its limit. TESTS_SELECT (pytest arguments) narrows it, e.g. "tests/test_kernels_fwd.py -k taps"
    # (the default in single quotes: inside ${VAR:-...} the inner quotes of -k "not oracle" were removed,
    # and pytest then looked for a file named oracle and ran nothing)
    sel=${TESTS_SELECT:-}
    [ -n "$sel" ] || sel='tests/test_kernels_gpu.py tests/test_kernels.py tests/test_kernels_fwd.py
        tests/test_kernels_bwd.py tests/test_diff.py tests/test_reference.py -k "not oracle"'
    sel=$(echo $sel)   # one line
    par=()
    # the default: one worker per 24 GiB of GPU memory, 1 to 6 (the model-size tests' reference takes up to
    # 20 GiB; 8 workers on an 80 GB H100 left 16 tests refusing to start for want of memory, round 45 call 3)
    gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
    workers=$(( ${gib:-24576} / 24576 )); [ "$workers" -ge 1 ] || workers=1; [ "$workers" -le 6 ] || workers=6
    if python3 -c "import xdist" 2>/dev/null; then par=(-n "${TESTS_WORKERS:-$workers}"); fi
    echo "gpu_check.sh: pytest ${par[*]} $sel" > "$OUT/gpu_tests.log"
    # shellcheck disable=SC2086
    eval timeout "${TESTS_TIMEOUT_S:-480}" python3 -m pytest -v -p no:cacheprovider --durations=25 -rfE \
        "${par[@]}" $sel >> "$OUT/gpu_tests.log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || status=1
    # pytest exit 5 is "no tests collected": a selection that ran nothing is a failure, said as one
    [ "$rc" -ne 5 ] || echo "gpu_check.sh: the selection collected no tests: $sel" >> "$OUT/gpu_tests.log"
    echo "gpu_check.sh: pytest exit $rc" >> "$OUT/gpu_tests.log"
    tail -40 "$OUT/gpu_tests.log"
fi
if has run; then
    d=$(mktemp -d)
    {
        python3 -m kdadbg gen "$d/big.safetensors" --preset basic --B 1 --T 16384 --H 16 --K 128 --V 128
        for i in 1 2; do   # the first call includes compilation; the second is the steady state
            t0=$(date +%s.%N)
            python3 -m kdadbg run "$d/big.safetensors" --device cuda --json "$OUT/run$i.json" --force
            rc=$?
            echo "kdadbg run: call $i, exit $rc, wall $(python3 -c "import time; print(round(time.time() - $t0, 2))") s"
        done
        python3 benchmarks/reference_cpu.py --T 16384 --H 16 --device cuda
    } 2>&1 | tee "$OUT/gpu_run.log" | tail -40
fi
if named profile; then
    IFS=';' read -ra shapes <<< "${PROFILE_SHAPES:---H 16;--H 32;--H 32 --varlen}"
    for shape in "${shapes[@]}"; do
        tag=$(echo "$shape" | tr -cd 'A-Za-z0-9_')
        # the whole log first: `tee | head` cut it at head's 14 lines (tee died of the closed pipe)
        python3 benchmarks/kernel_profile.py $shape --json "$OUT/profile_$tag.json" > "$OUT/profile_$tag.log" 2>&1
        grep -v -e Warning -e _warn_once "$OUT/profile_$tag.log" | head -14
        # several settings or variants: their closing comparison tables too
        sed -n '/kernel time per call (ms) by setting/,$p' "$OUT/profile_$tag.log" | grep -v -e Warning -e _warn_once
    done
fi
if has bench; then
    if [ -n "${FLASHKDA_BUILD:-}" ]; then
        wait "$fk_pid"
        line=$(tail -1 "$OUT/flashkda_build.log")
        case "$line" in
            "export PYTHONPATH="*) eval "$line" ;;
            *) echo "gpu_check.sh: the FlashKDA build failed ($OUT/flashkda_build.log): timing without it" >&2 ;;
        esac
    fi
    # fla's autotune results from earlier calls (docs/gpu/*/call*/autotune.tgz: Triton's
    # <hash>/<kernel>.autotune.json, the same Triton and fla) spare its first call minutes per shape; the
    # results after this run are saved as $OUT/autotune.tgz for the next. A TRITON_CACHE_DIR already set
    # is used as it is.
    if [ -z "${TRITON_CACHE_DIR:-}" ]; then
        export TRITON_CACHE_DIR=/tmp/kdadbg_triton_cache
        mkdir -p "$TRITON_CACHE_DIR"
        for f in docs/gpu/*/call*/autotune.tgz; do [ -f "$f" ] && tar xzf "$f" -C "$TRITON_CACHE_DIR"; done
    fi
    export TRITON_CACHE_AUTOTUNING=1
    python3 benchmarks/bench.py --json "$OUT/benchmarks.json" --budget-s "${BENCH_BUDGET_S:-420}" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench.log" | grep -v -e Warning -e _warn_once | tail -60
    (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar czf "$OUT/autotune.tgz" -T -)
fi
if named diag; then
    # benchmarks/realistic_diag.py on every REAL_GPU case in both modes: counts, failing cells, floors
    runs=$(python3 -c "import sys; sys.path.insert(0, 'tests'); from test_kernels_gpu import REAL_GPU
print(' '.join(f'{n}:{p}' for n in REAL_GPU for p in ('fp32', 'bf16')))")
    python3 benchmarks/realistic_diag.py --device cuda --out "$OUT/diag.json" $runs > "$OUT/diag.log" 2>&1 \
        || status=1
    grep '"case"' "$OUT/diag.log"
fi
if named stages; then
    if [ -z "${VARIANTS:-}" ] || [ ! -f "$VARIANTS" ]; then
        echo "gpu_check.sh: stages: set VARIANTS to a file of variants (found '${VARIANTS:-}')" >&2
        exit 2
    fi
    while IFS= read -r line; do
        [ -z "$line" ] && continue
        v=${line%% *}; opts=""; [ "$v" != "$line" ] && opts=${line#* }
        env_args=(); [ "$v" != default ] && IFS=, read -ra env_args <<< "$v"
        env "${env_args[@]}" python3 benchmarks/stage_bench.py $opts --tag "$line" --json-lines "$OUT/stages.jsonl" 2>&1 \
            | tail -2 | tee -a "$OUT/stages.log"
    done < "$VARIANTS"
fi
exit $status
