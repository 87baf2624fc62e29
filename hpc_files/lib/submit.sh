# shellcheck shell=bash
# Submission: the per-submission folder (script, trials, configs, node
# scripts, git state, the exact command), the sbatch call, and --wait.
# Sourced; functions only.

# The credentials file is read on the node only; refuse one others can read,
# and say now when the node will find no key in it.
# A key in this shell's WANDB_API_KEY is not passed (it would be in the job's
# environment, readable through scontrol): said once, with the way that works.
check_wandb_credentials() {
  local file="$HOME/wandb_credentials.txt" mode key=""
  if [[ -e "$file" ]]; then
    mode=$(readable_by_others "$file") || die "cannot stat $file"
    [[ -z "$mode" ]] || usage_error "$file is readable by others (mode $mode); run: chmod 600 '$file'"
    key=$(wandb_key_in "$file") ||
      warn "$file holds no W&B key (the key alone on one line, or a line WANDB_API_KEY=<key>); the jobs get none from it"
  fi
  [[ -z "${WANDB_API_KEY:-}" || -n "$key" ]] ||
    warn "WANDB_API_KEY is not passed to the jobs (their environment is readable through scontrol); to give them a key, write it alone on one line of $file and chmod 600 it"
}

readonly SUFFIX_CHARS=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789

