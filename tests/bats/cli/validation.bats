#!/usr/bin/env bats
# job_submitter.sh refuses bad input before it writes or submits anything:
# exit 2, one line 'job_submitter.sh: error: ...' naming the problem, nothing
# on stdout, no sbatch call, no file under SCRATCH (see `refuse` in cli_helper).

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
}

# --- GPUs, CPUs, nodes -------------------------------------------------------

@test "gpus: not a number" {
  refuse "--gpus expects a whole number, got 'two'" -- -C "$ONE_LINE" -g two
}

@test "gpus: negative" {
  refuse "--gpus expects a whole number, got '-1'" -- -C "$ONE_LINE" -g -1
}

@test "gpus: a fraction" {
  refuse "--gpus expects a whole number, got '1.5'" -- -C "$ONE_LINE" --gpus=1.5
}

@test "gpus: empty" {
  refuse "-g expects a value, got an empty string" -- -C "$ONE_LINE" -g ''
}

@test "gpus: more than any node has (built-in limit 64)" {
  refuse "--gpus must be at most 64, got '65'" -- -C "$ONE_LINE" -g 65
}

@test "gpus: more than the site's nodes have" {
  refuse "--gpus must be at most 4, got '5'" -- -C "$ONE_LINE" --site cedar -g 5
}

@test "gpus: a number too long to be one" {
  refuse "--gpus is out of range, got '99999999999999999999'" -- -C "$ONE_LINE" -g 99999999999999999999
}

@test "--tasks-per-node: only CPU-only runs, a whole number from 1" {
  refuse "--tasks-per-node applies to CPU-only runs (--gpus 0)" -- -C "$ONE_LINE" -g 2 --tasks-per-node 2
  refuse "--tasks-per-node must be at least 1, got '0'" -- -C "$ONE_LINE" -g 0 --tasks-per-node 0
  refuse "--tasks-per-node expects a whole number, got 'two'" -- -C "$ONE_LINE" -g 0 --tasks-per-node two
}

@test "--signal: a signal the batch script can trap and forward, not TERM; --no-signal takes neither --signal nor --signal-lead" {
  refuse "--signal expects one of: USR1 USR2 HUP INT QUIT URG; got 'TERM'" -- -C "$ONE_LINE" --signal TERM
  refuse "--signal expects one of: USR1 USR2 HUP INT QUIT URG; got 'KILL'" -- -C "$ONE_LINE" --signal SIGKILL
  refuse "--no-signal sends no wall-time signal; drop --signal/--signal-lead" -- -C "$ONE_LINE" --no-signal --signal USR2
  refuse "--no-signal sends no wall-time signal; drop --signal/--signal-lead" -- -C "$ONE_LINE" --no-signal --signal-lead 60
}

@test "cpus: not a number" {
  refuse "--cpus expects a whole number, got 'many'" -- -C "$ONE_LINE" -c many
}

@test "cpus: zero" {
  refuse "--cpus must be at least 1, got '0'" -- -C "$ONE_LINE" --cpu 0
}

@test "cpus: negative" {
  refuse "--cpus expects a whole number, got '-4'" -- -C "$ONE_LINE" --cpus=-4
}

@test "cpus: too many" {
  refuse "--cpus must be at most 1024, got '1025'" -- -C "$ONE_LINE" -c 1025
}

@test "cpus: empty" {
  refuse "-c expects a value, got an empty string" -- -C "$ONE_LINE" -c ''
}

@test "nodes: not a number" {
  refuse "--num-nodes expects a whole number, got 'x2'" -- -C "$ONE_LINE" -n x2
}

@test "nodes: zero" {
  refuse "--num-nodes must be at least 1, got '0'" -- -C "$ONE_LINE" -N 0
}

@test "nodes: negative" {
  refuse "--num-nodes expects a whole number, got '-2'" -- -C "$ONE_LINE" --nodes=-2
}

@test "nodes: more than the site has" {
  refuse "--num-nodes must be at most 2, got '3'" -- -C "$ONE_LINE" --site local -n 3
}

@test "nodes: empty" {
  refuse "-n expects a value, got an empty string" -- -C "$ONE_LINE" -n ''
}

@test "an empty value is refused for every option that takes one" {
  local spelling accepted=()
  # shellcheck source=../../../hpc_files/lib/options.sh
  source "$REPO_ROOT/hpc_files/lib/options.sh"
  for spelling in "${!OPTION_SETTING[@]}"; do
    [[ "$spelling" == --* ]] || continue
    # --modules '' means "load none" (clears the site's modules).
    [[ "$spelling" != --modules ]] || continue
    run --separate-stderr timeout 20 "$SUBMITTER" --dry-run -C "$ONE_LINE" "$spelling=" </dev/null
    ((status == 2)) || accepted+=("$spelling=")
  done
  ((${#accepted[@]} == 0)) || fail "accepted an empty value: ${accepted[*]}"
}

# --- kind and layout ---------------------------------------------------------

@test "kind: unknown -W" {
  refuse "--which-distributed expects one of: lightning torchrun script none; got 'deepspeed'" -- -C "$ONE_LINE" -W deepspeed
}

@test "kind: -W none on two nodes" {
  refuse "-W none runs one process on one node, got --num-nodes 2" -- -C "$ONE_LINE" -W none -n 2
}

@test "kind: --pass-local-rank with -W lightning" {
  refuse "--pass-local-rank only applies to -W torchrun/script" -- -C "$ONE_LINE" --pass-local-rank -W lightning
}

@test "layout: more CPUs per node than the site's nodes have" {
  refuse "this layout needs 16 CPUs per node (4 tasks x 4 CPUs) but site 'local' nodes have 8" -- -C "$ONE_LINE" --site local -g 4 -c 4
}

# --- time, memory, signal lead -----------------------------------------------

@test "time: four fields" {
  refuse "--time expects a SLURM time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), got '1:2:3:4'" -- -C "$ONE_LINE" -t 1:2:3:4
}

@test "time: words" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" --time abc
}

@test "time: 60 seconds" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" --time=10:60
}

@test "time: 60 minutes in H:M:S" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" -t 1:60:00
}

