# shellcheck shell=bash
# Checks every setting before anything is written or submitted. Each refusal
# names the option, the value and what would be accepted, and exits 2.
# Sourced; functions only.

# require_uint OPTION VALUE MIN [MAX]
require_uint() {
  local option=$1 value=$2 min=$3 max=${4:-}
  is_uint "$value" || usage_error "$option expects a whole number, got '$value'"
  ((${#value} <= 9)) || usage_error "$option is out of range, got '$value'"
  value=$((10#$value))
  ((value >= min)) || usage_error "$option must be at least $min, got '$value'"
  if [[ -n "$max" ]] && ((value > max)); then
    usage_error "$option must be at most $max, got '$value'"
  fi
}

# require_one_of OPTION VALUE CHOICE...
require_one_of() {
  local option=$1 value=$2 choice
  shift 2
  for choice in "$@"; do
    [[ "$value" == "$choice" ]] && return 0
  done
  usage_error "$option expects one of: $*; got '$value'"
}

# require_name OPTION VALUE: a plain name safe in paths, job names and scripts.
require_name() {
  local option=$1 value=$2
  [[ -n "$value" ]] || usage_error "$option expects a name, got ''"
  ((${#value} <= 100)) || usage_error "$option is longer than 100 characters"
  [[ "$value" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] ||
    usage_error "$option accepts letters, digits, '.', '_' and '-' (not first), got '$value'"
}

# validate_array_size TRIALS: the cluster's MaxArraySize (scontrol show
# config) into cluster_max_array, asked only for an array: array indices must
# be below it. An array above it goes as several (plan_array_split), but for
# method bayes, whose rounds number their tasks by global trial: refused.
# When scontrol gives no answer within 10 s (no cluster here: without a
# slurm.conf it waits about a minute on DNS), cluster_max_array stays empty
# and sbatch decides.
validate_array_size() {
  local trials=$1 config max
  cluster_max_array=""
  ((trials > 1)) || [[ -n "${bayes_first:-}" ]] || return 0
  config=$(timeout 10 scontrol show config 2>/dev/null) || return 0
  max=$(sed -n 's/^MaxArraySize[[:space:]]*=[[:space:]]*//p' <<<"$config")
  [[ "$max" =~ ^[0-9]{1,9}$ ]] || return 0
  max=$((10#$max))
  cluster_max_array=$max
  [[ -n "${bayes_first:-}" ]] || return 0
  ((trials <= max)) ||
    usage_error "this method-bayes round has trials up to $((trials - 1)) (its array indices) but the cluster's MaxArraySize is $max (indices up to $((max - 1))); lower --trials or --rounds"
}

# parse_slurm_time VALUE: seconds, or nothing when VALUE is not a SLURM
# time. Accepted: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
parse_slurm_time() {
  local value=$1 days=0 h=0 m=0 s=0
  if [[ "$value" =~ ^([0-9]{1,4})-([0-9]{1,2})(:([0-9]{1,2}))?(:([0-9]{1,2}))?$ ]]; then
    days=${BASH_REMATCH[1]} h=${BASH_REMATCH[2]} m=${BASH_REMATCH[4]:-0} s=${BASH_REMATCH[6]:-0}
  elif [[ "$value" =~ ^([0-9]{1,6})(:([0-9]{1,2}))?$ ]]; then
    m=${BASH_REMATCH[1]} s=${BASH_REMATCH[3]:-0}
  elif [[ "$value" =~ ^([0-9]{1,4}):([0-9]{1,2}):([0-9]{1,2})$ ]]; then
    h=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
  else
    return 0
  fi
  days=$((10#$days)) h=$((10#$h)) m=$((10#$m)) s=$((10#$s))
  # With a day count the hours are hours of a day; alone, minutes may exceed 59.
  ((s < 60 && (m < 60 || (days == 0 && h == 0)))) || return 0
  [[ "$value" != *-* ]] || ((h < 24)) || return 0
  printf '%s' $((((days * 24 + h) * 60 + m) * 60 + s))
}

# parse_memory_mb VALUE: MiB, or nothing when VALUE is not a SLURM size
# (a whole number with an optional K, M, G or T suffix, either case).
parse_memory_mb() {
  local value=$1 number unit
  # SLURM takes the suffixes in either case (10g is 10G).
  [[ "$value" =~ ^([0-9]{1,9})([KMGTkmgt]?)$ ]] || return 0
  number=$((10#${BASH_REMATCH[1]}))
  unit=${BASH_REMATCH[2]:-M}
  case "${unit^^}" in
    K) printf '%s' $(((number + 1023) / 1024)) ;;
    M) printf '%s' "$number" ;;
    G) printf '%s' $((number * 1024)) ;;
    T) printf '%s' $((number * 1024 * 1024)) ;;
  esac
}

# validate_scratch: SCRATCH is an absolute path, and the project folder under
# it a name, that the scripts can quote.
validate_scratch() {
  [[ -n "${SCRATCH:-}" ]] || usage_error "SCRATCH is not set; export SCRATCH=/path/to/your/scratch (the toolkit keeps logs, checkpoints and data under \$SCRATCH/<project>)"
  [[ "$SCRATCH" == /* ]] || usage_error "SCRATCH must be an absolute path, got '$SCRATCH'"
  [[ "$SCRATCH" != *$'\n'* ]] || usage_error "SCRATCH must not contain a newline"
  [[ "$SCRATCH" != *[\"\\]* ]] || usage_error "SCRATCH must not contain '\"' or '\\' (the log path goes in a quoted #SBATCH line), got '$SCRATCH'"
  [[ "$project_name" != *[\"\\]* && "$project_name" != *$'\n'* ]] ||
    usage_error "the project folder's name must not contain '\"', '\\' or a newline (it goes in quoted #SBATCH lines), got '$project_name'; rename the folder"
}

# validate_settings: every option, as given or defaulted, and the site's
# limits; exit 2 at the first problem. Sets valid_time_seconds and
# valid_mem_per_gpu_mb, --time and --mem-per-gpu as numbers, for the plan.
validate_settings() {
  local seconds mb lead
  validate_scratch
  require_uint --gpus "$opt_gpus" 0 "${site_max_gpus_per_node:-64}"
  require_uint --cpus "$opt_cpus" 1 1024
  require_uint --num-nodes "$opt_nodes" 1 "${site_max_nodes:-4096}"
  require_one_of --which-distributed "$opt_kind" lightning torchrun script none
  require_name --exp-name "$opt_exp_name"
  [[ "$opt_exp_name" != hpc_outputs ]] ||
    usage_error "--exp-name 'hpc_outputs' is the folder of the job logs under \$SCRATCH/<project>; pick another name"
  # results.py find_submission tries such a target as a job id first: once a
  # job with that id exists, the experiment could not be named.
  [[ ! "$opt_exp_name" =~ ^[0-9]+(_[0-9]+)?$ ]] ||
    usage_error "--exp-name '$opt_exp_name' reads as a job id to status.sh and results.sh (digits, or DIGITS_DIGITS for an array task); add a letter, e.g. 'exp$opt_exp_name'"
  seconds=$(parse_slurm_time "$opt_time")
  [[ -n "$seconds" ]] ||
    usage_error "--time expects a SLURM time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), got '$opt_time'"
  ((seconds > 0)) || usage_error "--time must be longer than zero, got '$opt_time'"
  mb=$(parse_memory_mb "$opt_mem_per_gpu")
  [[ -n "$mb" ]] ||
    usage_error "--mem-per-gpu expects a size such as 10G, 512M, 2048 (MiB) or 1T, got '$opt_mem_per_gpu'"
  ((mb > 0)) || usage_error "--mem-per-gpu must be more than zero, got '$opt_mem_per_gpu'"
  valid_time_seconds=$seconds
  valid_mem_per_gpu_mb=$mb
  validate_signal
  [[ -z "${opt_wandb_sync:-}" ]] || require_one_of --wandb-sync "$opt_wandb_sync" login none
  require_uint --signal-lead "$opt_signal_lead" 1 65535
  [[ -n "${opt_no_signal:-}${opt_interactive:-}" || -n "${OPT_GIVEN[signal_lead]:-}" ]] || fit_default_signal_lead "$seconds"
  lead=$((10#$opt_signal_lead))
  if [[ -z "${opt_no_signal:-}${opt_interactive:-}" ]]; then
    ((lead < seconds)) ||
      usage_error "--signal-lead ($lead s) must be shorter than --time ($opt_time = $seconds s)"
    # slurmctld sends the signal at its time-limit check (every 30 s) once the
    # time left is under lead + 30 s: with less than a minute between the two,
    # that can be the first check, before the batch step has started, and the
    # signal is lost (seen on the local cluster: a 1 min job with a 50 s lead).
    ((seconds - lead >= 60)) ||
      usage_error "--signal-lead ($lead s) must leave at least 60 s of --time ($opt_time = $seconds s): SLURM may send it up to 30 s early, before the job has started"
  fi
  require_uint --max-requeues "$opt_max_requeues" 0 1000

  validate_gpu_type
  validate_experiment_source
  validate_kind_layout
  validate_optional_settings
  validate_submission_mode
}

# Below this lead the program has no time to checkpoint at the signal.
readonly MIN_SIGNAL_LEAD=10

# fit_default_signal_lead SECONDS: a --time of SECONDS too short for the
# default lead (it must leave 60 s, see below) gets the longest lead that
# fits (in opt_signal_lead), or no wall-time signal at all (opt_no_signal);
# said in one line. Called for the default lead only, never an explicit one.
# Sets the options, so it runs in the caller's shell, never in $(...).
fit_default_signal_lead() {
  local fitted=$(($1 - 60))
  ((fitted < 10#$opt_signal_lead)) || return 0
  if ((fitted >= MIN_SIGNAL_LEAD)); then
    info "--time $opt_time leaves no room for the default $DEFAULT_SIGNAL_LEAD s signal lead; the wall-time signal comes $fitted s before the end (--signal-lead sets it)"
    opt_signal_lead=$fitted
  else
    info "--time $opt_time is too short for a wall-time signal (it needs $((60 + MIN_SIGNAL_LEAD)) s or more); the job runs without one, as with --no-signal"
    opt_no_signal=1
  fi
}

# validate_interactive: --interactive runs one trial in the foreground,
# without the wall-time signal and requeue of a batch job.
validate_interactive() {
  local pair
  [[ -n "${opt_interactive:-}" ]] || return 0
  for pair in no_submit:--no-submit wait:--wait setup_venv:--setup-venv wandb_sweep:-w \
    signal:--signal signal_lead:--signal-lead no_signal:--no-signal max_requeues:--max-requeues \
    seeds:--seeds array_throttle:--array-throttle; do
    [[ -z "${OPT_GIVEN[${pair%%:*}]:-}" ]] ||
      usage_error "--interactive runs one trial now, in the foreground; it does not take ${pair#*:}"
  done
}

# validate_interactive_trials COUNT: --interactive runs one trial, of no search.
validate_interactive_trials() {
  [[ -n "${opt_interactive:-}" ]] || return 0
  [[ -z "${bayes_first:-}" ]] || usage_error "--interactive runs one trial; method bayes submits rounds of them"
  (($1 == 1)) ||
    usage_error "--interactive runs one trial, and this submission has $1: give one command after '--', or a configs file of one line"
}

# validate_signal: one signal the batch script can trap and forward (not
# TERM: SLURM sends it for preemption and scancel), or none at all.
validate_signal() {
  require_one_of --signal "${opt_signal#SIG}" USR1 USR2 HUP INT QUIT URG
  if [[ -n "${opt_no_signal:-}" ]]; then
    [[ -z "${OPT_GIVEN[signal]:-}" && -z "${OPT_GIVEN[signal_lead]:-}" ]] ||
      usage_error "--no-signal sends no wall-time signal; drop --signal/--signal-lead"
  fi
}

validate_gpu_type() {
  [[ -n "${opt_gpu_type:-}" ]] || return 0
  require_name --gpu-type "$opt_gpu_type"
  ((10#$opt_gpus > 0)) || usage_error "--gpu-type '$opt_gpu_type' needs --gpus of at least 1"
  if [[ -n "${site_gpu_types:-}" && ",${site_gpu_types// /}," != *",$opt_gpu_type,"* ]]; then
    usage_error "--gpu-type '$opt_gpu_type' is not offered by site '$site_name' (offered: $site_gpu_types)"
  fi
}

validate_kind_layout() {
  local kind
  kind=$(plan_kind_of)
  # A wandb sweep task is one agent process that starts each run itself.
  [[ -z "${opt_wandb_sweep:-}" || -z "${OPT_GIVEN[kind]:-}" || "$opt_kind" == none ]] ||
    usage_error "-w/--wandb-sweepid runs one 'wandb agent' per task, which starts the runs itself; drop -W $opt_kind"
  require_uint --tasks-per-node "$opt_tasks_per_node" 1 1024
  if [[ -n "${OPT_GIVEN[tasks_per_node]:-}" ]] && ((10#$opt_gpus > 0)); then
    usage_error "--tasks-per-node applies to CPU-only runs (--gpus 0); with GPUs there is one process per GPU"
  fi
  [[ -z "${OPT_GIVEN[tasks_per_node]:-}" || "$kind" != none ]] ||
    usage_error "--tasks-per-node does not apply to -W none, which runs one process; use -W lightning or -W torchrun"
  [[ "$kind" != none ]] || ((10#$opt_nodes == 1)) ||
    usage_error "-W none runs one process on one node, got --num-nodes $((10#$opt_nodes)); use -W torchrun or -W lightning for several nodes"
  case "${opt_pass_local_rank:-}" in
    "" | 1 | hyphen | underscore) ;;
    *) usage_error "--pass-local-rank expects hyphen (--local-rank=N) or underscore (--local_rank=N), got '$opt_pass_local_rank'" ;;
  esac
  if [[ -n "${opt_pass_local_rank:-}" && "$kind" != torchrun ]]; then
    usage_error "--pass-local-rank only applies to -W torchrun/script (torchrun starts the processes), got -W $kind"
  fi
}

validate_experiment_source() {
  local sources=0
  [[ -n "${opt_wandb_sweep:-}" ]] && sources=$((sources + 1))
  [[ -n "${opt_sweep:-}" ]] && sources=$((sources + 1))
  ((${#opt_command[@]} > 0)) && sources=$((sources + 1))
  ((sources <= 1)) || usage_error "choose one of -w/--wandb-sweepid, --sweep and '-- COMMAND'"
  ((sources == 0)) || [[ -z "${OPT_GIVEN[configs]:-}" ]] ||
    usage_error "-C/--configs names the experiments, and so do -w/--wandb-sweepid, --sweep and '-- COMMAND'; give only one"

  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    [[ "$opt_wandb_sweep" =~ ^[A-Za-z0-9_-]+(/[A-Za-z0-9_.-]+/[A-Za-z0-9_-]+)?$ ]] ||
      usage_error "--wandb-sweepid expects ID or ENTITY/PROJECT/ID (letters, digits, '_', '-'), got '$opt_wandb_sweep'"
    ((10#$opt_nodes == 1)) || usage_error "a wandb sweep runs one agent per array task on one node; got --num-nodes $((10#$opt_nodes))"
    [[ -z "${opt_seeds:-}" ]] || usage_error "--seeds does not apply to a wandb sweep (the sweep chooses the runs)"
    if [[ -z "${opt_sweep_count:-}" ]]; then
      [[ -z "${opt_list_trials:-}" && -z "${opt_dry_run:-}" ]] ||
        usage_error "--sweep-count is required with --wandb-sweepid for --dry-run and --list-trials"
      usage_error "--sweep-count is required with --wandb-sweepid when not run from a terminal"
    fi
    require_uint --sweep-count "$opt_sweep_count" 1 100000
  elif [[ -n "${opt_sweep_count:-}" ]]; then
    usage_error "--sweep-count only applies with -w/--wandb-sweepid (for --sweep, use --trials)"
  fi

  if [[ -n "${opt_sweep:-}" ]]; then
    [[ -f "$opt_sweep" ]] || usage_error "--sweep file '$opt_sweep' does not exist"
    [[ -r "$opt_sweep" ]] || usage_error "--sweep file '$opt_sweep' is not readable"
    if [[ -n "${opt_trials:-}" ]]; then
      require_uint --trials "$opt_trials" 1 100000
    fi
    require_uint --sweep-seed "$opt_sweep_seed" 0
    [[ -z "${opt_rounds:-}" ]] || require_uint --rounds "$opt_rounds" 1 10000
  else
    [[ -z "${opt_trials:-}" ]] || usage_error "--trials only applies with --sweep"
    [[ -z "${opt_rounds:-}" ]] || usage_error "--rounds only applies with --sweep (method bayes)"
    [[ -z "${OPT_GIVEN[sweep_seed]:-}" ]] || usage_error "--sweep-seed only applies with --sweep"
  fi

  if [[ -n "${opt_seeds:-}" ]]; then
    require_uint --seeds "$opt_seeds" 1 10000
  fi

  if [[ -z "${opt_wandb_sweep:-}" && -z "${opt_sweep:-}" && ${#opt_command[@]} -eq 0 ]]; then
    [[ -f "$opt_configs" ]] || usage_error "--configs file '$opt_configs' does not exist (or put the command after '--')"
    [[ -r "$opt_configs" ]] || usage_error "--configs file '$opt_configs' is not readable"
  fi
}

validate_optional_settings() {
  local module word owner
  if [[ -n "${opt_account:-}" ]]; then
    [[ "$opt_account" =~ ^[A-Za-z0-9_.-]+$ ]] || usage_error "--account accepts letters, digits, '.', '_', '-', got '$opt_account'"
  fi
  if [[ -n "${opt_partition:-}" ]]; then
    [[ "$opt_partition" =~ ^[A-Za-z0-9_.,-]+$ ]] || usage_error "--partition accepts letters, digits, '.', '_', '-', ',', got '$opt_partition'"
  fi
  if [[ -n "${opt_array_throttle:-}" ]]; then
    require_uint --array-throttle "$opt_array_throttle" 1 100000
  fi
  if [[ -n "${opt_dependency:-}" ]]; then
    [[ "$opt_dependency" =~ ^[a-z_]+(:[0-9_+*]+)*([,?][a-z_]+(:[0-9_+*]+)*)*$ ]] ||
      usage_error "--dependency expects a SLURM dependency such as afterok:123 or singleton, got '$opt_dependency'"
  fi
  if [[ -n "${opt_modules:-}" ]]; then
    [[ "$opt_modules" != *$'\n'* ]] || usage_error "--modules must not contain a newline (separate module names with spaces)"
    for module in $opt_modules; do
      [[ "$module" =~ ^[A-Za-z0-9_./+-]+$ ]] || usage_error "--modules accepts module names (letters, digits, '_', '.', '/', '+', '-'), got '$module'"
    done
  fi
  require_one_of --compress "$opt_compress" none zstd pigz
  if [[ "$opt_compress" != none ]]; then
    command -v "$opt_compress" >/dev/null || usage_error "--compress $opt_compress needs '$opt_compress' on this machine and on the nodes"
    # A warning, not a refusal: the job is fine, the option only does nothing.
    # Only when the command line gave it (OPT_GIVEN), never for a default.
    [[ -z "${OPT_GIVEN[compress]:-}" || ${#opt_data[@]} -gt 0 ]] ||
      warn "--compress $opt_compress compresses the data tarball of -d, and there is no -d: nothing is compressed"
  fi
  if [[ -n "${opt_stage_out:-}" ]]; then
    [[ "$opt_stage_out" =~ ^[A-Za-z0-9_][A-Za-z0-9._/-]*$ && "/$opt_stage_out/" != */../* ]] ||
      usage_error "--stage-out expects a folder relative to \$SLURM_TMPDIR (no '..'), got '$opt_stage_out'"
  fi
  if [[ -n "${opt_setup_venv:-}" ]]; then
    [[ -f "$opt_setup_venv" && -r "$opt_setup_venv" ]] ||
      usage_error "--setup-venv expects a readable requirements file, got '$opt_setup_venv'"
    [[ -z "${opt_container:-}" ]] || usage_error "--setup-venv builds a virtualenv; it does not apply with -s (a container)"
    if [[ -n "${opt_dependency:-}" && "$opt_dependency" == *'?'* ]]; then
      usage_error "--setup-venv adds 'afterok:<setup job>' to --dependency, which cannot be combined with '?' (any-of) dependencies"
    fi
  elif [[ -n "${opt_venv:-}" ]]; then
    [[ -x "$opt_venv/bin/python" || -x "$opt_venv/bin/python3" ]] ||
      usage_error "--venv '$opt_venv' has no bin/python"
  fi
  if [[ -n "${opt_container:-}" ]]; then
    [[ -f "$opt_container" ]] || usage_error "--singularity-container '$opt_container' does not exist"
    [[ -r "$opt_container" ]] || usage_error "--singularity-container '$opt_container' is not readable"
  fi
  for word in ${opt_sbatch_arg[@]+"${opt_sbatch_arg[@]}"}; do
    [[ "$word" == -* ]] || usage_error "--sbatch-arg expects an sbatch option starting with '-', got '$word'"
    owner=$(sbatch_option_owner "$word")
    # The same value as the submitter's is accepted (plan_repeated_options).
    [[ -z "$owner" ]] || sbatch_option_planned "$word" ||
      usage_error "--sbatch-arg=$word sets what the submitter sets itself; $owner"
    [[ "$word" != *$'\n'* ]] || usage_error "--sbatch-arg must not contain a newline"
    # The #SBATCH line quotes the value in double quotes, which cannot nest.
    [[ "$word" != *'"'* && "$word" != *\\* ]] ||
      usage_error "--sbatch-arg must not contain '\"' or '\\' (sbatch does not unescape #SBATCH lines), got '$word'"
  done
}

# validate_submission_mode: --dry-run previews, --no-submit writes without
# queueing, --interactive runs one trial now; none can be followed by what only
# a queued job has.
validate_submission_mode() {
  validate_interactive
  if [[ -n "${opt_no_submit:-}" ]]; then
    [[ -z "${opt_dry_run:-}" ]] || usage_error "--no-submit writes the submission folder and --dry-run writes nothing; choose one"
    [[ -z "${opt_wait:-}" ]] || usage_error "--wait follows a queued job; with --no-submit nothing is queued (run the printed sbatch line, then watch it)"
    [[ -z "${opt_setup_venv:-}" ]] ||
      usage_error "--setup-venv submits a setup job the training job depends on; with --no-submit build the venv first (or use --venv)"
  fi
}