# make_submission_dir: $plan_scratch_dir/$exp_name/<stamp>-XXXX, a new folder,
# private (mode 0700). It is named before it is made, so that the EXIT trap
# knows it whenever an interrupt comes (mktemp -d in $(...) could make it and
# die of a Ctrl-C before this shell learnt its name).
make_submission_dir() {
  local stamp suffix candidate i
  if [[ ! -d "$plan_log_dir" || ! -d "$plan_exp_dir/checkpoints" ]]; then
    mkdir -p "$plan_log_dir" "$plan_exp_dir/checkpoints" ||
      die "cannot create $plan_log_dir and $plan_exp_dir/checkpoints"
  fi
  printf -v stamp '%(%Y%m%d-%H%M%S)T' -1
  for _ in 1 2 3 4 5 6 7 8; do
    suffix=""
    for i in 1 2 3 4; do
      suffix+=${SUFFIX_CHARS:RANDOM % ${#SUFFIX_CHARS}:1}
    done
    candidate="$plan_exp_dir/$stamp-$suffix"
    [[ ! -e "$candidate" ]] || continue
    submission_dir=$candidate
    mkdir -m 0700 -- "$candidate" 2>/dev/null && return 0
    submission_dir=""
  done
  die "cannot create a submission folder in $plan_exp_dir"
}

# Until sbatch accepts the job (or --no-submit has written it whole), the
# submission folder is ours to remove; a setup job already queued for it
# would find nothing, so it goes too.
remove_unsubmitted_dir() {
  if [[ -n "${setup_job_id:-}" && -z "${job_id:-}" ]]; then
    scancel "$setup_job_id" 2>/dev/null || warn "could not cancel the venv setup job $setup_job_id; scancel it"
  fi
  if [[ -n "${submission_dir:-}" && -z "${job_id:-}" && -z "${submission_complete:-}" && -d "$submission_dir" ]]; then
    rm -rf -- "${submission_dir:?}"
  fi
}

# prepare_trials: starts writing the trials manifest into a temporary folder
# (trials_dir, in work_dir) that fill_submission_dir copies into the
# submission folder; finish_trials collects it (or its refusal) before
# anything is created under SCRATCH.
prepare_trials() {
  make_work_dir
  trials_dir=$work_dir/trials
  start_trials "$trials_dir"
}

# preview_submission: --dry-run. The batch script as a submission would
# write it (the data tarball named by the -d paths as they are now); nothing
# is written.
preview_submission() {
  plan_submission_folder "$plan_exp_dir/<YYYYmmdd-HHMMSS-XXXX>" 1
  name_data_tarball
  render_script
}

# fill_submission_dir ARGV...: everything the queued job will read.
fill_submission_dir() {
  local dir=$submission_dir
  local -a recorded=("$work_dir/git.txt")
  [[ -n "${opt_no_snapshot:-}" ]] || recorded+=("$work_dir/code.tar")
  mkdir -p "$dir/node" "$dir/runs" || die "cannot write in $dir"
  # The node scripts and both runtime layers (node/lib.sh load_runtime picks one).
  cp -p "$HPC_FILES_DIR"/node/*.sh "$source_dir/virtual_env_hpc_files/runtime_venv.sh" \
    "$source_dir/singularity_hpc_files/runtime_singularity.sh" "$dir/node/" ||
    die "cannot copy the node scripts and runtime layers into $dir/node"
  if [[ -n "${opt_sweep:-}" ]]; then
    cp -p "$opt_sweep" "$dir/sweep.yml" || die "cannot copy $opt_sweep"
  elif [[ -z "${opt_wandb_sweep:-}" && ${#opt_command[@]} -eq 0 ]]; then
    cp -p "$opt_configs" "$dir/experiment_configurations.txt" || die "cannot copy $opt_configs"
  fi
  await_or_exit code_record
  cp "$trials_dir"/* "${recorded[@]}" "$dir/" || die "cannot write the trials, git.txt and code.tar into $dir"
  shell_quote "$HPC_FILES_DIR/job_submitter.sh" "$@" >"$dir/command.txt"
  printf '\n' >>"$dir/command.txt"
}

# start_code_record: record_code into work_dir, in the background
# (start_background) from the validation on, for fill_submission_dir: git
# and tar run beside the validation and the questions to SLURM, which mostly
# wait. --dry-run and --list-trials write no folder.
start_code_record() {
  [[ -z "${opt_dry_run:-}${opt_list_trials:-}" ]] || return 0
  make_work_dir
  start_background code_record record_code 2>"$work_dir/code_record.stderr"
}

# record_code: the git state (git.txt), then the code snapshot (code.tar)
# unless --no-snapshot, into work_dir, one after the other: git status and
# ls-files both read the project's index.
record_code() {
  record_git_state "$work_dir/git.txt"
  [[ -n "${opt_no_snapshot:-}" ]] || snapshot_code "$work_dir/code.tar"
}

# record_git_state FILE: what the snapshot is: the project's commit, the
# checkout it came from, 'git status' and 'git diff HEAD' (the uncommitted
# edits the snapshot holds). A project outside git gets 'not a git repository'.
record_git_state() {
  local status
  # No index refresh: ls-files of the snapshot may read it meanwhile.
  status=$(GIT_OPTIONAL_LOCKS=0 git -C "$source_dir" status --porcelain 2>/dev/null) || status=""
  {
    printf 'commit: %s\n' "$(git -C "$source_dir" rev-parse HEAD 2>/dev/null || echo 'not a git repository')"
    printf 'source: %s\n' "$source_dir"
    printf 'status:\n'
    [[ -z "$status" ]] || printf '%s\n' "$status"
    printf 'diff:\n'
    # A tree git calls clean has no diff to HEAD: git diff is not asked
    # (a third of the git state's time).
    [[ -z "$status" ]] || git -C "$source_dir" diff HEAD 2>/dev/null || true
  } >"$1" || die "cannot write $1"
}

# Larger snapshots are refused: data or results inside the project tree
# belong under $SCRATCH (-d stages them).
readonly DEFAULT_SNAPSHOT_MAX_MB=200

# snapshot_code ARCHIVE: the project's code as it is now (edits included),
# as one tar file in the submission folder, so a queued job runs what was
# submitted; the batch script unpacks it beside itself (code/) when the job
# first starts. One archive, not a tree of copies: writing 500 files costs
# about 60 ms here, one file about 10 ms. A git project: the tracked files and
# the untracked ones git does not ignore. Otherwise the tree minus
# version-control folders, virtualenvs, caches, result folders (wandb,
# lightning_logs, checkpoints) and data folders (data, datasets).
snapshot_code() {
  local archive=$1 list="$1.files" max_mb=${HPC_SNAPSHOT_MAX_MB:-$DEFAULT_SNAPSHOT_MAX_MB} bytes
  local -a tar_source=() status
  is_uint "$max_mb" || usage_error "HPC_SNAPSHOT_MAX_MB expects a whole number of MiB, got '$max_mb'"
  register_cleanup "$list"
  # git lists the files of a git project, and fails outside one.
  if git -C "$source_dir" ls-files -z --cached --others --exclude-standard >"$list" 2>/dev/null; then
    # A listed file may be gone (deleted but still in the index, or an
    # editor's temporary file): tar skips it without a word.
    tar_source=(--ignore-failed-read --warning=no-failed-read --null --files-from="$list")
  else
    tar_source=(--exclude-vcs --exclude-caches-all --exclude=__pycache__ --exclude='*.pyc'
      --exclude='.*_cache' --exclude=.ipynb_checkpoints --exclude=wandb --exclude=lightning_logs
      --exclude=./checkpoints --exclude=./data --exclude=./datasets --exclude=./.venv --exclude=./venv
      --exclude=./env --exclude=./.conda --exclude=./.scratch --exclude=./.cluster .)
  fi
  # head stops the copy one byte past the cap, so a huge tree is not read whole.
  status=(0 0)
  (cd "$source_dir" && tar -cf - "${tar_source[@]}") | head -c $((max_mb * 1048576 + 1)) >"$archive" ||
    status=("${PIPESTATUS[@]}")
  bytes=$(stat -c %s "$archive") || die "cannot write $archive"
  ((bytes <= max_mb * 1048576)) ||
    usage_error "the project's code snapshot is over the ${max_mb} MiB cap (HPC_SNAPSHOT_MAX_MB); move data and results under \$SCRATCH, git-ignore them, or run the live tree with --no-snapshot"
  ((status[0] == 0 && status[1] == 0)) || die "cannot archive the project's code into $archive"
}

# report_unsubmitted: --no-submit. The folder stays; the last line on stdout
# is the command that submits it.
report_unsubmitted() {
  local quoted
  submission_complete=1
  quoted=$(shell_quote "$submission_dir/job.sbatch")
  printf 'Wrote %s (%s trial(s), %s node(s) x %s GPU(s), -W %s); nothing was queued.\n' \
    "$submission_dir" "$plan_trial_count" "$plan_nodes" "$plan_gpus_per_node" "$plan_kind"
  printf 'Submit it from any directory, now or later (again re-runs it):\n'
  printf 'sbatch %s\n' "$quoted"
}

# warn_if_other_command_checkpointed: the experiment folder already holds
# checkpoints, and the newest earlier submission ran other commands. The
# harness refuses to resume a different run (exit 2 on the node); say so now.
warn_if_other_command_checkpointed() {
  local previous="" folder checkpoint
  # A later round of method bayes lists the earlier rounds' commands, whose
  # trials keep their own folders (trials/K, K global): nothing to warn about.
  [[ -z "${HPC_BAYES_ROUND:-}" ]] || return 0
  # Checkpoints: $HPC_TRIAL_DIR/checkpoints, of the experiment or of trials/K;
  # files (*.pt) or sharded folders (*.dcp, TrainConfig.sharded_checkpoint).
  for checkpoint in "$plan_exp_dir"/checkpoints/*.pt "$plan_exp_dir"/checkpoints/*.dcp \
    "$plan_exp_dir"/trials/*/checkpoints/*.pt "$plan_exp_dir"/trials/*/checkpoints/*.dcp; do
    [[ ! -e "$checkpoint" ]] || break
  done
  [[ -e "$checkpoint" ]] || return 0
  # Newest first by ls, to the nanosecond (bash 4.2's -nt compares seconds).
  while IFS= read -r folder; do
    [[ "${folder%/commands.txt}" != "$submission_dir" ]] || continue
    previous=$folder
    break
  done < <(ls -td -- "$plan_exp_dir"/*/commands.txt 2>/dev/null)
  [[ -n "$previous" ]] || return 0
  # The new commands start over on purpose.
  ! grep -qE -- '(^| )--fresh( |$)' "$submission_dir/commands.txt" || return 0
  if cmp -s "$previous" "$submission_dir/commands.txt"; then
    warn_if_other_code "${previous%/commands.txt}"
    return 0
  fi
  warn "experiment '$opt_exp_name' already holds checkpoints, and its last submission (${previous%/commands.txt}) ran other commands; the harness refuses to resume a checkpoint of other arguments (but for those a resume may change, such as --max-steps: README, Resuming), or one already past --max-steps: use -e NEW_NAME, or add --fresh to start over (the old checkpoints are kept aside)"
}

# warn_if_other_code PREVIOUS: the same commands as submission folder
# PREVIOUS, but from another checkout of the same folder name (both write
# $SCRATCH/<name>) or other code (another commit, other uncommitted edits;
# their git.txt files). The runs will resume PREVIOUS's checkpoints with this
# code: after a fix that is what is meant, else it mixes two programs in one
# run. A project outside git has no commit to compare: nothing is said.
warn_if_other_code() {
  local previous=$1 mine="$submission_dir/git.txt" their_source their_commit my_commit what=""
  [[ -f "$previous/git.txt" ]] || return 0
  their_source=$(sed -n 's/^source: //p' "$previous/git.txt")
  their_commit=$(sed -n '1s/^commit: //p' "$previous/git.txt")
  my_commit=$(sed -n '1s/^commit: //p' "$mine")
  # Submissions from before git.txt named its checkout: no source to compare.
  if [[ -n "$their_source" && "$their_source" != "$source_dir" ]]; then
    what="came from another checkout ($their_source; this one is $source_dir, and both write $plan_scratch_dir)"
  elif [[ "$their_commit" == "not a git repository" || "$my_commit" == "not a git repository" ]]; then
    return 0
  elif [[ "$their_commit" != "$my_commit" ]]; then
    what="ran other code (commit ${their_commit:0:12}, this one ${my_commit:0:12})"
  elif ! cmp -s <(sed -n '/^diff:$/,$p' "$previous/git.txt") <(sed -n '/^diff:$/,$p' "$mine"); then
    what="ran other code (commit ${my_commit:0:12}, other uncommitted edits)"
  fi
  [[ -n "$what" ]] || return 0
  warn "experiment '$opt_exp_name' already holds checkpoints, and its last submission ($previous) $what; its runs will resume those checkpoints with this code: use -e NEW_NAME, or add --fresh to start over, if that is not what you want"
}

# leaked_names: the variables of this shell a job must not get (sbatch passes
# the rest, --export=ALL): what an enclosing allocation or step describes
# (salloc, srun, a job submitting the next one: SLURM_MEM_PER_CPU beside the
# new job's SLURM_MEM_PER_NODE makes every srun in it fail), sbatch's, salloc's
# and srun's option variables, which would bend the layout, the log and the
# array (an SBATCH_ACCOUNT or SBATCH_PARTITION stays where the submission sets
# none), the toolkit's own internals (those a job needs, its script sets), the
# W&B key (the node reads it from its file) and the node-local folder.
leaked_names() {
  local name
  for name in ${!SLURM_@} ${!SLURMD_@} ${!SBATCH_@} ${!SALLOC_@} ${!SRUN_@} ${!HPC_@}; do
    case "$name" in
      SLURM_CONF | SLURM_CLUSTERS | SLURM_TIME_FORMAT) ;;
      SBATCH_QOS | SBATCH_RESERVATION | SBATCH_CLUSTERS | SBATCH_CONSTRAINT | SBATCH_WCKEY) ;;
      SBATCH_ACCOUNT) [[ -z "${plan_account:-}" ]] || printf '%s\n' "$name" ;;
      SBATCH_PARTITION) [[ -z "${plan_partition:-}" ]] || printf '%s\n' "$name" ;;
      # The user's knobs: the submitter's and those the node and harness read.
      HPC_SITE | HPC_SITES_DIR | HPC_PYTHON | HPC_SNAPSHOT_MAX_MB) ;;
      HPC_WANDB | HPC_DIST_TIMEOUT | HPC_SETUP_PYTHON) ;;
      *) printf '%s\n' "$name" ;;
    esac
  done
  printf '%s\n' WANDB_API_KEY MASTER_ADDR
  # An allocation's GPUs; the new job's own are set by SLURM.
  [[ -z "${SLURM_JOB_ID:-}" ]] || printf '%s\n' CUDA_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES GPU_DEVICE_ORDINAL
}

