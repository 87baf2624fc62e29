# shellcheck shell=bash
# Command-line options of job_submitter.sh: the table of spellings, the parser
# and the help text beside it. Sourced; defines functions and the tables only.
# Parsed values land in opt_<name> variables; which ones the user gave is in
# OPT_GIVEN, so a site profile fills in only what the command line left open.

HPC_VERSION="0.1.0"

# Built-in defaults (the seed toolkit's, where it had them).
readonly DEFAULT_GPUS=1
readonly DEFAULT_CPUS=2
readonly DEFAULT_KIND=lightning
readonly DEFAULT_TIME=00-01:00:00
readonly DEFAULT_MEM_PER_GPU=10G
readonly DEFAULT_EXP_NAME=default
readonly DEFAULT_NODES=1
readonly DEFAULT_SIGNAL_LEAD=90
readonly DEFAULT_MAX_REQUEUES=10
readonly DEFAULT_SITE=generic
readonly DEFAULT_COMPRESS=none
readonly DEFAULT_SIGNAL=USR1
readonly DEFAULT_TASKS_PER_NODE=1
readonly DEFAULT_WANDB_SYNC=none

# Every spelling of an option that takes a value -> the setting it sets.
declare -A OPTION_SETTING=(
  [-a]=account [--account]=account
  [-g]=gpus [--gpus]=gpus
  [-c]=cpus [--cpus]=cpus [--cpu]=cpus
  [-W]=kind [--which-distributed]=kind
  [-t]=time [--time]=time
  [-m]=mem_per_gpu [--mem-per-gpu]=mem_per_gpu
  [-G]=gpu_type [--gpu-type]=gpu_type
  [-e]=exp_name [--exp-name]=exp_name
  [-w]=wandb_sweep [--wandb-sweepid]=wandb_sweep
  [--wandb-sync]=wandb_sync
  [-n]=nodes [-N]=nodes [--num-nodes]=nodes [--num_nodes]=nodes [--nodes]=nodes
  [-s]=container [--singularity-container]=container
  [-C]=configs [--configs]=configs
  [-p]=partition [--partition]=partition
  [-d]=data [--data]=data
  [--sweep]=sweep
  [--trials]=trials
  [--rounds]=rounds
  [--sweep-seed]=sweep_seed
  [--sweep-count]=sweep_count
  [--array-throttle]=array_throttle
  [--seeds]=seeds
  [--signal-lead]=signal_lead
  [--signal]=signal
  [--tasks-per-node]=tasks_per_node
  [--max-requeues]=max_requeues
  [--dependency]=dependency
  [--modules]=modules
  [--site]=site
  [--venv]=venv
  [--setup-venv]=setup_venv
  [--stage-out]=stage_out
  [--compress]=compress
  [--sbatch-arg]=sbatch_arg
  [--retry-failed]=retry_failed
)

# Options without a value -> the setting they turn on.
declare -A FLAG_SETTING=(
  [--dry-run]=dry_run
  [--no-submit]=no_submit
  [--no-snapshot]=no_snapshot
  [--no-signal]=no_signal
  [--prune-data-cache]=prune_data_cache
  [--wait]=wait
  [--interactive]=interactive
  [--after-running]=after_running
  [--list-trials]=list_trials
  [--pass-local-rank]=pass_local_rank
  [-h]=help [--help]=help
  [--version]=version
)

# Settings that may be given several times (values accumulate).
declare -A REPEATABLE_SETTING=([data]=1 [sbatch_arg]=1)

# Filled by parse_options.
declare -A OPT_GIVEN=()
opt_data=()
opt_sbatch_arg=()
opt_command=()

