# shellcheck shell=bash
# Experiments -> trials. A configs file, a sweep file, '--seeds', a wandb
# sweep id and a command after '--' become one manifest, written by
# hpc_tools/trials.py alone: trials.jsonl (one JSON object per trial, what
# results.sh reads) and commands.txt (line K+1: trial K's command as shell
# words, the one file the node reads). Sourced.

# The first lines of the program that runs trials.py (trials_py_command): they
# parse under python 2 too, and refuse a python older than 3.9 with one line
# (an old login node's python3 would die on trials.py with a traceback)
# before anything is imported. argv: PYTHON (its name in the line), the line
# with {} for the version, trials.py's options. One process: no 'python -V'
# before it, no runpy.
readonly TRIALS_PY_MAIN='import sys
if sys.version_info < (3, 9):
    version = "%s is %d.%d.%d" % ((sys.argv[1],) + tuple(sys.version_info[:3]))
    sys.stderr.write(sys.argv[2].replace("{}", version) + "\n")
    sys.exit(1)
from hpc_tools.trials import main
sys.exit(main(sys.argv[3:]))'

# The message that refuses the login python: TRIALS_PY_MAIN puts the python
# and its version where '{}' is, require_runnable why it cannot run.
TRIALS_PYTHON_REFUSAL='expanding trials needs python 3.9 or newer; {} (set HPC_PYTHON to a newer python, or pass --venv)'

# require_runnable PYTHON: die with that message unless PYTHON is a command
# that can run (no process is started).
require_runnable() {
  local mark='{}' why="cannot run '$1'"
  command -v -- "$1" >/dev/null || die "${TRIALS_PYTHON_REFUSAL/$mark/$why}"
}