# sbatch_from_submission ARG...: sbatch ARG... in the submission folder, its
# output and errors on stdout, with this shell's environment less
# leaked_names; MASTER_ADDR is the new job's first node (batch.sh).
sbatch_from_submission() {
  sbatch_in_folder "$submission_dir" "$@"
}

# sbatch_in_folder DIR [NAME=VALUE]... ARG...: sbatch_from_submission's call,
# in folder DIR, with each leading NAME=VALUE in sbatch's environment. They
# travel there, not in an --export list: any list (even ALL,NAME=VALUE) makes
# sbatch set SLURM_GET_USER_ENV, and slurmd then runs the user's login shell
# (su -) before every job and array task, its variables under the job's.
sbatch_in_folder() {
  local dir=$1
  local -a names
  shift
  mapfile -t names < <(leaked_names)
  (
    cd "$dir" && unset "${names[@]}" || exit 1
    while [[ "${1:-}" =~ ^[A-Z_][A-Z0-9_]*= ]]; do
      export "${1?}"
      shift
    done
    sbatch "$@" 2>&1
  )
}

# run_interactive: --interactive. The batch script, run now by salloc in an
# allocation of the same resources (resource_options and the site's and
# --sbatch-arg's options, as salloc reads them), its output on this terminal;
# exits with the program's exit code. HPC_INTERACTIVE tells batch.sh that
# Ctrl-C ends the program and that nothing is requeued.
run_interactive() {
  local arg name value exit_code=0
  local -a resource_args names
  submission_complete=1
  resource_options
  for arg in ${plan_sbatch_args[@]+"${plan_sbatch_args[@]}"}; do
    name=$(sbatch_option_name "$arg")
    value=$(sbatch_option_value "$arg")
    if [[ "$name" == --* ]]; then
      resource_args+=("$name${value:+=$value}")
    else
      resource_args+=("$name" ${value:+"$value"})
    fi
  done
  [[ -z "$plan_dependency" ]] || resource_args+=("--dependency=$plan_dependency")
  info "interactive: $plan_nodes node(s) x $plan_gpus_per_node GPU(s), -W $plan_kind; the program's output follows (Ctrl-C ends it); submission: $submission_dir"
  mapfile -t names < <(leaked_names)
  (cd "$submission_dir" && unset "${names[@]}" && HPC_INTERACTIVE=1 exec salloc "${resource_args[@]}" bash job.sbatch) ||
    exit_code=$?
  exit "$exit_code"
}