@test "time: a day and a dangling dash" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" -t 1-
}

@test "time: D-HH with hours above 23" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" -t 00-25:00:00
}

@test "time: zero" {
  refuse "--time must be longer than zero, got '00:00:00'" -- -C "$ONE_LINE" -t 00:00:00
}

@test "time: zero minutes" {
  refuse "--time must be longer than zero, got '0'" -- -C "$ONE_LINE" -t 0
}

@test "memory: unknown unit" {
  refuse "--mem-per-gpu expects a size such as 10G, 512M, 2048 (MiB) or 1T, got '10X'" -- -C "$ONE_LINE" -m 10X
}

@test "memory: negative" {
  refuse "--mem-per-gpu expects a size such as 10G, 512M, 2048 (MiB) or 1T, got '-1G'" -- -C "$ONE_LINE" --mem-per-gpu -1G
}

@test "memory: zero" {
  refuse "--mem-per-gpu must be more than zero, got '0'" -- -C "$ONE_LINE" -m 0
}

@test "memory: a fraction" {
  refuse "--mem-per-gpu expects a size" -- -C "$ONE_LINE" --mem-per-gpu=1.5G
}

@test "signal lead: as long as the wall time" {
  refuse "--signal-lead (3600 s) must be shorter than --time (60 = 3600 s)" -- -C "$ONE_LINE" -t 60 --signal-lead 3600
}

@test "signal lead: less than a minute before the wall time is refused (SLURM's 30 s checks can send it before the job starts); --no-signal takes any --time" {
  refuse "--signal-lead (50 s) must leave at least 60 s of --time (1 = 60 s): SLURM may send it up to 30 s early, before the job has started" -- -C "$ONE_LINE" -t 1 --signal-lead 50
  refuse "--signal-lead (31 s) must leave at least 60 s of --time (1:30 = 90 s)" -- -C "$ONE_LINE" -t 1:30 --signal-lead 31
  dry -C "$ONE_LINE" -t 1:30 --signal-lead 30
  assert_output --partial '#SBATCH --signal=B:USR1@30'
  dry -C "$ONE_LINE" -t 1 --no-signal
  refute_output --partial '#SBATCH --signal'
}

@test "signal lead: a --time too short for the default lead gets the longest that fits, or no signal, said in one line" {
  run --separate-stderr "$SUBMITTER" --dry-run -C "$ONE_LINE" -t 00:02:00 </dev/null
  assert_success
  assert_output --partial '#SBATCH --signal=B:USR1@60'
  assert_equal "$stderr" "job_submitter.sh: --time 00:02:00 leaves no room for the default 90 s signal lead; the wall-time signal comes 60 s before the end (--signal-lead sets it)"
  run --separate-stderr "$SUBMITTER" --dry-run -C "$ONE_LINE" -t 1 </dev/null
  assert_success
  refute_output --partial '#SBATCH --signal'
  assert_equal "$stderr" "job_submitter.sh: --time 1 is too short for a wall-time signal (it needs 70 s or more); the job runs without one, as with --no-signal"
  # Long enough for the default: nothing said.
  dry -C "$ONE_LINE" -t 00:02:30
  assert_output --partial '#SBATCH --signal=B:USR1@90'
}

@test "signal lead: zero" {
  refuse "--signal-lead must be at least 1, got '0'" -- -C "$ONE_LINE" --signal-lead 0
}

@test "max requeues: not a number" {
  refuse "--max-requeues expects a whole number, got 'lots'" -- -C "$ONE_LINE" --max-requeues lots
}

# --- GPU type ----------------------------------------------------------------

@test "gpu type: not offered by the site" {
  refuse "--gpu-type 'a100' is not offered by site 'cedar' (offered: p100,p100l,v100l)" -- -C "$ONE_LINE" --site cedar -G a100
}

@test "gpu type: with no GPUs" {
  refuse "--gpu-type 'v100l' needs --gpus of at least 1" -- -C "$ONE_LINE" -W torchrun -g 0 --gpu-type v100l
}

@test "gpu type: not a name" {
  refuse "--gpu-type accepts letters, digits" -- -C "$ONE_LINE" -G 'v100;ls'
}

# --- experiment name ---------------------------------------------------------

@test "exp name: a command substitution" {
  refuse "--exp-name accepts letters, digits, '.', '_' and '-' (not first), got '\$(touch $BATS_TEST_TMPDIR/pwned)'" -- \
    -C "$ONE_LINE" -e "\$(touch $BATS_TEST_TMPDIR/pwned)"
  assert_file_not_exists "$BATS_TEST_TMPDIR/pwned"
}

@test "exp name: a space" {
  refuse "got 'two words'" -- -C "$ONE_LINE" -e 'two words'
}

@test "exp name: single and double quotes" {
  refuse "--exp-name accepts letters, digits" -- -C "$ONE_LINE" --exp-name "it's \"x\""
}

@test "exp name: a comma" {
  refuse "got 'a,b'" -- -C "$ONE_LINE" -e a,b
}

@test "exp name: a newline stays one line in the message" {
  refuse "got 'a\\nb'" -- -C "$ONE_LINE" -e $'a\nb'
}

