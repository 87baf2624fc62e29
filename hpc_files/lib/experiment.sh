# shellcheck shell=bash
# An experiment as one thing: its jobs are those its submission folders
# recorded (job_id; job_ids: the further jobs queued from a folder, such as
# --retry-failed's; bayes_controller_job_id, setup_job_id) and those
# named for it (<project>_<exp>: a 'sbatch job.sbatch' by hand), as squeue
# lists them now. The submitter refuses a second submission while some are
# queued or running (--after-running queues it behind them); stop.sh cancels
# them and writes the stop record (<exp>/stopped), which a method-bayes
# controller reads before it submits a round; --retry-failed reruns the failed
# trials of its last submission. Sourced; functions only.

# The stop record's name in the experiment folder (bayes.py reads it too).
readonly STOP_RECORD=stopped

# ask_queue: the user's jobs (slurm_user), asked of squeue in the
# background (start_background) for queue_after_running (answer.queue).
ask_queue() {
  make_work_dir
  slurm_user=${USER:-$(id -un)}
  start_background queue user_queue "$slurm_user" >"$work_dir/answer.queue"
}

# user_queue USER: squeue's lines for USER's jobs ('%F|%T|%j': the array job
# id, the state, the name); fails when squeue gives no answer within 10 s.
user_queue() {
  timeout 10 squeue -h -u "$1" -o '%F|%T|%j' 2>/dev/null
}