# submit_setup_job: with --setup-venv, a setup job before the training job,
# only when the venv's digest stamp does not match the requirements file;
# where the site's compute nodes have no internet, the same script runs here.
# Sets setup_job_id (empty when the venv is up to date).
submit_setup_job() {
  local output
  setup_job_id=""
  [[ -n "${opt_setup_venv:-}" ]] || return 0
  if [[ "$plan_venv_held" == "$plan_requirements_digest" ]]; then
    info "venv: $plan_venv matches ${opt_setup_venv##*/}; no setup job"
    return 0
  fi
  cp -p "$opt_setup_venv" "$submission_dir/requirements.txt" || die "cannot copy $opt_setup_venv"
  render_setup_script >"$submission_dir/setup.sbatch" || die "cannot write $submission_dir/setup.sbatch"
  if [[ "$plan_compute_internet" == no ]]; then
    # The script the setup job would run, here, where pip reaches the index.
    info "venv: site '$site_name' compute nodes have no internet; building $plan_venv here from ${opt_setup_venv##*/} first"
    bash "$submission_dir/setup.sbatch" >&2 ||
      die "building $plan_venv from ${opt_setup_venv##*/} failed (above); nothing was submitted"
    return 0
  fi
  output=$(sbatch_from_submission --parsable --export=ALL setup.sbatch) ||
    die "sbatch refused the venv setup job: ${output//$'\n'/ }"
  setup_job_id=${output%%;*}
  [[ "$setup_job_id" =~ ^[0-9]+$ ]] || die "sbatch printed no job id for the setup job: ${output//$'\n'/ }"
  printf '%s\n' "$setup_job_id" >"$submission_dir/setup_job_id"
  info "venv: setup job $setup_job_id builds $plan_venv from ${opt_setup_venv##*/}; the training job waits for it"
}