@test "exp name: a leading dash" {
  refuse "--exp-name accepts letters, digits, '.', '_' and '-' (not first), got '-lead'" -- -C "$ONE_LINE" --exp-name=-lead
}

@test "exp name: a leading dot" {
  refuse "got '.hidden'" -- -C "$ONE_LINE" -e .hidden
}

@test "exp name: a slash" {
  refuse "got 'a/../b'" -- -C "$ONE_LINE" -e a/../b
}

@test "exp name: longer than 100 characters" {
  refuse "--exp-name is longer than 100 characters" -- -C "$ONE_LINE" -e "$(printf 'x%.0s' {1..101})"
}

@test "exp name: bytes that are not UTF-8" {
  refuse "--exp-name accepts letters, digits" -- -C "$ONE_LINE" -e $'run\xff\xfe'
}

@test "exp name: all digits, which status.sh and results.sh read as a job id" {
  refuse "job_submitter.sh: error: --exp-name '363' reads as a job id to status.sh and results.sh (digits, or DIGITS_DIGITS for an array task); add a letter, e.g. 'exp363'" -- -C "$ONE_LINE" -e 363
  refuse "--exp-name '0012_3' reads as a job id" -- --dry-run -C "$ONE_LINE" --exp-name=0012_3
  # a letter anywhere makes it a name
  dry -C "$ONE_LINE" -e 363a
  dry -C "$ONE_LINE" -e 1_2_3
}

@test "exp name: the job logs' folder" {
  # its submissions would go among the logs, and status.sh could not find them
  refuse "--exp-name 'hpc_outputs' is the folder of the job logs" -- -C "$ONE_LINE" -e hpc_outputs
}

@test "project: a folder name with a double quote is refused before anything is written" {
  local project="$BATS_TEST_TMPDIR/q\"proj"
  mkdir -p "$project"
  cp -r "$REPO_ROOT/hpc_files" "$project/"
  SUBMITTER="$project/hpc_files/job_submitter.sh" refuse "the project folder's name" -- -C "$ONE_LINE"
}

@test "layout: --tasks-per-node with -W none, which runs one process" {
  refuse "--tasks-per-node does not apply to -W none" -- -C "$ONE_LINE" -g 0 -W none --tasks-per-node 4
}

# --- parsing -----------------------------------------------------------------

@test "parsing: unknown long option" {
  refuse "unknown option '--gpu' (see --help)" -- -C "$ONE_LINE" --gpu 2
}

@test "parsing: unknown short option" {
  refuse "unknown option '-z' (see --help)" -- -C "$ONE_LINE" -z
}

@test "parsing: unknown option with =value" {
  refuse "unknown option '--colour' (see --help)" -- -C "$ONE_LINE" --colour=red
}

@test "parsing: a stray word ends (the seed looped forever) with an error" {
  refuse "unexpected argument 'foo' (options start with '-'; put a command after '--')" -- -C "$ONE_LINE" foo
}

@test "parsing: a missing value at the end" {
  refuse "-g expects a value" -- -C "$ONE_LINE" -g
}

@test "parsing: a value that looks like an option" {
  refuse "-g expects a value" -- -C "$ONE_LINE" -g --cpus 2
}

@test "parsing: the same option twice with different values" {
  refuse "--gpus given twice with different values ('2' and '3')" -- -C "$ONE_LINE" -g 2 --gpus 3
}

@test "parsing: two spellings of nodes with different values" {
  refuse "given twice with different values ('1' and '2')" -- -C "$ONE_LINE" --num_nodes=1 -N 2
}

@test "parsing: a flag given a value" {
  refuse "--dry-run takes no value (got '--dry-run=1')" -- -C "$ONE_LINE" --dry-run=1
}

@test "parsing: '--' with no command" {
  refuse "'--' must be followed by a command" -- -C "$ONE_LINE" --
}

@test "parsing: short option glued to its value" {
  refuse "unknown option '-g2' (see --help)" -- -C "$ONE_LINE" -g2
}

# --- experiment sources ------------------------------------------------------

@test "configs: missing file" {
  refuse "--configs file '$BATS_TEST_TMPDIR/nope.txt' does not exist" -- -C "$BATS_TEST_TMPDIR/nope.txt"
}

@test "configs: a folder" {
  refuse "--configs file '$BATS_TEST_TMPDIR' does not exist" -- -C "$BATS_TEST_TMPDIR"
}

@test "wandb: a sweep id with a space" {
  refuse "--wandb-sweepid expects ID or ENTITY/PROJECT/ID (letters, digits, '_', '-'), got 'abc 123'" -- -w 'abc 123' --sweep-count 2
}

@test "wandb: a sweep id with a shell metacharacter" {
  refuse "--wandb-sweepid expects ID or ENTITY/PROJECT/ID" -- --wandb-sweepid='abc;ls' --sweep-count 2
}

@test "wandb: on two nodes" {
  refuse "--num-nodes 2" -- -w abc123 --sweep-count 2 -n 2
}

@test "wandb: on two nodes, the message names the wandb sweep" {
  refuse "a wandb sweep runs one agent per array task on one node" -- -w abc123 --sweep-count 2 -n 2
}

@test "wandb: with an explicit -W" {
  refuse "-w/--wandb-sweepid runs one 'wandb agent' per task, which starts the runs itself; drop -W torchrun" -- -w abc123 --sweep-count 2 -W torchrun
}

@test "wandb: no --sweep-count when stdin is not a terminal" {
  refuse "--sweep-count is required with --wandb-sweepid when not run from a terminal" -- -w abc123
}

