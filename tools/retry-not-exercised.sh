#!/usr/bin/env bash
# Run a command; while it exits 3 (vLLM could not be exercised: an import that failed on
# this machine, a lost device, a half-installed image -- docs/cli.md), run it again, at
# most RETRIES more times, a minute apart (RETRY_DELAY seconds). Any other status, 1
# (nonconformance) above all, is final at once: a red verdict is never retried into green.
#
#   tools/retry-not-exercised.sh RETRIES COMMAND [ARG...]
#
# The GitHub Actions recipe wraps its steps with it; Buildkite's recipe says the same with
# its own `retry: automatic: [{exit_status: 3}]` (ci/buildkite.yml, docs/ci.md).
set -u
retries=${1:?usage: retry-not-exercised.sh RETRIES COMMAND [ARG...]}
shift
attempt=0
while :; do
    status=0
    "$@" || status=$?
    if [ "$status" -ne 3 ] || [ "$attempt" -ge "$retries" ]; then exit "$status"; fi
    attempt=$((attempt + 1))
    echo "retry-not-exercised: exit 3 (vLLM could not be exercised); attempt $((attempt + 1)) of $((retries + 1))" >&2
    sleep "${RETRY_DELAY:-60}"
done