# submit_job: sbatch, from the submission folder; sets job_id. A sweep
# above the cluster's MaxArraySize (plan_array_chunk) goes as several array
# jobs of the same script, each of at most that many tasks: task K of the
# one from trial F runs trial F+K (HPC_TRIAL_OFFSET=F, node/lib.sh). job_id
# is the first's; array_jobs lists each with its first trial (status.sh,
# results.sh), job_ids the others (stop.sh, the busy check).
submit_job() {
  local id first=0 count sbatch_args=(--parsable)
  if [[ -n "${setup_job_id:-}" ]]; then
    # On the command line, it overrides the script's --dependency line: keep both.
    # A failed setup cancels the training job rather than leaving it pending forever.
    sbatch_args+=(--dependency="afterok:$setup_job_id${plan_dependency:+,$plan_dependency}" --kill-on-invalid-dep=yes)
  fi
  # On the command line, the requeue protocol and the wall time beat SBATCH_*
  # variables of this shell; the job gets this shell's environment (ALL), less
  # what sbatch_from_submission leaves out.
  sbatch_args+=("${plan_requeue_args[@]}" --time="$plan_time")
  if [[ -z "${plan_array_chunk:-}" ]]; then
    job_id=$(sbatch_for_id HPC_CONTRACT_ON_COMMAND_LINE=1 "${sbatch_args[@]}" --export=ALL) || exit 1
    printf '%s\n' "$job_id" >"$submission_dir/job_id"
    return 0
  fi
  while ((first < plan_trial_count)); do
    count=$((plan_trial_count - first))
    ((count <= plan_array_chunk)) || count=$plan_array_chunk
    id=$(sbatch_for_id HPC_CONTRACT_ON_COMMAND_LINE=1 "HPC_TRIAL_OFFSET=$first" "${sbatch_args[@]}" \
      "--array=0-$((count - 1))${plan_array_throttle:+%$plan_array_throttle}" --export=ALL) ||
      { [[ -z "${job_id:-}" ]] || die "trials from $first were not queued; those before are (job(s) $(paste -sd, - <"$submission_dir/array_jobs" | sed 's/ [0-9]*//g')): hpc_files/stop.sh $opt_exp_name cancels them"; exit 1; }
    if ((first == 0)); then
      job_id=$id
      printf '%s\n' "$id" >"$submission_dir/job_id"
    else
      printf '%s\n' "$id" >>"$submission_dir/job_ids"
    fi
    printf '%s %s\n' "$id" "$first" >>"$submission_dir/array_jobs"
    first=$((first + count))
  done
}