@test "wandb: no --sweep-count with --dry-run on a terminal names --dry-run, not the terminal" {
  run script -qec "$(printf '%q ' "$SUBMITTER" --dry-run -w abc123)" /dev/null
  assert_failure 2
  assert_output --partial "job_submitter.sh: error: --sweep-count is required with --wandb-sweepid for --dry-run and --list-trials"
  run script -qec "$(printf '%q ' "$SUBMITTER" --list-trials -w abc123)" /dev/null
  assert_failure 2
  assert_output --partial "for --dry-run and --list-trials"
}

@test "wandb: --sweep-count 0" {
  refuse "--sweep-count must be at least 1, got '0'" -- -w abc123 --sweep-count 0
}

@test "wandb: --sweep-count without -w" {
  refuse "--sweep-count only applies with -w/--wandb-sweepid (for --sweep, use --trials)" -- -C "$ONE_LINE" --sweep-count 3
}

@test "wandb: --seeds with a wandb sweep" {
  refuse "--seeds does not apply to a wandb sweep" -- -w abc123 --sweep-count 2 --seeds 2
}

@test "wandb: together with --sweep" {
  refuse "choose one of -w/--wandb-sweepid, --sweep and '-- COMMAND'" -- -w abc123 --sweep-count 2 --sweep "$REPO_ROOT/sweeper.yml"
}

@test "sweep: together with a command" {
  refuse "choose one of -w/--wandb-sweepid, --sweep and '-- COMMAND'" -- --sweep "$REPO_ROOT/sweeper.yml" -- python train.py
}

@test "sweep: --trials without --sweep" {
  refuse "--trials only applies with --sweep" -- -C "$ONE_LINE" --trials 3
}

@test "sweep: --sweep-seed without --sweep" {
  refuse "--sweep-seed only applies with --sweep" -- -C "$ONE_LINE" --sweep-seed 3
}

@test "sweep: missing file" {
  refuse "--sweep file '$BATS_TEST_TMPDIR/nope.yml' does not exist" -- --sweep "$BATS_TEST_TMPDIR/nope.yml"
}

@test "sweep: --trials 0" {
  refuse "--trials must be at least 1, got '0'" -- --sweep "$REPO_ROOT/sweeper.yml" --trials 0
}

@test "seeds: a command after '--' that sets --seed itself is named so, not by a temporary file" {
  refuse "job_submitter.sh: error: the command after '--': the trial already sets --seed; drop it or drop --seeds" -- --seeds 2 -- python -m hpc_harness.train --seed 5
}

@test "command: a word after '--' that is not UTF-8 is named as the command after '--', not a temporary file" {
  refuse "job_submitter.sh: error: the command after '--': not UTF-8 text" -- -- python $'\xff'
}

@test "command: an empty program word after '--' is refused, not queued to fail on the node" {
  refuse "job_submitter.sh: error: the command after '--': the program to run is an empty word" -- -e bad -- ""
  refuse "job_submitter.sh: error: the command after '--': the program to run is an empty word" -- -e bad -- A=1 "" train.py
}

@test "command: only environment assignments after '--' is refused" {
  refuse "job_submitter.sh: error: the command after '--': only environment assignments ('FOO=1'), no program to run" -- --no-submit -- FOO=1
}

@test "command: environment assignments before the program are accepted" {
  dry -- FOO=1 python train.py
}

@test "configs: a line of environment assignments alone, or an empty program word, names the file and line" {
  local configs="$BATS_TEST_TMPDIR/bad configs.txt"
  printf 'python train.py\nFOO=1\n' >"$configs"
  refuse "job_submitter.sh: error: $configs:2: only environment assignments ('FOO=1'), no program to run" -- --list-trials -C "$configs"
  printf '# empty\n""\n' >"$configs"
  refuse "job_submitter.sh: error: $configs:2: the program to run is an empty word" -- --list-trials -C "$configs"
  refuse "job_submitter.sh: error: $configs:2: the program to run is an empty word" -- -C "$configs"
}

@test "seeds: zero" {
  refuse "--seeds must be at least 1, got '0'" -- -C "$ONE_LINE" --seeds 0
}

@test "array throttle: zero" {
  refuse "--array-throttle must be at least 1, got '0'" -- -C "$ONE_LINE" --array-throttle 0
}

# --- other settings ----------------------------------------------------------

@test "dependency: not a SLURM dependency" {
  refuse "--dependency expects a SLURM dependency such as afterok:123 or singleton, got 'after ok:12'" -- -C "$ONE_LINE" --dependency 'after ok:12'
}

@test "dependency: a job id that is not a number" {
  refuse "--dependency expects a SLURM dependency" -- -C "$ONE_LINE" --dependency=afterok:abc
}

@test "modules: a word with a shell metacharacter" {
  refuse "--modules accepts module names (letters, digits, '_', '.', '/', '+', '-'), got '\$(reboot)'" -- -C "$ONE_LINE" --modules 'cuda/12 $(reboot)'
}

@test "modules: a newline" {
  refuse "--modules" -- -C "$ONE_LINE" --modules $'cuda/12\ntouch x'
}

@test "account: a space" {
  refuse "--account accepts letters, digits, '.', '_', '-', got 'my account'" -- -C "$ONE_LINE" -a 'my account'
}

@test "partition: a semicolon" {
  refuse "--partition accepts letters, digits" -- -C "$ONE_LINE" -p 'gpu;ls'
}

@test "compress: unknown program" {
  refuse "--compress expects one of: none zstd pigz; got 'bzip2'" -- -C "$ONE_LINE" --compress bzip2
}

