#!/usr/bin/env bash
# What a GPU CI job with vLLM installed runs, as it is: the whole scenario corpus (trajectory,
# warmup, scheduler and engine scenarios, every check; engine scenarios run vLLM's real engine
# where CUDA and a CUDA build of vLLM are, and are skipped with the reason elsewhere) with its reports, a fuzz run at the nightly
# budget (FUZZ_EXAMPLES, default 20000), the mutation campaign, then kvconform's tests that need CUDA.
#
#   tools/nightly.sh [REPORT_DIR]        (default build/nightly; PYTHON picks the interpreter)
#
# REPORT_DIR gets report.json, junit.xml, summary.md, report.html (kvconform run), fuzz/
# (reproducers, fuzz-summary.json), cuda-tests.xml (pytest) and nightly.txt: versions, device,
# verdict counts, wall time. Exit status: the corpus's, else the fuzz run's, else the tests',
# per docs/cli.md (0 conform, 1 nonconformance, 2 bad input, 3 vLLM unusable).
set -uo pipefail
PY=${PYTHON:-python3}
REPORT_DIR=${1:-build/nightly}
mkdir -p "$REPORT_DIR"
REPORT_DIR=$(cd "$REPORT_DIR" && pwd)
# From the repository root, so that `python -m kvconform` is this checkout's.
cd "$(dirname "$0")/.."
started=$(date +%s)

# Every check, the slot-mapping consequence oracle included (vLLM's compiled Triton kernel on CUDA).
"$PY" -m kvconform run scenarios --checks all --report-dir "$REPORT_DIR"
run_status=$?

# Generated trajectories at the nightly budget (docs/fuzzing.md), seeded by the date so
# that a red night reproduces; reproducers of findings land in REPORT_DIR/fuzz.
"$PY" -m kvconform fuzz --examples "${FUZZ_EXAMPLES:-20000}" --seed "$(date +%Y%m%d)" \
    --out "$REPORT_DIR/fuzz" --progress lines
fuzz_status=$?

# The mutation campaign over vLLM's reservation code (docs/mutation.md): REPORT_DIR/mutation.
"$PY" -m kvconform mutate --report-dir "$REPORT_DIR/mutation" --progress lines
mutate_status=$?

# Tests marked `cuda` (the warmup runs unchanged on the GPU, no synchronize patch). Without
# a GPU they are skipped; pytest's 5 ("nothing collected") counts as success.
"$PY" -m pytest tests -q -m cuda -p no:cacheprovider \
    --junitxml "$REPORT_DIR/cuda-tests.xml"
test_status=$?
if [ "$test_status" -eq 5 ]; then test_status=0; fi

wall=$(( $(date +%s) - started ))
"$PY" - "$REPORT_DIR" "$wall" "$test_status" "$fuzz_status" <<'PYEOF' | tee "$REPORT_DIR/nightly.txt"
import json, sys
report_dir, wall, tests, fuzz = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
report = json.load(open(f"{report_dir}/report.json"))
counts = ", ".join(f"{v} {k}" for k, v in report["counts"].items() if v)
print(f"vLLM {report['vllm']['version']} ({report['vllm']['source']}), torch {report['torch']}, "
      f"device {report['device']}, python {report['python']}")
print(f"scenarios: {counts}; exit {report['exit_status']}; fuzz exit {fuzz}; "
      f"cuda tests exit {tests}; wall {wall} s")
PYEOF

if [ "$run_status" -ne 0 ]; then exit "$run_status"; fi
if [ "$fuzz_status" -ne 0 ]; then exit "$fuzz_status"; fi
if [ "$mutate_status" -ne 0 ]; then exit "$mutate_status"; fi
exit "$test_status"
