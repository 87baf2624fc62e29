#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in single quotes are Markdown code spans
# Submission latency against the local SLURM cluster, whole processes:
#   ours         bash hpc_files/job_submitter.sh --site local -g 0 -W none -d DATA -- true
#                from a user's project of 500 source files in git (each submission
#                archives them as its code snapshot); the data tarball is cached:
#                one priming run builds it first
#   ours_traced  the same through bench/trace_submit.sh, which writes a
#                timestamped line as each step of the submitter's main() starts
#                (a DEBUG trap; the submitter itself has no tracing), which gives
#                the table of where the time goes
#   submitit     a python process that imports submitit and calls executor.submit
#   sbatch       sbatch --parsable --wrap true
#   NAME         (--variant NAME=DIR) ours, from a copy of the project whose
#                hpc_files/ is DIR: the paired difference to ours is what DIR's
#                change costs or saves
# interleaved (ours submitit sbatch ours_traced ...) after a discarded warm-up
# round. Then the cache-hit path with data sets of 1k, 20k and 100k files
# (traced; --no-growth skips it). Every job is submitted with
# --begin=now+3600 (it never runs) and cancelled at once; the script checks
# that none is left.
# What a change to the submitter costs: --variant before=DIR/hpc_files with
# 'git archive COMMIT hpc_files | tar -x -C DIR' (issue 15's fork-avoidance
# tricks were measured so). On a shared, loaded machine the paired
# differences drown in noise (+-200 ms at a load of 12 on 2 cores); as root,
# 'chrt -f 10 bench/submit_latency.sh ...' gives numbers like a quiet
# machine's (slurmctld itself keeps its normal priority).
#
# Usage: bench/submit_latency.sh [--smoke] [--reps N] [--out FILE] [--no-growth]
#                                [--variant NAME=HPC_FILES_DIR]...
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

variants=()
growth=1
common_args=()
while (($# > 0)); do
  case "$1" in
    --variant)
      [[ "${2:-}" =~ ^[a-z][a-z0-9_]*=. ]] || bench_die "--variant expects NAME=HPC_FILES_DIR, got '${2:-}'"
      [[ -f "${2#*=}/job_submitter.sh" ]] || bench_die "--variant ${2%%=*}: no job_submitter.sh in '${2#*=}'"
      variants+=("$2")
      shift
      ;;
    --no-growth) growth="" ;;
    *) common_args+=("$1") ;;
  esac
  shift
done
bench_options 7 ${common_args[@]+"${common_args[@]}"}
sizes=(1000 20000 100000)
[[ -z "$smoke" ]] || sizes=(100 1000)
[[ -n "$growth" ]] || sizes=()

need_cluster
bench_workdir submit "${TMPDIR:-/tmp}"
# A login shell has USER; a container's or CI's shell may not, and each
# submission would then ask 'id -un' where a user's does not.
export USER=${USER:-$(id -un)}

project=project
project_dir="$work/$project"
make_user_project "$project_dir" 500
# A variant's project: the same files and commit, its own hpc_files/, and the
# same name (a folder of its own in work), so it shares the scratch folder,
# the data set and the cached tarball with ours.
variant_names=()
for spec in ${variants[@]+"${variants[@]}"}; do
  name=${spec%%=*}
  mkdir -p "$work/variants/$name"
  git clone -q "$project_dir" "$work/variants/$name/$project"
  rm -rf -- "$work/variants/$name/$project/hpc_files"
  cp -r "${spec#*=}" "$work/variants/$name/$project/hpc_files"
  # Its hpc_files/ differs from the commit only as the change being measured.
  git -C "$work/variants/$name/$project" -c user.name=bench -c user.email=bench@localhost commit -qam variant || true
  variant_names+=("$name")
done
export SCRATCH="$work/scratch"
# ours runs trials.py with the python submitit runs with (a user's venv), not
# the first python3 on PATH: a pyenv shim there starts a dozen processes of
# its own before python (about 4x a python start). HPC_PYTHON=PYTHON picks
# another (a login node's system python3).
export HPC_PYTHON=${HPC_PYTHON:-$BENCH_PY}
# A user's hpc_files/hpc_tools gets its __pycache__ at the first submission
# (the discarded warm-up round here), as submitit's modules got theirs at
# install: a shell that sets PYTHONDONTWRITEBYTECODE would compile ours again
# at every rep.
unset PYTHONDONTWRITEBYTECODE
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
  printf 'ours_traced\t%s\n' "bench/trace_submit.sh FILE hpc_files/job_submitter.sh (same options; each step of main() timed)"
  printf 'submitit\t%s\n' "python bench/submitit_submit.py (import submitit; SlurmExecutor.submit)"
  printf 'sbatch\t%s\n' "sbatch --parsable --wrap true"
  for spec in ${variants[@]+"${variants[@]}"}; do
    printf '%s\t%s\n' "${spec%%=*}" "ours with hpc_files/ from ${spec#*=}"
  done
} >"$commands"