@test "compress: the program is not installed" {
  ! command -v pigz >/dev/null || skip "pigz is installed on this machine"
  refuse "--compress pigz needs 'pigz' on this machine and on the nodes" -- -C "$ONE_LINE" --compress pigz
}

@test "stage out: '..'" {
  refuse "--stage-out expects a folder relative to \$SLURM_TMPDIR (no '..'), got 'out/../..'" -- -C "$ONE_LINE" --stage-out out/../..
}

@test "stage out: absolute" {
  refuse "--stage-out expects a folder relative to \$SLURM_TMPDIR" -- -C "$ONE_LINE" --stage-out=/etc
}

@test "venv: a folder without bin/python" {
  mkdir -p "$BATS_TEST_TMPDIR/empty venv"
  refuse "--venv '$BATS_TEST_TMPDIR/empty venv' has no bin/python" -- -C "$ONE_LINE" --venv "$BATS_TEST_TMPDIR/empty venv"
}

@test "setup venv: missing requirements file" {
  refuse "--setup-venv expects a readable requirements file, got 'nope.txt'" -- -C "$ONE_LINE" --setup-venv nope.txt
}

@test "setup venv: with a container" {
  printf 'numpy\n' >"$BATS_TEST_TMPDIR/req.txt"
  refuse "--setup-venv builds a virtualenv; it does not apply with -s (a container)" -- -C "$ONE_LINE" --setup-venv "$BATS_TEST_TMPDIR/req.txt" -s "$DUMMY_SIF"
}

@test "container: missing image" {
  refuse "--singularity-container '$BATS_TEST_TMPDIR/nope.sif' does not exist" -- -C "$ONE_LINE" -s "$BATS_TEST_TMPDIR/nope.sif"
}

@test "sbatch arg: not an option" {
  refuse "--sbatch-arg expects an sbatch option starting with '-', got 'exclusive'" -- -C "$ONE_LINE" --sbatch-arg exclusive
}

@test "sbatch arg: a newline" {
  refuse "--sbatch-arg must not contain a newline" -- -C "$ONE_LINE" --sbatch-arg=$'--comment=a\n#SBATCH --x'
}

@test "sbatch arg: a value with double quotes and spaces" {
  refuse "--sbatch-arg" -- -C "$ONE_LINE" --sbatch-arg='--comment=a "b" c'
}

@test "sbatch arg: an option the submitter sets itself is refused, naming the submitter's" {
  # Submitted, the submitter's command-line --time/--requeue/--signal beat these
  # #SBATCH lines; a later 'sbatch job.sbatch' obeyed them: one folder, two jobs.
  refuse "--sbatch-arg=--time=3 sets what the submitter sets itself; use -t/--time" -- -C "$ONE_LINE" --sbatch-arg=--time=3
  refuse "--sbatch-arg=-t5 sets what the submitter sets itself; use -t/--time" -- -C "$ONE_LINE" --sbatch-arg=-t5
  refuse "use --max-requeues or --no-signal" -- -C "$ONE_LINE" --sbatch-arg=--no-requeue
  refuse "use --signal, --signal-lead or --no-signal" -- -C "$ONE_LINE" --sbatch-arg=--signal=B:USR2@40
  refuse "use --dependency" -- -C "$ONE_LINE" --sbatch-arg=--dependency=afterok:1
  refuse "use --sweep, --seeds, -C or --array-throttle" -- -C "$ONE_LINE" --sbatch-arg=--array=0-3
  refuse "use -e/--exp-name" -- -C "$ONE_LINE" --sbatch-arg=-Jname
  refuse "the log is the submitter's" -- -C "$ONE_LINE" --sbatch-arg=--output=x.out
  refuse "the job needs the submitting shell's environment" -- -C "$ONE_LINE" --sbatch-arg=--export=NONE
  # sbatch takes an unambiguous prefix of a long option: so does the refusal
  refuse "--sbatch-arg=--part=gpu sets what the submitter sets itself; use -p/--partition" -- -C "$ONE_LINE" --sbatch-arg=--part=gpu
  refuse "--sbatch-arg=--ntasks-per-n=2 sets what the submitter sets itself; the tasks follow" -- -C "$ONE_LINE" --sbatch-arg=--ntasks-per-n=2
  refuse "--sbatch-arg=--tim=5 sets what the submitter sets itself; use -t/--time" -- -C "$ONE_LINE" --sbatch-arg=--tim=5
  refuse "--sbatch-arg=--tres-per-task=gres/gpu:2 sets what the submitter sets itself; use -g/--gpus" -- -C "$ONE_LINE" --sbatch-arg=--tres-per-task=gres/gpu:2
  dry -C "$ONE_LINE" --sbatch-arg=--tres-per-task=cpu:2 --sbatch-arg=--time-min=5
  # neighbours with other meanings pass
  dry -C "$ONE_LINE" --sbatch-arg=--time-min=10 --sbatch-arg=--exclusive --sbatch-arg=--tmp=10G
}

