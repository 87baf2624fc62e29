#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in single quotes are Markdown code spans
# Submission latency against the local SLURM cluster, whole processes:
#   ours      bash hpc_files/job_submitter.sh --site local -g 0 -W none -d DATA -- true
#             from a user's project of 500 source files in git (each submission
#             archives them as its code snapshot); the data tarball is cached:
#             one priming run builds it first
#   submitit  a python process that imports submitit and calls executor.submit
#   sbatch    sbatch --parsable --wrap true
# interleaved (ours submitit sbatch ours ...) after a discarded warm-up round.
# Then ours under bench/submit_phases.sh (the submitter's steps timed one by
# one), and the cache-hit path with data sets of 1k, 20k and 100k files.
# Every job is submitted with --begin=now+3600 (it never runs) and cancelled
# at once; the script checks that none is left.
#
# Usage: bench/submit_latency.sh [--smoke] [--reps N] [--out FILE]
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

reps=7
smoke=""
out=""
sizes=(1000 20000 100000)
while (($# > 0)); do
  case "$1" in
    --smoke) smoke=1 reps=1 sizes=(100 1000) ;;
    --reps) reps=${2:?--reps expects a number} && shift ;;
    --out) out=${2:?--out expects a file} && shift ;;
    -h | --help) bench_usage && exit 0 ;;
    *) bench_die "unknown option '$1'" ;;
  esac
  shift
done

need_cluster
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-submit.XXXXXX")
cleanup() {
  cancel_submitted
  rm -rf -- "${work:?}"
}
trap cleanup EXIT

project=project
project_dir="$work/$project"
make_user_project "$project_dir" 500
# bench/submit_phases.sh runs this project's submitter too.
export BENCH_PROJECT=$project_dir
export SCRATCH="$work/scratch"
data_root="$SCRATCH/$project/datasets"
mkdir -p "$data_root/small"
# The data set of the latency runs: 200 files of 1 KiB.
for ((i = 0; i < 200; i++)); do
  head -c 1024 /dev/zero >"$data_root/small/f$i"
done
begin=now+3600
ours=(bash "$project_dir/hpc_files/job_submitter.sh" --site local -g 0 -W none -e bench_submit
  -d datasets/small "--sbatch-arg=--begin=$begin" -- true)
submitit=("$BENCH_PY" "$BENCH_ROOT/bench/submitit_submit.py" "$work/submitit" --begin "$begin")
bare=(sbatch --parsable "--begin=$begin" --wrap true)

samples="$work/latency.tsv"
commands="$work/commands.tsv"
{
  printf 'ours\t%s\n' "hpc_files/job_submitter.sh --site local -g 0 -W none -e bench_submit -d datasets/small -- true (a 500-file git project)"
  printf 'ours_phased\t%s\n' "bench/submit_phases.sh (same options; each step timed)"
  printf 'submitit\t%s\n' "python bench/submitit_submit.py (import submitit; SlurmExecutor.submit)"
  printf 'sbatch\t%s\n' "sbatch --parsable --wrap true"
} >"$commands"

# submit_one CONFIG REP: run one submission, record its time, cancel the job.
submit_one() {
  local config=$1 rep=$2 t0 output id
  t0=$(now)
  case "$config" in
    ours) output=$(cd "$work" && "${ours[@]}" 2>/dev/null) ;;
    ours_phased) output=$(cd "$work" && BENCH_PHASES="$work/phases.$rep" bash "$BENCH_ROOT/bench/submit_phases.sh" "${ours[@]:2}" 2>/dev/null) ;;
    submitit) output=$(cd "$work" && "${submitit[@]}") ;;
    sbatch) output=$(cd "$work" && "${bare[@]}") ;;
  esac
  local elapsed
  elapsed=$(since "$t0")
  id=$(grep -oE '(^Submitted job |^)[0-9]+' <<<"$output" | grep -oE '[0-9]+' | head -n 1)
  [[ -n "$id" ]] || bench_die "$config printed no job id: $output"
  track_job "$id"
  scancel "$id"
  ((rep < 0)) || record "$samples" "$config" "$rep" "$elapsed"
}