print_help() {
  cat <<HELP
Usage: job_submitter.sh [options] [-- COMMAND [ARG...]]

Renders one SLURM batch script for a PyTorch training run and submits it with
sbatch. Experiments come from the configs file (one command per line; several
lines become an array job), from --sweep, from a wandb sweep id, or from the
command after '--'. Options take '--opt value' or '--opt=value'.

Resources:
  -n, -N, --num-nodes, --num_nodes, --nodes N
                              nodes per run (default: $DEFAULT_NODES)
  -g, --gpus G                GPUs per node; 0 = CPU-only (default: $DEFAULT_GPUS)
  --tasks-per-node K          with --gpus 0: processes per node (Lightning tasks or
                              torchrun workers; default: $DEFAULT_TASKS_PER_NODE)
  -c, --cpus, --cpu C         CPUs per GPU, or per task when --gpus 0 (default: $DEFAULT_CPUS)
  -m, --mem-per-gpu SIZE      memory per GPU, e.g. 10G, 512M (default: $DEFAULT_MEM_PER_GPU)
  -G, --gpu-type TYPE         GPU type in --gres (e.g. v100l); checked against the site
  -t, --time TIME             wall time in any SLURM format: MM, MM:SS, HH:MM:SS,
                              D-HH, D-HH:MM, D-HH:MM:SS (default: $DEFAULT_TIME)
  -W, --which-distributed KIND
                              lightning: one task per GPU started by srun (default)
                              torchrun:  one task per node running torchrun
                              script:    same as torchrun (the PyTorch launcher route)
                              none:      one process on one node, no launcher
  -a, --account ACCOUNT       SLURM account (default: the site's)
  -p, --partition PARTITION   SLURM partition (default: the site's)
  --site NAME|FILE            site profile (default: \$HPC_SITE, else $DEFAULT_SITE);
                              NAME means hpc_files/sites/NAME.conf
  --modules "MOD..."          environment modules to load on the nodes (default: the
                              site's; --modules '' loads none)
  --sbatch-arg ARG            pass ARG to sbatch as an #SBATCH line (repeatable); not
                              what the options here set (--time, --signal, --requeue,
                              --array, --dependency, --job-name, --output, --export,
                              --nodes, --ntasks*, --cpus-per-*, --gres=gpu*, --gpus*,
                              --mem-per-*, --partition, --account, or a prefix
                              of one, which sbatch takes too); --mem=SIZE
                              replaces the memory per node, another --gres joins
                              the job's --gres line
  --dependency SPEC           sbatch --dependency, e.g. afterok:123
  --after-running             queue behind the experiment's queued or running jobs
                              (afterany); without it a submission to an experiment
                              with such jobs is refused (hpc_files/stop.sh EXP stops them)

Experiments:
  -C, --configs FILE          experiment lines (default: hpc_files/experiment_configurations.txt
                              if present, else experiment_configurations.txt)
  -e, --exp-name NAME         experiment name: folders \$scratch_dir/NAME/ and the job name
                              (letters, digits, '.', '_', '-', not digits alone: those
                              name a job id in status.sh; default: $DEFAULT_EXP_NAME)
  --seeds N                   run every experiment N times, adding --seed=0..N-1
  --sweep FILE                expand a wandb-format sweep file (grid or random)
                              offline into one array job (see sweeper.yml); method
                              bayes: rounds of array jobs driven by Optuna (TPE)
  --trials N                  number of random-search trials (with --sweep);
                              method bayes: trials per round
  --rounds R                  method bayes: number of rounds (default: 1); after each,
                              a CPU job tells Optuna the results and submits the next
  --sweep-seed S              seed of the random search (default: 0)
  -w, --wandb-sweepid ID      run a wandb sweep (ID or ENTITY/PROJECT/ID): an array
                              job, one 'wandb agent --count 1' per task
  --sweep-count K             array tasks for a wandb sweep (asked for when stdin
                              is a terminal, otherwise required)
  --array-throttle K          at most K array tasks at once (default: the site's)
  --list-trials               print the trials as JSON lines and exit
  --retry-failed EXP          rerun the failed trials (not finished, pruned, queued or
                              running) of EXP's last submission, from its code snapshot
                              and data tarball, each in its own trial folder; takes
                              only --after-running and --dry-run beside it

Data and environment:
  -d, --data PATH...          files or folders relative to \$SCRATCH/<project>, staged
                              as one cached tarball into \$SLURM_TMPDIR on every node
                              (repeatable; several paths may follow one flag)
  --compress none|zstd|pigz   compress the data tarball (default: $DEFAULT_COMPRESS)
  --prune-data-cache          remove the cached data tarballs of \$SCRATCH/<project>
                              that no submission folder names, then exit
  --stage-out DIR             copy \$SLURM_TMPDIR/DIR back to the result folder
                              (\$scratch_dir/<exp>/DIR; array task K: <exp>/trials/K/DIR;
                              several nodes: DIR/<node>) at the end and before a requeue
  --venv PATH                 virtualenv (or conda/uv env) to run in (default: the
                              project's .venv if present)
  --setup-venv REQUIREMENTS   first run a setup job that creates/updates the venv
                              from this requirements file (only when the file
                              changed since the last setup); the job waits for it.
                              Where the site says compute_internet = no, it runs
                              here, on the login node, before the job is queued
  -s, --singularity-container IMAGE
                              run inside this Singularity/Apptainer image
  --wandb-sync login|none     login: the job's W&B runs offline and, after each log,
                              leaves a trigger in \$scratch_dir/<exp>/wandb_osh (the
                              job's HPC_WANDB_SYNC_DIR); 'bash hpc_files/wandb_sync.sh
                              EXP' on the login node uploads the runs live (wandb-osh)
                              (default: the site's wandb_sync, else $DEFAULT_WANDB_SYNC)
  --pass-local-rank, --pass-local-rank=underscore|hyphen
                              append --local-rank=N to the program's arguments
                              (underscore: --local_rank=N, as programs written for
                              torch.distributed.launch parse it; hyphen: the default)

Wall time and requeue:
  --signal SIG                the wall-time signal: USR1, USR2, HUP, INT, QUIT or URG
                              (default: $DEFAULT_SIGNAL; the program checkpoints on it)
  --signal-lead SECONDS       send it this long before the wall time, at most --time - 60 s
                              (a shorter --time lowers the default, or drops the signal
                              below 70 s; default: $DEFAULT_SIGNAL_LEAD)
  --no-signal                 send no wall-time signal: the program runs to the wall
                              time (for programs that do not checkpoint on a signal)
  --max-requeues N            requeue at most N times (default: $DEFAULT_MAX_REQUEUES)

Behaviour:
  --dry-run                   preview the batch script; write and submit nothing
  --no-submit                 write the complete submission folder (script, code
                              snapshot, data tarball) but queue nothing; the last
                              line printed is the 'sbatch .../job.sbatch' to run,
                              from any directory, now or later, as often as wanted
  --no-snapshot               run the live project tree instead of the snapshot of
                              its code taken at submission (the default)
  --wait                      follow the job until it ends; exit with its exit code
  --interactive               run it now in an salloc allocation, its output on this
                              terminal: the batch script's layout, staging, environment
                              and launcher; Ctrl-C ends the program (the node-local
                              folders are cleaned, the allocation released). One
                              trial; no wall-time signal or requeue; exits with its code
  -h, --help                  this help
  --version                   print the version

Paths: FILE, REQUIREMENTS, IMAGE and --venv's PATH relative to the current
directory, else to the project (the folder holding hpc_files/), so that
'cd hpc_files && bash job_submitter.sh --sweep sweeper.yml' finds the
project's sweeper.yml; -d paths relative to \$SCRATCH/<project>.

Environment: SCRATCH (required), HPC_SITE, HPC_PYTHON (the python that expands
trials and sweeps on this machine; default: the --venv's python, else the
project's .venv, else python3), HPC_SNAPSHOT_MAX_MB (the largest code snapshot
taken, in MiB; default 200).
HELP
}

# looks_like_option WORD: would WORD be read as an option rather than a value?
# Negative numbers ('-1') are values, so they reach validation and its message.
looks_like_option() {
  [[ "$1" =~ ^-[A-Za-z-] ]]
}

# set_setting NAME VALUE SPELLING: store a value; a repeatable setting
# accumulates, any other refuses a second, different value.
set_setting() {
  local name=$1 value=$2 spelling=$3 current
  # An empty value would silently become the default; nobody means that.
  # Except --modules '': load none, not even the site's.
  [[ -n "$value" || "$name" == modules ]] || usage_error "$spelling expects a value, got an empty string"
  if [[ -n "${REPEATABLE_SETTING[$name]:-}" ]]; then
    eval "opt_${name}+=(\"\$value\")"
    OPT_GIVEN[$name]=1
    return 0
  fi
  if [[ -n "${OPT_GIVEN[$name]:-}" ]]; then
    current=$(eval "printf '%s' \"\$opt_${name}\"")
    [[ "$current" == "$value" ]] ||
      usage_error "$spelling given twice with different values ('$current' and '$value')"
  fi
  printf -v "opt_${name}" '%s' "$value"
  OPT_GIVEN[$name]=1
}

# parse_options ARG...: fills opt_* and OPT_GIVEN. Usage errors exit 2.
parse_options() {
  local arg spelling value name
  while (($# > 0)); do
    arg=$1
    shift
    case "$arg" in
      --)
        (($# > 0)) || usage_error "'--' must be followed by a command"
        for value in "$@"; do
          # commands.txt holds one experiment per line.
          [[ "$value" != *$'\n'* ]] ||
            usage_error "a word after '--' contains a newline; put such a command in a --configs file or a script"
        done
        opt_command=("$@")
        OPT_GIVEN[command]=1
        return 0
        ;;
      --*=*)
        spelling=${arg%%=*}
        value=${arg#*=}
        if [[ "$spelling" == --pass-local-rank ]]; then
          # A flag with an optional spelling (checked in validate.sh).
          set_setting pass_local_rank "$value" "$spelling"
          continue
        fi
        [[ -z "${FLAG_SETTING[$spelling]:-}" ]] || usage_error "$spelling takes no value (got '$arg')"
        name=${OPTION_SETTING[$spelling]:-}
        [[ -n "$name" ]] || usage_error "unknown option '$spelling' (see --help)"
        set_setting "$name" "$value" "$spelling"
        ;;
      -?*)
        if [[ -n "${FLAG_SETTING[$arg]:-}" ]]; then
          printf -v "opt_${FLAG_SETTING[$arg]}" '%s' 1
          OPT_GIVEN[${FLAG_SETTING[$arg]}]=1
          continue
        fi
        name=${OPTION_SETTING[$arg]:-}
        [[ -n "$name" ]] || usage_error "unknown option '$arg' (see --help)"
        # --sbatch-arg passes sbatch options, which all start with '-'.
        if (($# == 0)) || { [[ "$name" != sbatch_arg ]] && looks_like_option "$1"; }; then
          usage_error "$arg expects a value"
        fi
        set_setting "$name" "$1" "$arg"
        shift
        # -d/--data takes several paths after one flag, up to the next option.
        if [[ "$name" == data ]]; then
          while (($# > 0)) && [[ "$1" != -* ]]; do
            set_setting data "$1" "$arg"
            shift
          done
        fi
        ;;
      *)
        usage_error "unexpected argument '$arg' (options start with '-'; put a command after '--')"
        ;;
    esac
  done
}

# apply_defaults: built-in defaults for what the command line left open, and
# the project's configs file when no other experiments are named. (The site
# profile's defaults are others: account, partition, modules, array throttle.)
apply_defaults() {
  : "${opt_gpus:=$DEFAULT_GPUS}"
  : "${opt_cpus:=$DEFAULT_CPUS}"
  : "${opt_kind:=$DEFAULT_KIND}"
  : "${opt_time:=$DEFAULT_TIME}"
  : "${opt_mem_per_gpu:=$DEFAULT_MEM_PER_GPU}"
  : "${opt_exp_name:=$DEFAULT_EXP_NAME}"
  : "${opt_nodes:=$DEFAULT_NODES}"
  : "${opt_signal_lead:=$DEFAULT_SIGNAL_LEAD}"
  : "${opt_max_requeues:=$DEFAULT_MAX_REQUEUES}"
  : "${opt_compress:=$DEFAULT_COMPRESS}"
  : "${opt_sweep_seed:=0}"
  : "${opt_signal:=$DEFAULT_SIGNAL}"
  : "${opt_tasks_per_node:=$DEFAULT_TASKS_PER_NODE}"
  if [[ -z "${opt_configs:-}" && -z "${opt_wandb_sweep:-}" && -z "${opt_sweep:-}" && ${#opt_command[@]} -eq 0 ]]; then
    opt_configs="$HPC_FILES_DIR/experiment_configurations.txt"
    [[ -f "$opt_configs" ]] || opt_configs="${HPC_FILES_DIR%/*}/experiment_configurations.txt"
  fi
  # A relative path that names nothing from the current directory but names
  # something in the project becomes the project's.
  ! only_in_project "${opt_configs:-}" || opt_configs="$source_dir/$opt_configs"
  ! only_in_project "${opt_sweep:-}" || opt_sweep="$source_dir/$opt_sweep"
  ! only_in_project "${opt_setup_venv:-}" || opt_setup_venv="$source_dir/$opt_setup_venv"
  ! only_in_project "${opt_container:-}" || opt_container="$source_dir/$opt_container"
  ! only_in_project "${opt_venv:-}" || opt_venv="$source_dir/$opt_venv"
}

# only_in_project PATH: PATH is relative and names nothing from the current
# directory, but names something in the project (source_dir).
only_in_project() {
  [[ -n "$1" && "$1" != /* && ! -e "$1" && -e "$source_dir/$1" ]]
}

# ask_sweep_count: a wandb sweep without --sweep-count asks for it on a
# terminal (not for --dry-run or --list-trials); validation refuses the rest.
ask_sweep_count() {
  [[ -n "${opt_wandb_sweep:-}" && -z "${opt_sweep_count:-}" ]] || return 0
  [[ -z "${opt_list_trials:-}" && -z "${opt_dry_run:-}" && -t 0 ]] || return 0
  read -r -p "Number of sweep runs (array tasks) for $opt_wandb_sweep: " opt_sweep_count ||
    usage_error "no --sweep-count given"
}