@test "sbatch arg: a layout option with the value the submitter sets is accepted (test-tube's ntasks-per-node), another value is refused naming both" {
  local arg
  for arg in --ntasks-per-node=2 '--ntasks-per-node 2' --nodes=1 -N1 '-c 2' --cpus-per-task=2 --ntasks=2; do
    dry -C "$ONE_LINE" -g 2 -c 2 -W lightning --sbatch-arg="$arg"
    assert_equal "$(grep -c '^#SBATCH' <<<"$output")" 11
  done
  assert_output --partial '#SBATCH --ntasks-per-node=2'
  refuse "--sbatch-arg=--ntasks-per-node=8 sets what the submitter sets itself; the tasks follow --gpus and -W (with --gpus 0: --tasks-per-node) (this submission sets --ntasks-per-node=2; the same value is accepted)" -- \
    -C "$ONE_LINE" -g 2 -W lightning --sbatch-arg=--ntasks-per-node=8
  refuse "--sbatch-arg=-J x sets what the submitter sets itself; use -e/--exp-name (this submission sets --job-name=" -- -C "$ONE_LINE" --sbatch-arg='-J x'
  refuse "--sbatch-arg=--part=gpu sets what the submitter sets itself; use -p/--partition (this submission sets no --partition; the same value is accepted)" -- \
    -C "$ONE_LINE" --sbatch-arg=--part=gpu
}

@test "sbatch arg: a resource or layout option the submitter writes is refused, naming the submitter's" {
  # sbatch obeys the last of two #SBATCH lines: --sbatch-arg=--nodes=2 ran on
  # 2 nodes while the job's HPC_NODES said 1.
  refuse "--sbatch-arg=--nodes=2 sets what the submitter sets itself; use -N/--nodes" -- -C "$ONE_LINE" --sbatch-arg=--nodes=2
  refuse "--sbatch-arg=--nodes 2 sets what the submitter sets itself; use -N/--nodes" -- -C "$ONE_LINE" --sbatch-arg '--nodes 2'
  refuse "--sbatch-arg=-N 2 sets what the submitter sets itself; use -N/--nodes" -- -C "$ONE_LINE" --sbatch-arg '-N 2'
  refuse "use -N/--nodes" -- -C "$ONE_LINE" --sbatch-arg=-N2
  local arg
  for arg in --ntasks=4 -n4 '-n 4' --ntasks-per-node=2 --ntasks-per-gpu=1; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; the tasks follow --gpus and -W (with --gpus 0: --tasks-per-node)" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  for arg in --cpus-per-task=8 -c8 '-c 8' --cpus-per-gpu=4; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; use -c/--cpus" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  for arg in --gres=gpu:2 --gpus=2 -G2 '--gpus 2' --gpus-per-node=2 --gpus-per-task=1 --gpus-per-socket=1; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; use -g/--gpus and -G/--gpu-type" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  for arg in --mem-per-cpu=1G --mem-per-gpu=5G; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; use -m/--mem-per-gpu, or --mem=SIZE for the memory per node" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  # --mem (0: all of a node's) replaces the one the submitter writes, in one line
  dry -C "$ONE_LINE" -g 1 --sbatch-arg=--mem=0
  assert_equal "$(grep -c '^#SBATCH --mem' <<<"$output")" 1
  assert_output --partial '#SBATCH --mem=0'
  dry -C "$ONE_LINE" -g 1 --sbatch-arg '--mem 64G'
  assert_output --partial '#SBATCH --mem=64G'
  for arg in --partition=gpu -pgpu '-p gpu'; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; use -p/--partition" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  for arg in --account=def-x -Adef-x '-A def-x'; do
    refuse "--sbatch-arg=$arg sets what the submitter sets itself; use -a/--account" -- -C "$ONE_LINE" --sbatch-arg="$arg"
  done
  # a generic resource that is not a GPU joins the job's one --gres line (sbatch
  # obeys the last --gres line: a second one would drop the GPUs)
  dry -C "$ONE_LINE" -g 0 --sbatch-arg=--gres=lscratch:10
  assert_equal "$(grep -c '^#SBATCH --gres' <<<"$output")" 1
  assert_output --partial '#SBATCH --gres=lscratch:10'
  dry -C "$ONE_LINE" -g 2 --sbatch-arg=--gres=lscratch:10 --sbatch-arg '--gres tmp:5'
  assert_equal "$(grep -c '^#SBATCH --gres' <<<"$output")" 1
  assert_output --partial '#SBATCH --gres=gpu:2,lscratch:10,tmp:5'
  refuse "--sbatch-arg=--gres=gpu:a100:1,lscratch:10 sets what the submitter sets itself; use -g/--gpus and -G/--gpu-type" -- -C "$ONE_LINE" -g 1 --sbatch-arg=--gres=gpu:a100:1,lscratch:10
  # neighbours with other meanings pass
  dry -C "$ONE_LINE" --sbatch-arg=--gres-flags=enforce-binding --sbatch-arg=--mem-bind=local \
    --sbatch-arg=--nodelist=node1 --sbatch-arg=--ntasks-per-core=1 --sbatch-arg=--constraint=ib
}

# --- site profiles -----------------------------------------------------------

@test "site: unknown name" {
  refuse "site profile 'nowhere' not found (looked for $REPO_ROOT/hpc_files/sites/nowhere.conf; shipped: cedar, generic, local, plai)" -- -C "$ONE_LINE" --site nowhere
}

@test "site: HPC_SITE names an unknown profile" {
  HPC_SITE=nowhere refuse "site profile 'nowhere' not found" -- -C "$ONE_LINE"
}

@test "site: a profile file with an unknown key names the file and line" {
  local file="$BATS_TEST_TMPDIR/my site/bad.conf"
  mkdir -p "${file%/*}"
  printf '# a site\npartition = gpu\ngpus_per_node = 4\n' >"$file"
  refuse "$file:3: unknown key 'gpus_per_node' (known: " -- -C "$ONE_LINE" --site "$file"
}

@test "site: a profile line without '='" {
  local file="$BATS_TEST_TMPDIR/my site/bad.conf"
  mkdir -p "${file%/*}"
  printf '\npartition gpu\n' >"$file"
  refuse "$file:2: expected 'key = value', got 'partition gpu'" -- -C "$ONE_LINE" --site "$file"
}