# sbatch_for_id [NAME=VALUE]... ARG...: sbatch ARG... job.sbatch from the
# submission folder, NAME=VALUE in its environment (sbatch_in_folder);
# prints the job id it printed, or fails with one line naming sbatch's answer.
sbatch_for_id() {
  local output id
  output=$(sbatch_from_submission "$@" job.sbatch) || die "sbatch refused the job: ${output//$'\n'/ }"
  id=${output%%;*}
  id=${id##*$'\n'}
  [[ "$id" =~ ^[0-9]+$ ]] || die "sbatch printed no job id: ${output//$'\n'/ }"
  printf '%s' "$id"
}

# log_path JOB: the log file that sbatch's --output pattern names for JOB
# (array: '<task>' stands for the task id). Quoted replacements: bash 5.2
# reads '&' in an unquoted one as the matched text (a project 'a&b').
log_path() {
  local name=${plan_log_name//%x/"$plan_job_name"}
  name=${name//%j/"$1"}
  name=${name//%A/"$1"}
  name=${name//%a/<task>}
  printf '%s/%s' "$plan_log_dir" "$name"
}

report_submission() {
  local log quoted_log
  log=$(log_path "$job_id")
  printf 'Submitted job %s (%s trial(s), %s node(s) x %s GPU(s), -W %s)\n' \
    "$job_id" "$plan_trial_count" "$plan_nodes" "$plan_gpus_per_node" "$plan_kind"
  [[ ! -f "$submission_dir/array_jobs" ]] ||
    printf '  arrays:     %s (MaxArraySize %s; job, first trial)\n' "$(paste -sd, - <"$submission_dir/array_jobs")" "$plan_array_chunk"
  printf '  log:        %s\n' "$log"
  printf '  submission: %s\n' "$submission_dir"
  quoted_log=$(shell_quote "$log")
  printf '  follow:     squeue -j %s   or   tail -f %s\n' "$job_id" "$quoted_log"
  [[ -z "$plan_wandb_sync_dir" ]] || report_wandb_sync
}

# report_wandb_sync: the line that starts the login-node syncer of
# --wandb-sync login, as tmux (which outlives the login session) runs it.
report_wandb_sync() {
  local command quoted
  printf -v command 'bash %q %q' "$HPC_FILES_DIR/wandb_sync.sh" "$plan_exp_name"
  quoted=$(shell_quote "$command")
  printf '  W&B live:   tmux new -d -s sync %s\n' "$quoted"
}

# job_states JOB: 'STATE EXIT:SIGNAL' for the job (one line per array task;
# 0:0 where ExitCode is missing or not N:M). The fields are read as
# record_field reads them (the first of each name, up to the next space), by
# one awk for all the records: --wait polls a 1000-task array every 2 s, and
# two record_field subshells per task took 3 s a poll here.
job_states() {
  job_records "$1" | awk '{
    seen = 0; code = "0:0"; coded = 0
    for (i = 1; i <= NF; i++) {
      if (!seen && $i ~ /^JobState=/) { state = substr($i, 10); seen = 1 }
      else if (!coded && $i ~ /^ExitCode=/) { coded = 1; if ($i ~ /^ExitCode=[0-9]+:[0-9]+$/) code = substr($i, 10) }
    }
    if (seen) print state " " code
  }'
}

# wait_for_job: follow the job until every task ended; print state changes and
# the log tail; exit with the job's exit code (the largest over array tasks).
wait_for_job() {
  local states last="" line all_final worst=0 code signal log
  info "waiting for job $job_id (Ctrl-C stops waiting, not the job)"
  while :; do
    states=$(job_states "$job_id")
    [[ -n "$states" ]] || die "job $job_id is no longer known to scontrol; see sacct -j $job_id"
    if [[ "$states" != "$last" ]]; then
      info "job $job_id: $(awk '{print $1}' <<<"$states" | sort | uniq -c | awk '{printf "%s%s x%s", sep, $2, $1; sep=", "}')"
      last=$states
    fi
    all_final=1
    while read -r line; do
      is_final_state "${line%% *}" || all_final=0
    done <<<"$states"
    ((all_final)) && break
    sleep 2
  done
  if [[ "$states" == *SPECIAL_EXIT* || "$states" == *REQUEUE_HOLD* ]]; then
    warn "job $job_id is held after a requeue; it runs again only after: scontrol release $job_id"
  fi
  log=$(log_path "$job_id")
  if [[ -z "$plan_array_spec" && -f "$log" ]]; then
    info "last lines of $log:"
    tail -n 15 "$log" >&2
  fi
  while read -r line; do
    code=${line#* }
    signal=${code#*:}
    code=${code%:*}
    ((signal > 0 && 128 + signal > code)) && code=$((128 + signal))
    ((code > worst)) && worst=$code
    [[ "${line%% *}" == COMPLETED ]] || ((worst > 0)) || worst=1
  done <<<"$states"
  exit "$worst"
}