# trace_phases TRACE T0 T1: a bench/trace_submit.sh file of a run that started
# at T0 and ended at T1 (now values) as 'phase<TAB>microseconds' lines:
# load_libraries (bash start-up to main), each step of main() (its line's time
# to the next line's; the call of main, its EXIT trap's setting, '[[ ... ]]'
# tests and returns left out) and main (to the end of the process, the EXIT
# trap included).
trace_phases() {
  awk -F '\t' -v t0="$2" -v t1="$3" '
    function us(t, p) { split(t, p, "."); return (p[1] - base) * 1000000 + substr(p[2] "000000", 1, 6) }
    BEGIN { split(t0, b, "."); base = b[1] }
    { stamp[NR] = us($1); split($2, w, " "); name[NR] = w[1] }
    END {
      stamp[NR + 1] = us(t1)
      printf "load_libraries\t%d\n", stamp[1] - us(t0)
      for (i = 1; i <= NR; i++)
        if (name[i] != "[[" && name[i] != "return" && name[i] != "main" && name[i] != "trap") printf "%s\t%d\n", name[i], stamp[i + 1] - stamp[i]
      printf "main\t%d\n", stamp[NR + 1] - stamp[1]
    }' "$1"
}

# submit_one CONFIG REP: run one submission, record its time, cancel the job.
submit_one() {
  local config=$1 rep=$2 t0 t1 output id
  rm -f -- "$work/trace"
  t0=$(now)
  case "$config" in
    ours) output=$(cd "$work" && "${ours[@]}" 2>/dev/null) ;;
    ours_traced) output=$(cd "$work" && bash "$BENCH_ROOT/bench/trace_submit.sh" "$work/trace" "${ours[@]:1}" 2>/dev/null) ;;
    submitit) output=$(cd "$work" && "${submitit[@]}") ;;
    sbatch) output=$(cd "$work" && "${bare[@]}") ;;
    *) output=$(cd "$work" && bash "$work/variants/$config/$project/hpc_files/job_submitter.sh" "${ours[@]:2}" 2>/dev/null) ;;
  esac
  t1=$(now)
  local elapsed
  elapsed=$(diff_s "$t0" "$t1")
  [[ "$config" != ours_traced ]] || trace_phases "$work/trace" "$t0" "$t1" >"$work/phases.$rep"
  id=$(grep -oE '(^Submitted job |^)[0-9]+' <<<"$output" | grep -oE '[0-9]+' | head -n 1)
  [[ -n "$id" ]] || bench_die "$config printed no job id: $output"
  track_job "$id"
  scancel "$id"
  ((rep < 0)) || record "$samples" "$config" "$rep" "$elapsed"
}

load_before=$(loadavg)
# Priming: builds the data tarball (the cache-hit path is what gets timed).
submit_one ours -1
configs=(ours submitit sbatch ours_traced ${variant_names[@]+"${variant_names[@]}"})
run_rounds submit_one "${configs[@]}"

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
    load_libraries) echo "bash start-up to main: source the lib/*.sh files" ;;
    parse_options) echo "parse the command line" ;;
    project_paths) echo "find the project root" ;;
    load_site) echo "read the site profile" ;;
    apply_defaults) echo "built-in defaults" ;;
    validate_settings) echo "validation (numbers, time, memory, names, files)" ;;
    scratch_paths) echo "scratch folders" ;;
    plan_layout) echo "resource layout" ;;
    validate_data_paths) echo "validate -d paths (inside the scratch folder, links followed)" ;;
    start_data_digest) echo "-d manifest digest (find + sort + sha256sum) started in the background" ;;
    plan_data) echo "tarball name: sha256 of the path list" ;;
    plan_runtime_settings) echo "venv / container" ;;
    check_wandb_credentials) echo "credentials file mode" ;;
    prepare_trials) echo "trials: hpc_tools.trials (one python -c process) started in the background (trials.jsonl + commands.txt into a temporary folder)" ;;
    ask_slurm) echo "squeue, scontrol (partitions, accounts) and sinfo started in the background" ;;
    start_code_record) echo "git state (git status, rev-parse; diff for a changed tree), then the code snapshot (git ls-files + tar of the project's 500 files), started in the background" ;;
    validate_allocation) echo "wait for scontrol's and sinfo's answers; partition, node memory and account checks" ;;
    queue_after_running) echo "wait for squeue's answer; the experiment's queued or running jobs" ;;
    finish_trials) echo "wait for trials.py, what it did not do beside the checks above" ;;
    make_submission_dir) echo "mkdir the submission folder (a random name, as mktemp -d)" ;;
    fill_submission_dir) echo "one cp of the node scripts and runtime layers; wait for the code record; one cp of the trials, git state and code snapshot" ;;
    plan_array) echo "array spec" ;;
    render_script) echo "render the batch script" ;;
    stage_data_tarball) echo "data: wait for the manifest digest; cache check (cmp)" ;;
    submit_setup_job) echo "--setup-venv (not used)" ;;
    submit_job) echo "sbatch call" ;;
    report_submission) echo "print the summary" ;;
    main) echo "**main() total** (to the end of the process, EXIT trap included)" ;;
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