# trials_args: the experiment source as trials.py options (into trials_argv).
trials_args() {
  trials_argv=(--prog "$HPC_PROG")
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    trials_argv+=(--wandb-sweep "$opt_wandb_sweep" --count "$plan_sweep_count")
  elif [[ -n "${opt_sweep:-}" ]]; then
    trials_argv+=(--sweep "$opt_sweep" --sweep-seed "$opt_sweep_seed")
    [[ -z "${opt_trials:-}" ]] || trials_argv+=(--trials "$opt_trials")
    [[ -z "${opt_rounds:-}" ]] || trials_argv+=(--rounds "$opt_rounds")
    # A later round of method bayes, submitted by the controller (bayes.py).
    if [[ -n "${HPC_BAYES_ROUND:-}" ]]; then
      trials_argv+=(--round "$HPC_BAYES_ROUND" --journal "${HPC_BAYES_JOURNAL:?}" --study "${HPC_BAYES_STUDY:?}")
    fi
  elif ((${#opt_command[@]} > 0)); then
    # The command after '--' is one configs line, quoted so it means exactly
    # the words given.
    make_work_dir
    inline_configs=$work_dir/command.txt
    shell_quote "${opt_command[@]}" >"$inline_configs"
    printf '\n' >>"$inline_configs"
    # Messages name it as the user knows it, not by the temporary file.
    trials_argv+=(--configs "$inline_configs" --configs-label "the command after '--'")
  else
    trials_argv+=(--configs "$opt_configs")
  fi
  [[ -z "${opt_seeds:-}" ]] || trials_argv+=(--seeds "$opt_seeds")
}

# trials_py_command: trials.py on the experiment source, as an argv (into
# trials_command; its python in trials_python), run with PYTHONPATH set to
# hpc_tools_path; --list or --out-dir DIR goes after it.
# A configs file, a command and --seeds need only the standard library:
# python -S then skips site-packages, whose .pth files cost a venv's python
# about half of its start (25 ms here, more from an NFS home), the largest
# step of a submission (bench/submit_latency.sh). A sweep needs PyYAML, a
# wandb sweep wandb.
trials_py_command() {
  local site=()
  trials_args
  trials_python=$(login_python)
  [[ -n "${opt_wandb_sweep:-}${opt_sweep:-}" ]] || site=(-S)
  trials_command=("$trials_python" ${site[@]+"${site[@]}"} -c "$TRIALS_PY_MAIN"
    "$trials_python" "$(error_line "$TRIALS_PYTHON_REFUSAL")" "${trials_argv[@]}")
}

# list_trials: print the manifest to stdout; writes nothing.
list_trials() {
  trials_py_command
  require_runnable "$trials_python"
  PYTHONPATH=$(hpc_tools_path) "${trials_command[@]}" --list
}

# start_trials DIR: trials.py writes DIR/trials.jsonl and DIR/commands.txt,
# in the background (start_background): its python start is the longest
# step of a submission (bench/submit_latency.sh), and the checks that ask
# SLURM run meanwhile. The python check runs there too, its refusal said by
# finish_trials. Their stdout and stderr wait in work_dir for finish_trials.
start_trials() {
  trials_py_command
  make_work_dir
  start_background trials run_trials_py "$1" >"$work_dir/trials.stdout" 2>"$work_dir/trials.stderr"
}

# run_trials_py DIR: trials.py writing into DIR.
run_trials_py() {
  require_runnable "$trials_python"
  PYTHONPATH=$(hpc_tools_path) exec "${trials_command[@]}" --out-dir "$1"
}

# finish_trials: waits for start_trials' trials.py and prints what it said,
# after the messages of the checks that ran meanwhile; sets trials_count.
# Exits as trials.py did when it refuses the experiments.
finish_trials() {
  await_or_exit trials
  # method bayes prints 'COUNT FIRST': FIRST is this round's first trial.
  read -r trials_count bayes_first <"$work_dir/trials.stdout"
}

# refuse_bayes_unsubmitted: method bayes is rounds of jobs, each round
# submitted by the controller job that follows the one before; --no-submit
# queues neither the round nor its controller.
refuse_bayes_unsubmitted() {
  [[ -n "${bayes_first:-}" && -n "${opt_no_submit:-}" ]] || return 0
  usage_error "method bayes runs as rounds of jobs submitted by a controller job after each; --no-submit would leave one round of random trials and no search: submit it, or use method random"
}

# refuse_bayes_over_trials: a new method-bayes search (round 1, from the
# user) in an experiment whose trials/K folders an earlier search used. Its
# trials number from 0 again (task K runs line K of commands.txt), so trial K
# would find another configuration's checkpoints in trials/K: refused.
refuse_bayes_over_trials() {
  local used
  [[ -n "${bayes_first:-}" && -z "${HPC_BAYES_ROUND:-}" ]] || return 0
  for used in "$plan_exp_dir"/trials/*; do
    [[ -d "$used" ]] || continue
    usage_error "experiment '$opt_exp_name' holds the trial folders of an earlier search (trials/${used##*/} ...); a new method-bayes search numbers its trials from 0 again and would resume theirs: use another -e"
  done
}

# bayes_journal: the study's journal file, in the experiment folder.
bayes_journal() {
  printf '%s/optuna.journal' "$plan_exp_dir"
}

# study_name: the Optuna study of this submission in the journal: named after
# round 1's folder for method bayes (later rounds are told it), else this folder.
study_name() {
  printf '%s' "${HPC_BAYES_STUDY:-${submission_dir##*/}}"
}

# prune_start: a sweep with early_terminate: writes early_terminate.json into
# the submission folder (the pruner's settings, journal and study) that the
# trials' hpc_harness/pruning.py reads; nothing without the block.
prune_start() {
  [[ -n "${opt_sweep:-}" ]] || return 0
  grep -qE '^[^#]*early_terminate' "$submission_dir/sweep.yml" || return 0
  local python
  python=$(login_python)
  PYTHONPATH=$(hpc_tools_path) "$python" -m hpc_tools.prune start --submission "$submission_dir" \
    --journal "$(bayes_journal)" --study "$(study_name)" ||
    die "early_terminate: cannot write $submission_dir/early_terminate.json"
}

# bayes_start ARGV...: method bayes, once the submission folder is written:
# the study (named after round 1's folder) in the journal holds this round's
# trials and they are the folder's manifest; bayes.json records what the
# controller needs (ARGV: the submitter's, replayed for the next round).
bayes_start() {
  [[ -n "${bayes_first:-}" ]] || return 0
  local python round=${HPC_BAYES_ROUND:-1}
  bayes_study=$(study_name)
  python=$(login_python)
  PYTHONPATH=$(hpc_tools_path) "$python" -m hpc_tools.bayes start --submission "$submission_dir" \
    --journal "$(bayes_journal)" --study "$bayes_study" --round "$round" \
    --rounds "${opt_rounds:-1}" --trials "$opt_trials" --sweep-seed "$opt_sweep_seed" \
    --cwd "$PWD" -- "$HPC_FILES_DIR/job_submitter.sh" "$@" ||
    die "method bayes: cannot record round $round in $(bayes_journal)"
}

# submit_bayes_controller: method bayes: a one-CPU job that runs after the
# round's array job ends (afterany), tells Optuna the round's results and
# submits the next round (the last round's only records the best trial).
submit_bayes_controller() {
  [[ -n "${bayes_first:-}" ]] || return 0
  local python output wrap log_dir=${plan_log_dir//%/%%}
  local -a args=(--parsable --dependency="afterany:$job_id" --job-name="${plan_job_name}_bayes"
    --output="$log_dir/${plan_job_name}_bayes_%j.out" --ntasks=1 --cpus-per-task=1 --time=00:30:00)
  [[ -z "$plan_account" ]] || args+=(--account="$plan_account")
  [[ -z "$plan_partition" ]] || args+=(--partition="$plan_partition")
  python=$(login_python)
  # From hpc_files/ (python -m finds hpc_tools there), not on PYTHONPATH: the
  # submitter it runs for the next round passes its environment to those jobs.
  wrap="$(shell_quote cd "$HPC_FILES_DIR") && exec $(shell_quote "$python" -m hpc_tools.bayes controller --submission "$submission_dir" --project "$project_name")"
  output=$(sbatch_from_submission "${args[@]}" --wrap="$wrap") ||
    die "sbatch refused the method-bayes controller job (round job $job_id is queued; run: $wrap): ${output//$'\n'/ }"
  bayes_controller_id=${output%%;*}
  printf '%s\n' "$bayes_controller_id" >"$submission_dir/bayes_controller_job_id"
  info "bayes: round ${HPC_BAYES_ROUND:-1} of ${opt_rounds:-1}; controller job $bayes_controller_id runs after job $job_id"
}
