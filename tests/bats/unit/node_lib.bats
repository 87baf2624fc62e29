#!/usr/bin/env bats
# hpc_files/node/lib.sh: functions shared by the node-side scripts, called
# directly (the file only defines functions).

load '../test_helper'

# in_lib CODE: run CODE (set -euo pipefail) after sourcing node/lib.sh.
in_lib() {
  run --separate-stderr bash -c 'set -euo pipefail
    source "$1/hpc_files/node/lib.sh"
    eval "$2"' _ "$REPO_ROOT" "$1"
}

setup() {
  base="$BATS_TEST_TMPDIR/shared base"
  mkdir -p "$base"
  export base
}

@test "private_dir creates a missing folder with mode 0700" {
  in_lib 'private_dir "$base/me"; private_dir "$base/me/123"; stat -c %a "$base/me" "$base/me/123"'
  assert_success
  assert_equal "$output" $'700\n700'
}

@test "private_dir keeps an own folder and makes it private" {
  mkdir -m 0755 "$base/me"
  in_lib 'private_dir "$base/me"; stat -c %a "$base/me"'
  assert_success
  assert_output 700
}

@test "private_dir refuses a symlinked folder, even one pointing at an own folder" {
  mkdir "$BATS_TEST_TMPDIR/elsewhere"
  ln -s "$BATS_TEST_TMPDIR/elsewhere" "$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me is a symlink; refusing to use it (remove it, or ask whoever made it)"
  ln -s "$BATS_TEST_TMPDIR/nowhere" "$base/dangling"
  in_lib 'private_dir "$base/dangling"'
  assert_failure 1
  assert_file_not_exists "$BATS_TEST_TMPDIR/nowhere"
}

@test "private_dir refuses a file in the folder's place" {
  : >"$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me exists and is not a folder; refusing to use it"
}

@test "private_dir refuses a folder owned by another user" {
  [[ $(id -u) == 0 ]] || skip "needs root to make a folder owned by someone else"
  mkdir "$base/me"
  chown nobody "$base/me"
  in_lib 'private_dir "$base/me"'
  assert_failure 1
  assert_equal "$output" "$base/me is owned by nobody, not by $(id -un); refusing to use it"
}

@test "master_port stays below Linux's ephemeral range and off ports services use" {
  # Linux picks outgoing ports in 32768-60999: a rendezvous port there can be
  # taken by any connection on the node. 29500 is torch's default port.
  # Job ids over two turns of the port range (every 53rd), and every id whose
  # port lands beside a port stepped over.
  in_lib 'turn=$((14000 - ${#MASTER_PORT_AVOID[@]}))
    ids=$(seq 0 53 $((2 * turn)))
    for avoid in "${MASTER_PORT_AVOID[@]}"; do
      ids+=" $(seq $((avoid - 15000 - 16)) $((avoid - 15000 + 1)))"
    done
    for id in $ids 12768 14000 14001 18768 27999 $((turn - 1)) $turn; do
      SLURM_JOB_ID=$id master_port; echo
    done | sort -un'
  assert_success
  local port
  for port in ${output}; do
    ((port >= 15000 && port < 29000)) || fail "port $port is outside 15000-28999"
    case "$port" in
      15672 | 1699[2-5] | 1700[12] | 17500 | 2400[78] | 25565 | 2701[789] | 28015)
        fail "port $port is one a common service uses" ;;
    esac
  done
}

@test "master_port is the same on every node of a job and differs between neighbouring jobs" {
  in_lib 'a=$(SLURM_JOB_ID=500 SLURMD_NODENAME=n1 master_port); b=$(SLURM_JOB_ID=500 SLURMD_NODENAME=n2 master_port)
    c=$(SLURM_JOB_ID=501 master_port); [[ $a == "$b" && $a != "$c" ]]'
  assert_success
}

@test "master_port gives neighbouring jobs distinct ports, also beside the ports stepped over" {
  # a port stepped over must not land on the next job's (15672 is stepped over)
  in_lib 'for id in 672 673 1992 1993 1994 1995 1996 1997 13014 13015 13016 13017; do
      SLURM_JOB_ID=$id master_port; echo
    done | sort -u | wc -l'
  assert_success
  assert_output 12
}

@test "shared_base_ok accepts a private or sticky base and refuses one others may rename in" {
  mkdir -m 0755 "$base/private"
  mkdir -m 1777 "$base/sticky"
  mkdir -m 0777 "$base/open"
  mkdir -m 0775 "$base/group"
  chmod 0777 "$base/open"
  chmod 0775 "$base/group"
  in_lib 'shared_base_ok "$base/private" && shared_base_ok "$base/sticky" && echo fine'
  assert_success
  assert_output fine
  in_lib 'shared_base_ok "$base/open"'
  assert_failure 1
  assert_output "$base/open is writable by other users without the sticky bit (mode 777), so they could swap the folders in it; ask the admins to chmod +t it, or pick another tmpdir_base"
  in_lib 'shared_base_ok "$base/group"'
  assert_failure 1
  assert_output --partial "(mode 775)"
}

@test "private_dir says so when the folder cannot be created" {
  in_lib 'private_dir "$base/no such parent/me"'
  assert_failure 1
  assert_output "cannot create $base/no such parent/me (is its parent writable by you?)"
}

