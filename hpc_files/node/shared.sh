# shellcheck shell=bash
# Facts that the login node (job_submitter.sh, plai_cleanups/) and the
# compute nodes (batch.sh, keeper.sh) both read, each read in one place:
# SLURM's record of a job, the .meta file beside a data tarball, and the W&B
# key in ~/wandb_credentials.txt.
# It lives in node/ because a submission folder gets a copy of node/*.sh and
# nothing else of hpc_files/. Sourced by node/lib.sh (the node scripts),
# lib/common.sh (the submitter and the cleanup) and tests/bats/test_helper.bash.
# Sourced; defines functions only.

# job_records JOB: 'scontrol show job -o JOB', one line per job or array task
# (a pending range of tasks is one line); nothing once slurmctld forgot JOB.
job_records() {
  scontrol show job -o "$1" 2>/dev/null
}

# job_record JOB: the first line of job_records JOB (the whole record of a
# plain job or of one array task 'A_K'); '' once slurmctld forgot JOB.
job_record() {
  local records
  records=$(job_records "$1") || records=""
  printf '%s' "${records%%$'\n'*}"
}

# record_field RECORD FIELD: the value of FIELD (JobState, ExitCode,
# Restarts, ...) in RECORD, one line of job_records; nothing and status 1
# when RECORD has no such field. Values are read up to the next space, as
# scontrol -o separates fields.
record_field() {
  local pattern=" $2=([^ ]*) "
  [[ " $1 " =~ $pattern ]] || return 1
  printf '%s' "${BASH_REMATCH[1]}"
}

# job_state JOB: JOB's JobState (its first record: for an array job id, the
# first task line scontrol prints); '' once slurmctld forgot JOB.
job_state() {
  record_field "$(job_record "$1")" JobState || true
}

# is_final_state STATE: a job in STATE will not run again by itself. Held
# jobs count (SPECIAL_EXIT and REQUEUE_HOLD wait for 'scontrol release'), so
# nothing that waits for a job's end waits for ever on one.
is_final_state() {
  case "$1" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) return 0 ;;
    SPECIAL_EXIT | REQUEUE_HOLD) return 0 ;;
    *) return 1 ;;
  esac
}

# meta_value META KEY: the value on the line KEY=VALUE of a data tarball's
# .meta file ('' when it has none; the first such line). The submitter
# (lib/data.sh stage_data_tarball) writes it with two keys: tarball_bytes
# (the tarball's size) and content_bytes (what it holds once extracted).
# Fails when META cannot be read.
meta_value() {
  local line
  while IFS= read -r line || [[ -n "$line" ]]; do
    if [[ "$line" == "$2="* ]]; then
      printf '%s' "${line#"$2"=}"
      return 0
    fi
  done <"$1"
}

# wandb_key_in FILE: the W&B key FILE holds: its line
# WANDB_API_KEY=<key> as in a dotenv file ('export' and quotes allowed), or
# its only line when that is the key alone. Blank lines and '#' comments do
# not count. Status 1 when other lines hold no key (a dotenv file without it:
# its lines run together are not a key); '' when the file holds nothing.
wandb_key_in() {
  local line found="" count=0 alone=""
  while IFS= read -r line || [[ -n "$line" ]]; do
    line=${line%$'\r'}
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [[ -n "$line" && "$line" != '#'* ]] || continue
    count=$((count + 1))
    [[ "$line" != "export "* ]] || line=${line#export }
    if [[ "$line" == WANDB_API_KEY=* ]]; then
      found=${line#WANDB_API_KEY=}
      found=${found#[\"\']}
      found=${found%[\"\']}
      break
    fi
    [[ "$line" == *=* ]] || alone=$line
  done <"$1"
  ((count != 1)) || [[ -n "$found" ]] || found=$alone
  printf '%s' "$found"
  [[ -n "$found" || count -eq 0 ]]
}

# readable_by_others FILE: FILE's mode when its group or others may read it,
# nothing when only its owner can: the W&B key file is refused then, at
# submission and on the node. -L: a link's own mode is always 777; what others
# can read is the file it leads to. Status 1 when stat fails.
readable_by_others() {
  local perms
  perms=$(stat -L -c %a "$1") || return 1
  ((8#$perms & 8#077)) || return 0
  printf '%s' "$perms"
}

# venv_stamp VENV: the file in which --setup-venv's job (setup_venv.sh) records
# the digest of the requirements the venv holds, once installed.
venv_stamp() {
  printf '%s/.hpc-requirements.sha256' "$1"
}