@test "site: a profile value the options refuse" {
  local file="$BATS_TEST_TMPDIR/my site/bad.conf"
  mkdir -p "${file%/*}"
  printf 'account = a b\n' >"$file"
  refuse "$file:1: account expects names of letters, digits, '.', '_' and '-'" -- -C "$ONE_LINE" --site "$file"
}

# --- SCRATCH and data --------------------------------------------------------

@test "scratch: SCRATCH unset" {
  unset SCRATCH
  refuse "SCRATCH is not set; export SCRATCH=/path/to/your/scratch" -- -C "$ONE_LINE"
}

@test "scratch: SCRATCH empty" {
  SCRATCH='' refuse "SCRATCH is not set" -- -C "$ONE_LINE"
}

@test "scratch: SCRATCH relative" {
  cd "$BATS_TEST_TMPDIR"
  SCRATCH=relative/scratch refuse "SCRATCH must be an absolute path, got 'relative/scratch'" -- -C "$ONE_LINE"
  assert_file_not_exists "$BATS_TEST_TMPDIR/relative"
}

@test "data: an absolute path" {
  mkdir -p "$SCRATCH/$PROJECT/ds"
  refuse "--data paths are relative to \$SCRATCH/$PROJECT, got the absolute path '$SCRATCH/$PROJECT/ds'" -- -C "$ONE_LINE" -d "$SCRATCH/$PROJECT/ds"
}

@test "data: '..'" {
  mkdir -p "$SCRATCH/$PROJECT/ds"
  refuse "--data path 'ds/../../x' must not contain '..'" -- -C "$ONE_LINE" -d ds/../../x
}

@test "data: a path that does not exist" {
  mkdir -p "$SCRATCH/$PROJECT"
  refuse "--data path 'missing' does not exist in $SCRATCH/$PROJECT" -- -C "$ONE_LINE" -d missing
}

@test "data: the project's scratch folder does not exist" {
  refuse "--data paths are relative to $SCRATCH/$PROJECT, which does not exist" -- -C "$ONE_LINE" -d ds
}

@test "data: a symlink to a shared dataset outside scratch is staged: the tarball holds what it leads to" {
  mkdir -p "$SCRATCH/$PROJECT/datasets" "$BATS_TEST_TMPDIR/datashare/imagenet"
  printf 'x\n' >"$BATS_TEST_TMPDIR/datashare/imagenet/img1"
  ln -s "$BATS_TEST_TMPDIR/datashare/imagenet" "$SCRATCH/$PROJECT/datasets/imagenet"
  run --separate-stderr "$SUBMITTER" -e shared -C "$ONE_LINE" -d datasets/imagenet </dev/null
  assert_success
  local tarball
  tarball=$(find "$SCRATCH/$PROJECT" -name 'data-*.tar' | head -n 1)
  [[ -n "$tarball" ]] || fail "no data tarball"
  assert_equal "$(tar -xOf "$tarball" datasets/imagenet/img1)" x
}

@test "exp name: a data folder, or a folder of other files, is refused; an experiment's folder is not" {
  mkdir -p "$SCRATCH/$PROJECT/datasets/mix" "$SCRATCH/$PROJECT/notes"
  printf 'x\n' >"$SCRATCH/$PROJECT/datasets/mix/a"
  printf 'x\n' >"$SCRATCH/$PROJECT/notes/todo.txt"
  refuse "--exp-name 'datasets' is the folder of --data path './datasets/mix': the runs would write their checkpoints among the data; choose another -e" -- \
    -C "$ONE_LINE" -e datasets -d ./datasets/mix
  refuse "--exp-name 'datasets' names $SCRATCH/$PROJECT/datasets, which holds other files than an experiment's (no checkpoints/ folder); choose another -e" -- \
    -C "$ONE_LINE" -e datasets
  refuse "--exp-name 'notes' names $SCRATCH/$PROJECT/notes" -- -C "$ONE_LINE" -e notes
  mkdir -p "$SCRATCH/$PROJECT/exp1/checkpoints" "$SCRATCH/$PROJECT/empty"
  dry -C "$ONE_LINE" -e exp1 -d datasets/mix
  dry -C "$ONE_LINE" -e empty
}

@test "data: the first problem in path order is the one reported" {
  mkdir -p "$SCRATCH/$PROJECT/inside"
  ln -s "$BATS_TEST_TMPDIR/nowhere" "$SCRATCH/$PROJECT/broken"
  refuse "--data path 'missing' does not exist in $SCRATCH/$PROJECT" -- -C "$ONE_LINE" -d inside missing broken
  refuse "--data path 'broken' does not exist in $SCRATCH/$PROJECT" -- -C "$ONE_LINE" -d inside broken missing
  refuse "--data path 'up/../inside' must not contain '..'" -- -C "$ONE_LINE" -d inside up/../inside missing
}

@test "data: symlinks that stay inside scratch, and a scratch folder behind a symlink, are accepted" {
  mkdir -p "$SCRATCH/$PROJECT/real/ds" "$BATS_TEST_TMPDIR/elsewhere"
  ln -s real/ds "$SCRATCH/$PROJECT/alias"
  dry -C "$ONE_LINE" -d alias real/ds/
  assert_output --partial "export HPC_DATA_TARBALL="
  # The same layout reached through a symlinked SCRATCH.
  mv "$SCRATCH" "$BATS_TEST_TMPDIR/elsewhere/scratch"
  ln -s "$BATS_TEST_TMPDIR/elsewhere/scratch" "$SCRATCH"
  dry -C "$ONE_LINE" -d alias real/ds/
  assert_output --partial "export HPC_DATA_TARBALL="
}

