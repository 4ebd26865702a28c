#!/usr/bin/env bash
# What a nightly runs, wherever one runs: `make nightly`, every job of the CI recipes in ci/
# (docs/ci.md) and tools/gpu-run.sh (docs/gpu.md) all run this script. Its parts, in order
# (NIGHTLY_PARTS, default all four; a CI job runs one):
#
#   corpus  kvconform run on KVCONFORM_SCENARIOS (default: scenarios) with every check; engine
#           scenarios run vLLM's real engine where CUDA and a CUDA build of vLLM are, and are
#           skipped with the reason elsewhere
#   fuzz    kvconform fuzz at the nightly budget (FUZZ_EXAMPLES, default 20000), seeded by the date
#   explore kvconform explore for the nightly budget (EXPLORE_BUDGET seconds, default 1800, on
#           EXPLORE_JOBS processes, default 1), seeded by the date
#   mutate  the mutation campaign over vLLM's reservation code
#   cuda    kvconform's own tests that need CUDA (pytest -m cuda)
#
#   tools/nightly.sh [REPORT_DIR]        (default build/nightly)
#
# The vLLM under test: the one PYTHON (default python3) imports -- vLLM's CI image, or a wheel
# installed into it (make install-nightly VLLM_WHEEL=FILE) -- or, with VLLM_SRC, the Python tree
# of a vLLM source checkout (the folder holding vllm/), put ahead of the installed vLLM, whose
# compiled parts stay (--vllm-src). SHARD=I/N runs that share of the corpus, fuzz and mutation,
# and explores with a seed of the shard's own
# (Buildkite's parallel jobs need no SHARD: kvconform reads BUILDKITE_PARALLEL_JOB itself).
# NIGHTLY_GOOD: the vLLM commit of the last green nightly, for the bisect command below.
#
# REPORT_DIR gets report.json, junit.xml, summary.md, report.html (corpus), fuzz/ (reproducers,
# fuzz-summary.json), explore/ (reproducers, explore-summary.json), mutation/, cuda-tests.xml and nightly.txt (tools/nightly_summary.py: the
# vLLM, torch and device, verdict counts, each part's status, wall time, and, when the corpus
# did not conform, the `kvconform bisect` command with the nightly's checks and expectations).
# Exit status: the first non-zero of corpus, fuzz, explore, mutate, cuda, per docs/cli.md (0 conform,
# 1 nonconformance, 2 bad input, 3 vLLM not exercisable).
set -uo pipefail
PY=${PYTHON:-python3}
REPORT_DIR=${1:-build/nightly}
PARTS=${NIGHTLY_PARTS:-corpus fuzz explore mutate cuda}
read -r -a SCENARIOS <<< "${KVCONFORM_SCENARIOS:-scenarios}"
mkdir -p "$REPORT_DIR"
REPORT_DIR=$(cd "$REPORT_DIR" && pwd)
# From the repository root, so that `python -m kvconform` is this checkout's.
cd "$(dirname "$0")/.."
started=$(date +%s)
VLLM=()
if [ -n "${VLLM_SRC:-}" ]; then VLLM=(--vllm-src "$VLLM_SRC"); fi
SHARDING=()
if [ -n "${SHARD:-}" ]; then SHARDING=(--shard "$SHARD"); fi
wants() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for part in $PARTS; do
    case "$part" in corpus|fuzz|explore|mutate|cuda) ;; *) echo "nightly: unknown part $part" >&2; exit 2 ;; esac
done
statuses=()
final=0
record() {  # record NAME STATUS: the first non-zero status is the nightly's
    statuses+=(--part "$1=$2")
    if [ "$final" -eq 0 ] && [ "$2" -ne 0 ]; then final=$2; fi
}

if wants corpus; then
    # Every check, the slot-mapping consequence oracle included (vLLM's compiled Triton kernel on CUDA).
    "$PY" -m kvconform run "${SCENARIOS[@]}" --checks all --progress lines \
        --report-dir "$REPORT_DIR" "${SHARDING[@]}" "${VLLM[@]}"
    record corpus $?
fi

if wants fuzz; then
    # Generated trajectories at the nightly budget (docs/fuzzing.md), seeded by the date so
    # that a red night reproduces; reproducers of findings land in REPORT_DIR/fuzz.
    "$PY" -m kvconform fuzz --examples "${FUZZ_EXAMPLES:-20000}" --seed "$(date +%Y%m%d)" \
        --out "$REPORT_DIR/fuzz" --progress lines "${SHARDING[@]}" "${VLLM[@]}"
    record fuzz $?
fi

if wants explore; then
    # Generated scheduler workloads for the nightly budget (EXPLORE_BUDGET seconds, default
    # 1800; docs/explore.md), seeded by the date; a shard I/N searches with a seed of its own
    # (date * N + I - 1), so the shards of a night explore different workloads. Reproducers
    # of findings and explore-summary.json land in REPORT_DIR/explore.
    seed=$(date +%Y%m%d)
    if [ -n "${SHARD:-}" ]; then seed=$(( seed * ${SHARD#*/} + ${SHARD%/*} - 1 )); fi
    "$PY" -m kvconform explore --budget "${EXPLORE_BUDGET:-1800}" --seed "$seed" \
        --jobs "${EXPLORE_JOBS:-1}" --out "$REPORT_DIR/explore" "${VLLM[@]}"
    record explore $?
fi

if wants mutate; then
    # The mutation campaign over vLLM's reservation code (docs/mutation.md): REPORT_DIR/mutation.
    "$PY" -m kvconform mutate --report-dir "$REPORT_DIR/mutation" --progress lines \
        "${SHARDING[@]}" "${VLLM[@]}"
    record mutate $?
fi

if wants cuda; then
    # Tests marked `cuda` (the warmup runs unchanged on the GPU, no synchronize patch). Without
    # a GPU they are skipped; pytest's 5 ("nothing collected") counts as success.
    "$PY" -m pytest tests -q -m cuda -p no:cacheprovider --junitxml "$REPORT_DIR/cuda-tests.xml"
    test_status=$?
    if [ "$test_status" -eq 5 ]; then test_status=0; fi
    record cuda "$test_status"
fi

"$PY" tools/nightly_summary.py "$REPORT_DIR" "${statuses[@]}" --wall $(( $(date +%s) - started )) \
    --scenarios "${SCENARIOS[@]}" ${VLLM_SRC:+--vllm-src "$VLLM_SRC"} \
    ${NIGHTLY_GOOD:+--good "$NIGHTLY_GOOD"}
exit "$final"
