#!/usr/bin/env bash
# Run kvconform's nightly on a GPU machine that has CUDA and torch but no vLLM and no network,
# from the bundle `make gpu-bundle` built (.gpu/, carried with the working tree). One line:
#
#   bash tools/gpu-run.sh            (reports under $OUT/nightly when $OUT is set, else build/gpu)
#   bash tools/gpu-run.sh CMD ARG... (runs CMD in the same environment instead, e.g.
#                                     python3 -m kvconform mutate --jobs 14 --report-dir DIR)
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
if [ "$#" -gt 0 ]; then               # one command in the prepared environment, its status
    status=0
    "$@" || status=$?
    exit "$status"
fi
status=0
if [ "${NIGHTLY:-1}" != 0 ]; then      # NIGHTLY=0: only the carried releases below
    PYTHON="$PY" bash tools/nightly.sh "$REPORT_DIR" || status=$?
fi

# Older releases carried in the bundle (make gpu-bundle GPU_RELEASES=...): the warmup
# scenarios with every check, against each. Their verdicts are information, not this
# run's status: 0.27.1 is expected to fail (the upstream warmup bug).
#
# vLLM before 0.28 ignores VLLM_TARGET_DEVICE and, seeing the GPU through NVML, picks its
# CUDA platform, which imports compiled extensions a .py tree lacks. vLLM's own platform
# plugin mechanism (entry point group vllm.platform_plugins; an out-of-tree plugin wins
# over the built-in ones) selects its UnspecifiedPlatform instead, the platform it uses on
# a machine without a GPU; torch still runs on the GPU. Only these runs see the plugin.
PLUGIN="$SCRATCH/platform-plugin"
mkdir -p "$PLUGIN/kvconform_pytree_platform-0.dist-info"
printf 'def platform():\n    return "vllm.platforms.interface.UnspecifiedPlatform"\n' \
    > "$PLUGIN/kvconform_pytree_platform.py"
printf 'Metadata-Version: 2.1\nName: kvconform-pytree-platform\nVersion: 0\n' \
    > "$PLUGIN/kvconform_pytree_platform-0.dist-info/METADATA"
printf '[vllm.platform_plugins]\nkvconform_pytree = kvconform_pytree_platform:platform\n' \
    > "$PLUGIN/kvconform_pytree_platform-0.dist-info/entry_points.txt"
mkdir -p "$REPORT_DIR"
for release in "$BUNDLE"/releases/*.tar.gz; do
    [ -e "$release" ] || continue
    version=$(basename "$release" .tar.gz)
    mkdir -p "$SCRATCH/release-$version"
    tar -xzf "$release" -C "$SCRATCH/release-$version"
    code=0
    PYTHONPATH="$PYTHONPATH:$PLUGIN" "$PY" -m kvconform run scenarios/warmup --checks all \
        --vllm-src "$SCRATCH/release-$version" \
        --report-dir "$REPORT_DIR/../release-$version" > "$REPORT_DIR/../release-$version.log" 2>&1 \
        || code=$?
    echo "gpu-run: vLLM $version on scenarios/warmup: exit $code ($(grep -E '^[0-9a-z ,]+ in [0-9.]+ s; exit' "$REPORT_DIR/../release-$version.log"))"
done
exit "$status"
