#!/usr/bin/env bash
# Run kvconform's engine scenarios on a lent GPU machine (CUDA, torch, no vLLM, no network)
# from the parts `make gpu-engine-bundle VLLM=X` built (docs/engine-mode.md). A device call
# carries at most 64 MiB, so the parts travel in calls issued back to back (the machine goes
# back 30 s after a call); each call runs this script, which first copies the parts it
# carries to a folder outside the checkout, where they survive while the machine is held:
#
#   bash tools/gpu-engine-run.sh stash                 calls 1..N-1: keep the carried parts
#   bash tools/gpu-engine-run.sh run [PATH|ARG ...]    the last call: keep, join, unpack,
#                                                      install, `kvconform run` (default
#                                                      scenarios/engine --checks all)
#   bash tools/gpu-engine-run.sh python ARG ...         after a run: python with the same paths
#
# ENGINE_PATCH=FILE runs against a copy of the tree with FILE applied (patch -p1).
# ENGINE_PARTS: where the carried parts are (default .gpu-engine/$VLLM/parts in this
# checkout); VLLM (default 0.25.0); ENGINE_HOME (default $HOME/kvconform-engine); reports go
# to REPORT_DIR (default $OUT/engine, else build/gpu-engine). vLLM's compiled tree and the
# installed wheels go on PYTHONPATH behind the repository. VLLM_TARGET_DEVICE stays unset:
# this is vLLM's CUDA build. FlashInfer is not carried, so its sampler is turned off.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
VLLM=${VLLM:-0.25.0}
PARTS_IN=${ENGINE_PARTS:-.gpu-engine/$VLLM/parts}
HOME_DIR=${ENGINE_HOME:-$HOME/kvconform-engine}/$VLLM
REPORT_DIR=${REPORT_DIR:-${OUT:-build/gpu-engine}/engine}
command=${1:-run}
shift || true

mkdir -p "$HOME_DIR/parts"
kept=0
for part in "$PARTS_IN"/part-* "$PARTS_IN"/SHA256SUMS; do
    [ -e "$part" ] || continue
    cp "$part" "$HOME_DIR/parts/"
    kept=$((kept + 1))
done
echo "gpu-engine-run: kept $kept carried file(s); $(ls "$HOME_DIR/parts" | grep -c '^part-') part(s) held for vLLM $VLLM"
if [ "$command" = stash ]; then exit 0; fi

if [ ! -e "$HOME_DIR/ready" ]; then
    SECONDS=0
    if [ ! -e "$HOME_DIR/parts/SHA256SUMS" ]; then
        echo "gpu-engine-run: no SHA256SUMS among the parts; carry them with a part" >&2
        exit 2
    fi
    (cd "$HOME_DIR/parts" && sha256sum --quiet -c SHA256SUMS) || {
        echo "gpu-engine-run: parts missing or damaged (carry every part listed in SHA256SUMS)" >&2
        exit 2
    }
    rm -rf "$HOME_DIR/payload" "$HOME_DIR/tree" "$HOME_DIR/site"
    mkdir -p "$HOME_DIR/payload" "$HOME_DIR/tree"
    cat "$HOME_DIR"/parts/part-* | tar -x -C "$HOME_DIR/payload"
    tar -xzf "$HOME_DIR/payload/vllm-tree.tar.gz" -C "$HOME_DIR/tree"
    mapfile -t lacking < <("$PY" tools/gpu_bundle.py missing "$HOME_DIR/payload/wheels")
    if [ "${#lacking[@]}" -gt 0 ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --target "$HOME_DIR/site" "${lacking[@]}"
    fi
    rm -f "$HOME_DIR/payload/vllm-tree.tar.gz"
    touch "$HOME_DIR/ready"
    echo "gpu-engine-run: joined, unpacked vLLM $VLLM and installed ${#lacking[@]} wheels in ${SECONDS} s"
fi

TREE=$HOME_DIR/tree
if [ -n "${ENGINE_PATCH:-}" ]; then
    # A patched copy of vLLM's tree (hard links, so cheap; patch writes the files it changes
    # anew, leaving the unpatched tree as it was), e.g. the upstream warmup fix.
    TREE=$HOME_DIR/tree-$(basename "$ENGINE_PATCH" .patch)
    if [ ! -d "$TREE" ]; then
        cp -al "$HOME_DIR/tree" "$TREE"
        patch -s -p1 -d "$TREE" < "$ENGINE_PATCH"
    fi
    echo "gpu-engine-run: vLLM's tree with $ENGINE_PATCH applied"
fi
export PYTHONPATH="$REPO:$TREE:$HOME_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
unset VLLM_TARGET_DEVICE
export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONUNBUFFERED=1
if [ "$command" = python ]; then
    exec "$PY" "$@"
fi
"$PY" -c 'import torch, vllm; print("gpu-engine-run: vLLM", vllm.__version__, "torch", torch.__version__,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'
if [ "$#" -eq 0 ]; then set -- scenarios/engine --checks all; fi
mkdir -p "$REPORT_DIR"
# Each engine run's raw recording (for `kvconform engine record --from`), and the whole
# output of any engine child that failed.
export KVCONFORM_ENGINE_RECORDINGS=${KVCONFORM_ENGINE_RECORDINGS:-$REPORT_DIR/recordings}
export KVCONFORM_ENGINE_LOGS=${KVCONFORM_ENGINE_LOGS:-$REPORT_DIR/logs}
exec "$PY" -m kvconform run "$@" --report-dir "$REPORT_DIR"
