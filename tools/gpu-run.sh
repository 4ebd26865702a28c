#!/usr/bin/env bash
# Run kvconform's nightly on a GPU machine that has CUDA and torch but no vLLM and no network,
# from the bundle `make gpu-bundle` built (.gpu/, carried with the working tree). One line:
#
#   bash tools/gpu-run.sh            (reports under $OUT/nightly when $OUT is set, else build/gpu)
#
# It unpacks vLLM's Python tree, installs the carried wheels this machine lacks (and only
# those) into a scratch folder, puts both behind the repository on PYTHONPATH and runs
# tools/nightly.sh. VLLM_TARGET_DEVICE=cpu is the one trap (docs/gpu.md): with vLLM's
# metadata present on an NVIDIA machine vLLM picks its CUDA platform, which imports the
# compiled extensions a .py-only tree lacks. With it vLLM does its own bookkeeping on its CPU
# platform while torch still runs on the GPU, so warmup_kernels runs unchanged there,
# torch.accelerator.synchronize() included. A host with a full vLLM install runs
# tools/nightly.sh (make nightly) directly instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUNDLE=${BUNDLE:-.gpu}
REPORT_DIR=${REPORT_DIR:-${OUT:-build/gpu}/nightly}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/kvconform-gpu.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT

if [ ! -f "$BUNDLE/vllm-tree.tar.gz" ]; then
    echo "gpu-run: no $BUNDLE/vllm-tree.tar.gz; run 'make gpu-bundle' first and carry $BUNDLE" >&2
    exit 2
fi
SECONDS=0
tar -xzf "$BUNDLE/vllm-tree.tar.gz" -C "$SCRATCH"
mapfile -t lacking < <("$PY" tools/gpu_bundle.py missing "$BUNDLE/wheels")
if [ "${#lacking[@]}" -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SCRATCH/site" "${lacking[@]}"
fi
echo "gpu-run: unpacked vLLM's tree and installed ${#lacking[@]} wheels in ${SECONDS} s"

export PYTHONPATH="$PWD:$SCRATCH:$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_TARGET_DEVICE=cpu
export PYTHONUNBUFFERED=1
"$PY" -c 'import torch; print("gpu-run: torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
PYTHON="$PY" bash tools/nightly.sh "$REPORT_DIR"