@test "data: a second path after one flag that does not exist" {
  mkdir -p "$SCRATCH/$PROJECT/a"
  refuse "--data path 'b' does not exist" -- -C "$ONE_LINE" -d a b
}

@test "data: -d with no path" {
  refuse "-d expects a value" -- -C "$ONE_LINE" -d -g 1
}

# --- credentials -------------------------------------------------------------

@test "credentials: a wandb key file others can read" {
  printf 'WANDB_API_KEY=fake\n' >"$HOME/wandb_credentials.txt"
  chmod 644 "$HOME/wandb_credentials.txt"
  refuse "$HOME/wandb_credentials.txt is readable by others (mode 644); run: chmod 600" -- -C "$ONE_LINE"
}

@test "credentials: a link to a private wandb key file is accepted (the file's mode counts, not the link's)" {
  (umask 077 && printf 'WANDB_API_KEY=fake\n' >"$BATS_TEST_TMPDIR/wandb key.txt")
  ln -s "$BATS_TEST_TMPDIR/wandb key.txt" "$HOME/wandb_credentials.txt"
  dry -C "$ONE_LINE"
}

@test "configs: -C together with a command after '--'" {
  refuse "-C/--configs names the experiments, and so do -w/--wandb-sweepid, --sweep and '-- COMMAND'; give only one" -- -C "$ONE_LINE" -- python train.py
}

@test "configs: -C together with a wandb sweep" {
  refuse "-C/--configs names the experiments" -- -C "$ONE_LINE" -w abc123 --sweep-count 2
}

@test "sbatch arg: a backslash" {
  refuse "--sbatch-arg must not contain" -- -C "$ONE_LINE" --sbatch-arg='--comment=a\b'
}

@test "time: D-HH:MM with hours above 23" {
  refuse "--time expects a SLURM time" -- -C "$ONE_LINE" -t 1-24:00
}

@test "an array above the cluster's MaxArraySize goes as several arrays; --no-submit and --wait are refused" {
  local bin="$BATS_TEST_TMPDIR/scontrol-bin"
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\nprintf "MaxArraySize            = 3\\n"\n' >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  PATH="$bin:$PATH" refuse "--no-submit: these 7 trials go as several array jobs (the cluster's MaxArraySize is 3)" -- -C "$ONE_LINE" --seeds 7 --no-submit
  PATH="$bin:$PATH" refuse "--wait follows one job; these 7 trials go as several array jobs (the cluster's MaxArraySize is 3)" -- -C "$ONE_LINE" --seeds 7 --wait
  PATH="$bin:$PATH" dry -C "$ONE_LINE" --seeds 7 --array-throttle 2
  assert_line '#SBATCH --array=0-2%2'
  # Submitted: three arrays of 3, 3 and 1 tasks, task K of each running trial F+K.
  stub_sbatch_recording
  run --separate-stderr env PATH="$bin:$PATH" "$SUBMITTER" -e split -C "$ONE_LINE" --seeds 7 --array-throttle 2 </dev/null
  assert_success
  local sub
  sub=$(submission_dirs split)
  assert_equal "$(grep -c -- '^--array=0-2%2$' "$STUB_SBATCH_LOG")" 2
  assert_equal "$(grep -c -- '^--array=0-0%2$' "$STUB_SBATCH_LOG")" 1
  run grep -- '^--export=' "$STUB_SBATCH_LOG"
  assert_output "--export=ALL
--export=ALL
--export=ALL"
  run grep -- '^HPC_TRIAL_OFFSET=' "$STUB_SBATCH_LOG.env"
  assert_output "HPC_TRIAL_OFFSET=0
HPC_TRIAL_OFFSET=3
HPC_TRIAL_OFFSET=6"
  assert_equal "$(grep -c '^HPC_CONTRACT_ON_COMMAND_LINE=1$' "$STUB_SBATCH_LOG.env")" 3
  assert_equal "$(cat "$sub/array_jobs")" "4242 0
4242 3
4242 6"
  assert_equal "$(wc -l <"$sub/job_ids")" 2
}

@test "--interactive: one trial, in the foreground, without what only a queued batch job has" {
  refuse "--interactive runs one trial, and this submission has 3: give one command after '--', or a configs file of one line" -- \
    -C "$THREE_LINES" --interactive
  local arg
  for arg in --no-submit --wait --no-signal '--signal USR2' '--signal-lead 60' '--max-requeues 2' '--seeds 2' '--array-throttle 2'; do
    # shellcheck disable=SC2086 # an option and its value, split on purpose
    refuse "--interactive runs one trial now, in the foreground; it does not take ${arg%% *}" -- -C "$ONE_LINE" --interactive $arg
  done
  dry -C "$ONE_LINE" --interactive
  refute_output --partial '#SBATCH --signal'
}

@test "early_terminate: an unknown type or a bad number is refused in one line, exit 2" {
  local sweep="$BATS_TEST_TMPDIR/early terminate.yml"
  printf '%s\n' 'program: p.py' 'method: grid' 'metric: {name: val_acc, goal: maximize}' \
    'parameters: {lr: {values: [0.1]}}' 'early_terminate: {type: asha, min_iter: 1}' >"$sweep"
  refuse "$sweep: early_terminate type must be hyperband, got 'asha'" -- --sweep "$sweep" -g 0 -W none
  sed -i 's/type: asha, min_iter: 1/type: hyperband, min_iter: 1, eta: 1/' "$sweep"
  refuse "$sweep: early_terminate eta must be at least 2, got 1" -- --sweep "$sweep" -g 0 -W none
}