# experiment_jobs EXP_DIR JOB_NAME: of the user's jobs that squeue lists on
# stdin (user_queue's lines), the (array) job ids of the experiment that are
# not ending (COMPLETING), ascending, one a line.
experiment_jobs() {
  local exp_dir=$1 name=$2 file id state job
  local -A recorded=() live=()
  for file in "$exp_dir"/*/job_id "$exp_dir"/*/job_ids "$exp_dir"/*/bayes_controller_job_id "$exp_dir"/*/setup_job_id; do
    [[ -f "$file" ]] || continue
    while read -r id _; do
      [[ ! "$id" =~ ^[0-9]+$ ]] || recorded[$id]=1
    done <"$file"
  done
  # The name last: a project folder's name may hold the separator.
  while IFS='|' read -r id state job; do
    [[ "$id" =~ ^[0-9]+$ && "$state" != COMPLETING ]] || continue
    [[ -n "${recorded[$id]:-}" || "$job" == "$name" ]] || continue
    live[$id]=1
  done
  ((${#live[@]} == 0)) || printf '%s\n' "${!live[@]}" | sort -n
}

# queue_after_running: a submission to an experiment with queued or running
# jobs is refused, naming them and the ways out: its runs would write the
# same trial folders and checkpoints, and results.sh would mix them. With
# --after-running it waits for them instead (afterany, beside --dependency).
# A method-bayes round that the search's controller submits (HPC_BAYES_ROUND)
# runs inside the experiment: never refused here.
queue_after_running() {
  local listing joined
  [[ -z "${HPC_BAYES_ROUND:-}" ]] || return 0
  # No answer from squeue (no cluster here): sbatch will say so.
  await_answer queue || return 0
  listing=$(experiment_jobs "$plan_exp_dir" "$plan_job_name" <"$work_dir/answer.queue")
  if [[ -z "$listing" ]]; then
    [[ -z "${opt_after_running:-}" ]] ||
      info "--after-running: no job of experiment '$opt_exp_name' is queued or running; it starts when SLURM allows"
    return 0
  fi
  joined=$(paste -sd, - <<<"$listing")
  [[ -n "${opt_after_running:-}" ]] ||
    usage_error "experiment '$opt_exp_name' has queued or running job(s) $joined; a second submission would share its trial folders and checkpoints: use -e NEW for a new experiment, --after-running to queue behind them, or stop them first: hpc_files/stop.sh $opt_exp_name"
  plan_dependency="afterany:${joined//,/:}${plan_dependency:+,$plan_dependency}"
  info "--after-running: queued behind job(s) $joined of experiment '$opt_exp_name'"
}

# clear_stop_record: a new search or run in a stopped experiment, submitted
# by the user (not a bayes round), is the user going on: its rounds may start.
clear_stop_record() {
  [[ -z "${HPC_BAYES_ROUND:-}" && -e "$plan_exp_dir/$STOP_RECORD" ]] || return 0
  rm -f -- "$plan_exp_dir/$STOP_RECORD" || die "cannot remove $plan_exp_dir/$STOP_RECORD"
  info "experiment '$opt_exp_name' was stopped (stop.sh); this submission starts it again"
}

# stop_help: stop.sh's --help.
stop_help() {
  cat <<'HELP'
Usage: stop.sh EXP|JOBID

Stops an experiment of this project: cancels every job of it that is queued
or running (its array jobs, a method-bayes controller, venv setup jobs) and
records the stop in $SCRATCH/<project>/EXP/stopped, so that no later round
of a method-bayes search starts. JOBID (or JOBID_TASK) names the experiment
of the submission that ran that job. A later submission to EXP by hand
starts it again.

  -h, --help      this help
HELP
}

# stop_main ARG...: stop.sh.
stop_main() {
  local target="" exp exp_dir user queue listing pass id cancelled=""
  local -a ids
  local -A seen=()
  while (($# > 0)); do
    case "$1" in
      -h | --help)
        stop_help
        return 0
        ;;
      --)
        shift
        (($# == 0)) || [[ -z "$target" && $# -eq 1 ]] || usage_error "expected one experiment or job id, got: $target $*"
        target=${1:-$target}
        break
        ;;
      -?*) usage_error "unknown option '$1' (see --help)" ;;
      *)
        [[ -z "$target" ]] || usage_error "expected one experiment or job id, got '$target' and '$1'"
        target=$1
        ;;
    esac
    shift
  done
  [[ -n "$target" ]] || usage_error "expected an experiment name or a job id (see --help)"
  [[ -n "${SCRATCH:-}" ]] || usage_error "SCRATCH is not set; it names the folder that holds \$SCRATCH/<project>/<exp>"
  project_paths
  exp=$(stop_target_experiment "$target") || exit $?
  exp_dir="$SCRATCH/$project_name/$exp"
  # First the record, then the cancels: a controller running now reads it
  # before it submits the next round.
  { printf 'stopped %(%F %T %Z)T by stop.sh %s\n' -1 "$target" >"$exp_dir/$STOP_RECORD.tmp" &&
    mv -f -- "$exp_dir/$STOP_RECORD.tmp" "$exp_dir/$STOP_RECORD"; } || die "cannot write $exp_dir/$STOP_RECORD"
  # A controller that was submitting a round as the record appeared queues
  # it and records its job id: the next pass cancels it.
  user=${USER:-$(id -un)}
  for pass in 1 2 3 4 5 6 7 8 9 10; do
    queue=$(user_queue "$user") ||
      die "squeue gave no answer; the stop is recorded ($exp_dir/$STOP_RECORD) but no job was cancelled"
    listing=$(experiment_jobs "$exp_dir" "${project_name}_$exp" <<<"$queue")
    [[ -n "$listing" ]] || break
    mapfile -t ids <<<"$listing"
    scancel -- "${ids[@]}" || die "scancel ${ids[*]} failed"
    # A job still ending at the next pass is cancelled again, named once.
    for id in "${ids[@]}"; do
      [[ -n "${seen[$id]:-}" ]] || cancelled+="${cancelled:+,}$id"
      seen[$id]=1
    done
    ((pass == 10)) || sleep 1
  done
  [[ -z "$listing" ]] || die "job(s) $(paste -sd, - <<<"$listing") of experiment '$exp' are still listed after 10 scancel passes"
  if [[ -n "$cancelled" ]]; then
    printf 'Stopped experiment %s: cancelled job(s) %s; recorded in %s\n' "$exp" "$cancelled" "$exp_dir/$STOP_RECORD"
  else
    printf 'Stopped experiment %s: no job of it was queued or running; recorded in %s\n' "$exp" "$exp_dir/$STOP_RECORD"
  fi
}

# stop_target_experiment TARGET: the experiment TARGET names: an experiment
# folder of the project, or (digits, as experiment names never are) the one
# whose submission folder recorded that job id, else the one squeue names it for.
stop_target_experiment() {
  local target=$1 project_dir="$SCRATCH/$project_name" file id name
  if [[ ! "$target" =~ ^[0-9]+(_[0-9]+)?$ ]]; then
    [[ "$target" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ && -d "$project_dir/$target" ]] ||
      usage_error "no experiment '$target' in $project_dir (an experiment name, or a job id)"
    printf '%s' "$target"
    return 0
  fi
  id=${target%%_*}
  for file in "$project_dir"/*/*/job_id "$project_dir"/*/*/job_ids "$project_dir"/*/*/bayes_controller_job_id "$project_dir"/*/*/setup_job_id; do
    [[ -f "$file" ]] || continue
    if grep -qx -- "$id\( .*\)\?" "$file"; then
      file=${file%/*}
      file=${file%/*}
      printf '%s' "${file##*/}"
      return 0
    fi
  done
  name=$(timeout 10 squeue -h -j "$id" -o '%j' 2>/dev/null | head -n 1) || name=""
  if [[ "$name" == "${project_name}_"* && -d "$project_dir/${name#"${project_name}"_}" ]]; then
    printf '%s' "${name#"${project_name}"_}"
    return 0
  fi
  usage_error "no submission of project '$project_name' recorded job $id, and squeue names no experiment of it for that job"
}

# retry_failed: --retry-failed EXP. The failed trials (results.py failed: not
# finished, pruned, queued or running) of EXP's newest submission run again
# as an array job of the same job.sbatch: the same code snapshot and data
# tarball, each in its own trials/K folder (resuming its checkpoints). The
# requeue protocol's lines of the script go on sbatch's command line, as
# submit_job puts them there. A sweep split at MaxArraySize (array_jobs)
# gets one such array per part that holds failed trials, with its offset.
retry_failed() {
  local name python listing retry_dir throttle k first part joined output retry_id queued=""
  local -a trials args variables firsts=(0)
  local -A tasks=()
  for name in "${!OPT_GIVEN[@]}"; do
    case "$name" in
      retry_failed | dry_run | after_running) ;;
      *) usage_error "--retry-failed reruns the last submission as it was written; it takes no option but --after-running and --dry-run, got --${name//_/-}" ;;
    esac
  done
  require_name --retry-failed "$opt_retry_failed"
  opt_exp_name=$opt_retry_failed
  validate_scratch
  plan_paths
  plan_job_name="${project_name}_${opt_exp_name}"
  plan_dependency=""
  [[ -d "$plan_exp_dir" ]] || usage_error "--retry-failed: no experiment '$opt_exp_name' in $plan_scratch_dir"
  python=$(login_python)
  listing=$(HPC_PROG=$HPC_PROG PYTHONPATH=$(hpc_tools_path) "$python" -m hpc_tools.results failed --project "$project_name" "$opt_exp_name") ||
    exit $?
  mapfile -t trials <<<"$listing"
  retry_dir=${trials[0]}
  trials=("${trials[@]:1}")
  [[ ! -f "$retry_dir/bayes.json" ]] ||
    usage_error "--retry-failed: $retry_dir is a round of a method-bayes search, whose controller told Optuna its failed trials; start a new search (-e NEW)"
  if ((${#trials[@]} == 0)); then
    info "no failed trial in the last submission of '$opt_exp_name' ($retry_dir); nothing to retry"
    return 0
  fi
  joined=$(IFS=,; printf '%s' "${trials[*]}")
  ask_queue
  queue_after_running
  [[ ! -f "$retry_dir/array_jobs" ]] || mapfile -t firsts < <(awk '{ print $2 }' "$retry_dir/array_jobs" | sort -n)
  # Trial K runs as task K - F of the part from trial F (the last F <= K).
  for k in "${trials[@]}"; do
    for first in "${firsts[@]}"; do
      ((first > k)) || part=$first
    done
    tasks[$part]+="${tasks[$part]:+,}$((k - part))"
  done
  throttle=$(sed -n 's/^#SBATCH --array=[^%]*//p' "$retry_dir/job.sbatch")
  for first in "${firsts[@]}"; do
    [[ -n "${tasks[$first]:-}" ]] || continue
    args=(--parsable)
    ! grep -q '^#SBATCH --array=' "$retry_dir/job.sbatch" || args+=("--array=${tasks[$first]}$throttle")
    [[ -z "$plan_dependency" ]] || args+=("--dependency=$plan_dependency")
    mapfile -t -O "${#args[@]}" args < <(sed -n 's/^#SBATCH \(--\(open-mode\|signal\|requeue\|time\)\b.*\)$/\1/p' "$retry_dir/job.sbatch")
    args+=(--export=ALL)
    variables=(HPC_CONTRACT_ON_COMMAND_LINE=1)
    ((${#firsts[@]} == 1)) || variables+=("HPC_TRIAL_OFFSET=$first")
    if [[ -n "${opt_dry_run:-}" ]]; then
      printf 'Would rerun trial(s) %s of %s: %s sbatch %s job.sbatch\n' "$joined" "$retry_dir" \
        "$(shell_quote "${variables[@]}")" "$(shell_quote "${args[@]}")"
      continue
    fi
    output=$(sbatch_in_folder "$retry_dir" "${variables[@]}" "${args[@]}" job.sbatch) || die "sbatch refused the retry: ${output//$'\n'/ }"
    retry_id=${output%%;*}
    retry_id=${retry_id##*$'\n'}
    [[ "$retry_id" =~ ^[0-9]+$ ]] || die "sbatch printed no job id: ${output//$'\n'/ }"
    printf '%s\n' "$retry_id" >>"$retry_dir/job_ids" || warn "cannot record job $retry_id in $retry_dir/job_ids"
    # results.sh maps a split sweep's retried tasks to trials by it.
    ((${#firsts[@]} == 1)) || printf '%s %s\n' "$retry_id" "$first" >>"$retry_dir/retry_jobs" ||
      warn "cannot record job $retry_id in $retry_dir/retry_jobs"
    queued+="${queued:+,}$retry_id"
  done
  [[ -z "$queued" ]] ||
    printf 'Resubmitted trial(s) %s of %s as job %s (the same code snapshot and data; each in its own trial folder)\n' \
      "$joined" "$retry_dir" "$queued"
}
