#!/usr/bin/env bash
# `make test-reliability`: runs the reliability suite (tests/bats/reliability)
# on the local cluster and writes RELIABILITY.md: one row per test with what
# was injected, what was asserted (the test name is "<injected>: <asserted>"),
# the result and the duration. Exits non-zero when a test failed.
#
# Usage: tools/reliability_report.sh [--from TAP] [OUTPUT]
#   (default OUTPUT: docs/reports/RELIABILITY.md). --from TAP writes the
#   report from a run that already happened: make test keeps its reliability
#   suite's output (bats --timing) in build/reliability.tap.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
from=""
if [[ "${1:-}" == --from ]]; then
  from=${2:?--from needs the TAP file of a run}
  shift 2
fi
output=${1:-$REPO_ROOT/docs/reports/RELIABILITY.md}

status=0
if [[ -n "$from" ]]; then
  tap=$from
  total=$(sed -n 's/^# suite: \([0-9]*\) s$/\1/p' "$tap")
  how="from the reliability suite's run in \`make test\` (build/reliability.tap; every suite at once)"
  grep -q '^not ok ' "$tap" && status=1
else
  tap=$(mktemp "${TMPDIR:-/tmp}/reliability-tap.XXXXXX")
  trap 'rm -f -- "$tap"' EXIT
  start=$SECONDS
  bats --timing -r "$REPO_ROOT/tests/bats/reliability" | tee "$tap" || status=$?
  total=$((SECONDS - start))
  how="by \`make test-reliability\` (tools/reliability_report.sh)"
fi

{
  echo "# Reliability suite"
  echo
  echo "Generated $how on $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "$(nproc) cores, slurm $(slurmd -V 2>/dev/null | awk '{print $2}'), against the local cluster (local_cluster/cluster.sh)."
  echo "Every fault is injected for real: signals through SLURM, a killed slurmd, preemption by a"
  echo "higher-priority partition, a truncated tarball, a too-small disk, concurrent submitters."
  echo
  echo "Total: $(grep -c '^ok ' "$tap" || true) passed, $(grep -c '^not ok ' "$tap" || true) failed, $(grep -c '# skip' "$tap" || true) skipped, ${total:-?} s."
  echo
  echo "| # | injected | asserted | result | duration |"
  echo "| --- | --- | --- | --- | --- |"
  sed -nE 's/^(ok|not ok) ([0-9]+) (.*)$/\1\t\2\t\3/p' "$tap" | while IFS=$'\t' read -r result number rest; do
    duration=$(sed -nE 's/.* in ([0-9]+)ms$/\1/p' <<<"$rest")
    rest=$(sed -E 's/ in [0-9]+ms$//' <<<"$rest")
    if [[ "$rest" == *"# skip"* ]]; then
      result="skipped"
      rest=${rest%% # skip*}
    elif [[ "$result" == ok ]]; then
      result="pass"
    else
      result="**FAIL**"
    fi
    injected=${rest%%: *}
    asserted=${rest#*: }
    [[ "$asserted" != "$rest" ]] || asserted=""
    printf '| %s | %s | %s | %s | %s |\n' "$number" "${injected//|/\\|}" "${asserted//|/\\|}" "$result" \
      "$([[ -z "$duration" ]] || awk -v ms="$duration" 'BEGIN { printf "%.1f s", ms / 1000 }')"
  done
} >"$output"
echo "reliability: wrote $output (${total:-?} s)"
exit "$status"