load_before=$(loadavg)
# Priming: builds the data tarball (the cache-hit path is what gets timed).
submit_one ours -1
configs=(ours submitit sbatch ours_phased)
rounds=()
[[ -n "$smoke" ]] || rounds+=(-1)
for ((r = 0; r < reps; r++)); do rounds+=("$r"); done
for r in "${rounds[@]}"; do
  for c in $(round_order "$r" "${configs[@]}"); do
    submit_one "$c" "$r"
  done
  bench_note "round $r done"
done

# Phase table: median over reps of each phase (microseconds -> ms).
phase_table() {
  awk -F '\t' '
    FNR == 1 { file++ }
    { sum[$1, file] += $2; seen[$1] = 1; if (!($1 in order)) { order[$1] = ++n; names[n] = $1 } }
    END {
      for (i = 1; i <= n; i++) {
        name = names[i]; m = 0
        for (f = 1; f <= file; f++) vals[++m] = sum[name, f] / 1000.0
        # insertion sort, then median
        for (a = 2; a <= m; a++) { v = vals[a]; b = a - 1; while (b > 0 && vals[b] > v) { vals[b + 1] = vals[b]; b-- } vals[b + 1] = v }
        med = (m % 2) ? vals[(m + 1) / 2] : (vals[m / 2] + vals[m / 2 + 1]) / 2
        printf "%s\t%.2f\t%.2f\t%.2f\n", name, med, vals[1], vals[m]
      }
    }' "$@"
}

describe_phase() {
  case "$1" in
    load_libraries) echo "bash start-up to main: source the 9 lib/*.sh files" ;;
    parse_options) echo "parse the command line" ;;
    project_paths) echo "find the project root" ;;
    load_site) echo "read the site profile" ;;
    apply_defaults) echo "built-in defaults" ;;
    validate_settings) echo "validation (numbers, time, memory, names, files)" ;;
    scratch_paths) echo "scratch folders" ;;
    plan_layout) echo "resource layout" ;;
    validate_data_paths) echo "validate -d paths (realpath when a symlink is on the way; sort for 2+ paths)" ;;
    plan_data) echo "tarball name: sha256 of the path list" ;;
    plan_runtime_settings) echo "venv / container" ;;
    check_wandb_credentials) echo "credentials file mode" ;;
    make_submission_dir) echo "mkdir the submission folder (a random name, as mktemp -d)" ;;
    fill_submission_dir) echo "copy node scripts, trials, git state, code snapshot" ;;
    snapshot_code) echo "&nbsp;&nbsp;in it: git ls-files + tar of the project's 500 files into code.tar" ;;
    record_git_state) echo "&nbsp;&nbsp;in it: git rev-parse, status and diff into git.txt" ;;
    write_trials) echo "&nbsp;&nbsp;in it: commands.txt, written in bash for a command after --; otherwise trials.jsonl + commands.txt from python hpc_files/lib/trials.py" ;;
    login_python) echo "&nbsp;&nbsp;&nbsp;&nbsp;choose the python" ;;
    git) echo "&nbsp;&nbsp;in them: every git process (sum)" ;;
    plan_array) echo "array spec" ;;
    render_script) echo "render the batch script" ;;
    stage_data_tarball) echo "data: manifest + cache check" ;;
    data_manifest) echo "&nbsp;&nbsp;in it: find + sort (the manifest)" ;;
    data_cache_matches) echo "&nbsp;&nbsp;in it: cmp with the cached manifest (fed by data_manifest through a pipe: the two overlap)" ;;
    submit_setup_job) echo "--setup-venv (not used)" ;;
    submit_job) echo "sbatch call" ;;
    sbatch) echo "&nbsp;&nbsp;in it: the sbatch process" ;;
    report_submission) echo "print the summary" ;;
    main) echo "**main() total**" ;;
    *) echo "" ;;
  esac
}

phase_md() {
  local name med lo hi
  printf '| phase | what | median | min-max |\n| --- | --- | --- | --- |\n'
  while IFS=$'\t' read -r name med lo hi; do
    printf '| `%s` | %s | %s ms | %s-%s ms |\n' "$name" "$(describe_phase "$name")" "$med" "$lo" "$hi"
  done < <(phase_table "$@")
}

# Manifest growth: cache-hit submissions with 1k, 20k, 100k files.
growth_samples="$work/growth.tsv"
growth_commands="$work/growth_commands.tsv"
declare -A growth_phase_files=()
for n in "${sizes[@]}"; do
  "$BENCH_PY" - "$data_root/files_$n" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for d in range(0, n, 1000):
    sub = os.path.join(root, f"d{d // 1000:03d}")
    os.makedirs(sub, exist_ok=True)
    for i in range(d, min(n, d + 1000)):
        with open(os.path.join(sub, f"f{i:06d}"), "wb") as f:
            f.write(b"x" * 16)