@test "record_exit writes <run>/exit/task<PROCID> as 'STATUS NODE'; exit_records reads them back, oldest first" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub mission" SLURM_JOB_ID=77
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
  in_lib 'SLURM_PROCID=2 SLURMD_NODENAME=node2 record_exit 7
    SLURM_PROCID=0 SLURMD_NODENAME=node1 record_exit 0
    SLURM_PROCID=1 record_exit 143
    touch -d "2026-01-01 10:00:02" "$HPC_SUBMISSION_DIR/runs/77/exit/task0"
    touch -d "2026-01-01 10:00:01" "$HPC_SUBMISSION_DIR/runs/77/exit/task2"
    touch -d "2026-01-01 10:00:03" "$HPC_SUBMISSION_DIR/runs/77/exit/task1"
    exit_records'
  assert_success
  assert_equal "$(cat "$HPC_SUBMISSION_DIR/runs/77/exit/task2")" "7 node2"
  assert_output "7 node2 task2
0 node1 task0
143 ? task1"
}

@test "exit_records: nothing without exit files; a file cut short is left out" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub" SLURM_JOB_ID=78
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
  in_lib 'exit_records'
  assert_success
  assert_output ""
  mkdir -p "$HPC_SUBMISSION_DIR/runs/78/exit"
  : >"$HPC_SUBMISSION_DIR/runs/78/exit/task0"
  printf '1' >"$HPC_SUBMISSION_DIR/runs/78/exit/task1"
  in_lib 'exit_records'
  assert_success
  assert_output "1 ? task1"
}

@test "hpc_log on stdout, hpc_error on stderr, each with its prefix" {
  in_lib 'hpc_log "staged x"; hpc_error "it broke"'
  assert_success
  assert_equal "$output" "hpc: staged x"
  assert_equal "$stderr" "hpc: error: it broke"
}

@test "job_key and trial_index: 'A_K' and K for an array task, the job id and 0 for a plain job" {
  SLURM_JOB_ID=501 SLURM_ARRAY_JOB_ID=500 SLURM_ARRAY_TASK_ID=3 in_lib 'printf "%s %s" "$(job_key)" "$(trial_index)"'
  assert_output "500_3 3"
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
  SLURM_JOB_ID=77 in_lib 'printf "%s %s" "$(job_key)" "$(trial_index)"'
  assert_output "77 0"
}

@test "mimic_tmpdir: <base>/<user>/<job key>/<node>; uses_mimic_tmpdir follows HPC_TMPDIR_MIMIC" {
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
  HPC_TMPDIR_BASE="$base" USER=alice SLURM_JOB_ID=77 SLURMD_NODENAME=nodeA in_lib 'mimic_tmpdir; echo; mimic_tmpdir nodeB'
  assert_output "$base/alice/77/nodeA
$base/alice/77/nodeB"
  HPC_TMPDIR_MIMIC=1 in_lib 'uses_mimic_tmpdir'
  assert_success
  HPC_TMPDIR_MIMIC=0 in_lib 'uses_mimic_tmpdir'
  assert_failure
}

@test "first_node: the first host of the node list (scontrol show hostnames), else this node" {
  local bin="$BATS_TEST_TMPDIR/bin"
  mkdir -p "$bin"
  printf '#!/usr/bin/env bash\n[[ "$1 $2 $3" == "show hostnames node[3-4]" ]] || exit 1\nprintf "node3\\nnode4\\n"\n' >"$bin/scontrol"
  chmod +x "$bin/scontrol"
  PATH="$bin:$PATH" SLURM_JOB_NODELIST='node[3-4]' in_lib 'first_node'
  assert_output node3
  PATH="$bin:$PATH" SLURM_JOB_NODELIST='other[1-2]' SLURMD_NODENAME=here in_lib 'first_node'
  assert_output here
  # One plain host is the first without asking scontrol (this one fails).
  PATH="$bin:$PATH" SLURM_JOB_NODELIST='gpu-a7' SLURMD_NODENAME=here in_lib 'first_node'
  assert_output gpu-a7
  PATH="$bin:$PATH" SLURM_JOB_NODELIST='a1,b2' SLURMD_NODENAME=here in_lib 'first_node'
  assert_output here
}

@test "trial_command_line: line K+1 of commands.txt for array task K; a missing line fails, naming the trial" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$HPC_SUBMISSION_DIR"
  printf '%s\n' "python a.py --lr 1" "python a.py --lr 2" >"$HPC_SUBMISSION_DIR/commands.txt"
  SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=1 SLURM_JOB_ID=6 in_lib 'trial_command_line'
  assert_output "python a.py --lr 2"
  unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
  SLURM_JOB_ID=6 in_lib 'trial_command_line'
  assert_output "python a.py --lr 1"
  SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=7 SLURM_JOB_ID=6 in_lib 'trial_command_line'
  assert_failure
  assert_equal "$stderr" "hpc: error: commands.txt has no line for trial 7"
}

@test "load_runtime: sources the submission's runtime_<HPC_RUNTIME>.sh (venv by default)" {
  export HPC_SUBMISSION_DIR="$BATS_TEST_TMPDIR/sub"
  mkdir -p "$HPC_SUBMISSION_DIR/node"
  printf 'runtime_exec() { echo "venv: $*"; }\n' >"$HPC_SUBMISSION_DIR/node/runtime_venv.sh"
  printf 'runtime_exec() { echo "container: $*"; }\n' >"$HPC_SUBMISSION_DIR/node/runtime_singularity.sh"
  unset HPC_RUNTIME
  in_lib 'load_runtime; runtime_exec a b'
  assert_output "venv: a b"
  HPC_RUNTIME=singularity in_lib 'load_runtime; runtime_exec a b'
  assert_output "container: a b"
}