# traced_submit DATA PHASES: ours with -d DATA through bench/trace_submit.sh,
# its steps into the file PHASES; prints the seconds it took.
traced_submit() {
  local t0 t1 output id
  rm -f -- "$work/trace"
  t0=$(now)
  output=$(cd "$work" && bash "$BENCH_ROOT/bench/trace_submit.sh" "$work/trace" "$project_dir/hpc_files/job_submitter.sh" --site local -g 0 -W none \
    -e bench_submit -d "$1" "--sbatch-arg=--begin=$begin" -- true 2>/dev/null)
  t1=$(now)
  id=$(grep -oE '^Submitted job [0-9]+' <<<"$output" | grep -oE '[0-9]+')
  [[ -n "$id" ]] || bench_die "-d $1 printed no job id: $output"
  track_job "$id"
  scancel "$id"
  trace_phases "$work/trace" "$t0" "$t1" >"$2"
  diff_s "$t0" "$t1"
}

# Manifest growth: cache-hit submissions with 1k, 20k, 100k files.
growth_samples="$work/growth.tsv"
growth_commands="$work/growth_commands.tsv"
declare -A growth_phase_files=()
for n in ${sizes[@]+"${sizes[@]}"}; do
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
  printf 'files_%s\t%s\n' "$n" "bench/trace_submit.sh FILE job_submitter.sh ... -d datasets/files_$n -- true (cache hit)" >>"$growth_commands"
  # Priming: build this data set's tarball once.
  traced_submit "datasets/files_$n" /dev/null >/dev/null
done
growth_reps=$((reps < 5 ? reps : 5))
for ((r = 0; r < growth_reps; r++)); do
  for n in ${sizes[@]+"${sizes[@]}"}; do
    record "$growth_samples" "files_$n" "$r" "$(traced_submit "datasets/files_$n" "$work/growth_phases.$n.$r")"
    growth_phase_files[$n]+=" $work/growth_phases.$n.$r"
  done
done
# Sanity: every job we submitted is gone.
cancel_submitted
load_after=$(loadavg)

ours_med=$(median "$samples" ours)
submitit_med=$(median "$samples" submitit)
goal=$(awk -v a="$ours_med" -v b="$submitit_med" 'BEGIN { r = a / b; printf "%.2fx submitit (goal < 1.0x: %s)", r, (r < 1 ? "met" : "NOT met") }')
phase_files=()
for ((r = 0; r < reps; r++)); do phase_files+=("$work/phases.$r"); done
order="ours,submitit,sbatch,ours_traced$(printf ',%s' ${variant_names[@]+"${variant_names[@]}"})"

section=$(
  printf '## 2. Submission latency (local SLURM cluster)\n\n'
  printf 'Whole processes, from fork to exit (job id printed). %s interleaved reps after %s; ' "$reps" \
    "$(warmup_note)"
  printf 'every job submitted with `--begin=now+3600` and cancelled at once. '
  printf 'Data for `ours`: 200 files of 1 KiB, tarball already cached (cache-hit path). '
  printf 'Load before/after: %s / %s.\n\n' "$load_before" "$load_after"
  md_table "$samples" "$commands" submitit "$order"
  printf '\nours = **%s**.\n' "$goal"
  if ((${#variant_names[@]} > 0)); then
    printf '\n**Variants: paired difference to `ours`** (variant rep i minus ours rep i; positive: the variant is slower):\n\n'
    "$BENCH_PY" "$BENCH_ROOT/bench/benchstats.py" diff "$samples" --anchor ours --commands "$commands" \
      --order "$(printf '%s,' "${variant_names[@]}")"
  fi
  printf '\n**Where the time goes in `ours`** (`bench/trace_submit.sh`: a line as each step of main() starts; a step lasts until the next line; medians over %s reps):\n\n' "$reps"
  phase_md "${phase_files[@]}"
  if ((${#sizes[@]} > 0)); then
    printf '\n**Cache-hit submission vs number of files under `-d`** (%s reps, interleaved):\n\n' "$growth_reps"
    md_table "$growth_samples" "$growth_commands" "files_${sizes[0]}" "$(printf 'files_%s,' "${sizes[@]}")"
    printf '\nData steps per size (medians, ms):\n\n| files | validate_data_paths | stage_data_tarball (the digest begun in the background, then cmp) |\n| --- | --- | --- |\n'
    for n in "${sizes[@]}"; do
      # shellcheck disable=SC2086 # the list of files is space separated on purpose
      phase_table ${growth_phase_files[$n]} | awk -F '\t' -v n="$n" '
        { med[$1] = $2 }
        END { printf "| %s | %s | %s |\n", n, med["validate_data_paths"], med["stage_data_tarball"] }'
    done
  fi
)
bench_section "$section"