PY
  growth_phase_files[$n]=""
  printf 'files_%s\t%s\n' "$n" "submit_phases.sh ... -d datasets/files_$n -- true (cache hit)" >>"$growth_commands"
  # Priming: build this data set's tarball once.
  (cd "$work" && BENCH_PHASES=/dev/null bash "$BENCH_ROOT/bench/submit_phases.sh" --site local -g 0 -W none \
    -e bench_submit -d "datasets/files_$n" "--sbatch-arg=--begin=$begin" -- true 2>/dev/null) |
    grep -oE '^Submitted job [0-9]+' | grep -oE '[0-9]+' | while read -r id; do scancel "$id"; done
done
growth_reps=$((reps < 5 ? reps : 5))
for ((r = 0; r < growth_reps; r++)); do
  for n in "${sizes[@]}"; do
    t0=$(now)
    output=$(cd "$work" && BENCH_PHASES="$work/growth_phases.$n.$r" bash "$BENCH_ROOT/bench/submit_phases.sh" \
      --site local -g 0 -W none -e bench_submit -d "datasets/files_$n" "--sbatch-arg=--begin=$begin" -- true 2>/dev/null)
    elapsed=$(since "$t0")
    id=$(grep -oE '^Submitted job [0-9]+' <<<"$output" | grep -oE '[0-9]+')
    track_job "$id"
    scancel "$id"
    record "$growth_samples" "files_$n" "$r" "$elapsed"
    growth_phase_files[$n]+=" $work/growth_phases.$n.$r"
  done
done
# Sanity: every job we submitted is gone.
cancel_submitted
load_after=$(loadavg)

ours_med=$(median "$samples" ours)
submitit_med=$(median "$samples" submitit)
goal=$(awk -v a="$ours_med" -v b="$submitit_med" 'BEGIN { r = a / b; printf "%.2fx submitit (goal <= 0.5x: %s)", r, (r <= 0.5 ? "met" : "NOT met") }')
phase_files=()
for ((r = 0; r < reps; r++)); do phase_files+=("$work/phases.$r"); done

section=$(
  printf '## 2. Submission latency (local SLURM cluster)\n\n'
  printf 'Whole processes, from fork to exit (job id printed). %s interleaved reps after %s; ' "$reps" \
    "$([[ -n "$smoke" ]] && echo 'no warm-up (smoke)' || echo 'one discarded warm-up round')"
  printf 'every job submitted with `--begin=now+3600` and cancelled at once. '
  printf 'Data for `ours`: 200 files of 1 KiB, tarball already cached (cache-hit path). '
  printf 'Load before/after: %s / %s.\n\n' "$load_before" "$load_after"
  md_table "$samples" "$commands" submitit "ours,submitit,sbatch,ours_phased"
  printf '\nours = **%s**.\n\n' "$goal"
  printf '**Where the time goes in `ours`** (bench/submit_phases.sh: the submitter'"'"'s own main() with each step timed; medians over %s reps; nested rows are included in the row above them):\n\n' "$reps"
  phase_md "${phase_files[@]}"
  printf '\n**Cache-hit submission vs number of files under `-d`** (%s reps, interleaved):\n\n' "$growth_reps"
  md_table "$growth_samples" "$growth_commands" "files_${sizes[0]}" "$(printf 'files_%s,' "${sizes[@]}")"
  printf '\nData steps per size (medians, ms):\n\n| files | data_manifest (find+sort) | data_cache_matches | stage_data_tarball | validate_data_paths |\n| --- | --- | --- | --- | --- |\n'
  for n in "${sizes[@]}"; do
    # shellcheck disable=SC2086 # the list of files is space separated on purpose
    phase_table ${growth_phase_files[$n]} | awk -F '\t' -v n="$n" '
      { med[$1] = $2 }
      END { printf "| %s | %s | %s | %s | %s |\n", n, med["data_manifest"], med["data_cache_matches"], med["stage_data_tarball"], med["validate_data_paths"] }'
  done
)
if [[ -n "$out" ]]; then
  printf '%s\n' "$section" >"$out"
fi
printf '%s\n' "$section"
