#!/usr/bin/env bats
# What the cluster would refuse is refused at submission with its numbers:
# --time over the partition's MaxTime, memory over its nodes', an account
# that is not the user's. scontrol and sinfo are stand-ins that answer as a
# production cluster (accounting in slurmdbd) would. No cluster.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  local bin="$BATS_TEST_TMPDIR/cluster-bin"
  mkdir -p "$bin"
  # The controller's answers of a cluster that keeps accounts (slurmdbd):
  # partitions, and alice's associations (def-lab, rrg-lab) and default
  # account. 'scontrol -o' reads its commands from stdin, as scontrol does
  # (echoing each after its prompt); its status is the last failed one's.
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
answer() {
case "$*" in
  "show config") printf 'MaxArraySize            = 1001\n' ;;
  "show partition") printf 'PartitionName=cpu Default=YES MaxTime=1-00:00:00 MaxMemPerNode=UNLIMITED\nPartitionName=gpu MaxTime=03:00:00 MaxMemPerNode=40960\n' ;;
  "show assoc_mgr users=alice flags=users,assoc")
    printf 'Current Association Manager state\n\n'
    case "${FAKE_ASSOCIATIONS:-}" in
      fail) printf 'slurm_load_assoc_mgr_info error\n'; return 1 ;;
      none) printf 'No users currently cached in Slurm.\n\n\nNo associations currently cached in Slurm.\n'; return 0 ;;
      others) printf 'No users currently cached in Slurm.\n\n\nAssociation Records\n\nClusterName=c Account=root UserName= Partition= Priority=0 ID=1\n'; return 0 ;;
    esac
    printf 'User Records\n\n'
    printf 'UserName=alice(1000) DefAccount=%s DefWckey= AdminLevel=None\n\n' "${FAKE_DEFAULT_ACCOUNT-def-lab}"
    printf 'Association Records\n\n'
    printf 'ClusterName=c Account=root UserName= Partition= Priority=0 ID=1\n    ParentAccount= Lft=1 DefAssoc=No\n'
    printf 'ClusterName=c Account=rrg-lab UserName=alice(1000) Partition= Priority=0 ID=6\n    ParentAccount= Lft=4 DefAssoc=No\n'
    printf 'ClusterName=c Account=def-lab UserName=alice(1000) Partition= Priority=0 ID=4\n    ParentAccount= Lft=2 DefAssoc=Yes\n'
    printf 'ClusterName=c Account=def-lab UserName=alice(1000) Partition=gpu Priority=0 ID=7\n    ParentAccount= Lft=3 DefAssoc=No\n'
    ;;
  *) return 1 ;;
esac
}
if [[ "$*" == -o ]]; then
  rc=0
  while read -r command; do
    printf 'scontrol: %s\n' "$command"
    answer "$command" || rc=1
  done
  exit "$rc"
fi
answer "$@"
STUB
  printf '#!/usr/bin/env bash\n[[ "$*" == "-h -o %%R %%m" ]] || exit 1\nprintf "cpu 30000\\ncpu 64000\\ngpu 64000\\nother 999999\\n"\n' >"$bin/sinfo"
  chmod +x "$bin"/*
  export PATH="$bin:$PATH" USER=alice
}

# submit_ok ARG...: job_submitter.sh ARG... succeeds (sbatch is stubbed).
submit_ok() {
  run --separate-stderr timeout 60 "$SUBMITTER" "$@" </dev/null
  ((status == 0)) || fail "job_submitter.sh $* exited $status: $stderr"
}

@test "--time over the partition's MaxTime: refused with both numbers" {
  refuse "--time 04:00:00 (14400 s) is over the MaxTime of partition 'gpu', 03:00:00 (10800 s); lower -t or pick another partition with -p" -- \
    -C "$ONE_LINE" -p gpu -t 04:00:00
  refuse "--time 2-00 (172800 s) is over the MaxTime of partition 'cpu', 1-00:00:00 (86400 s)" -- -C "$ONE_LINE" -t 2-00
  # One scontrol asks for the partitions and the accounts: a failed account
  # question loses neither the partition check nor the submission.
  FAKE_ASSOCIATIONS=fail refuse "--time 04:00:00 (14400 s) is over the MaxTime of partition 'gpu'" -- -C "$ONE_LINE" -p gpu -t 04:00:00
  submit_ok -C "$ONE_LINE" -p gpu -t 03:00:00
  FAKE_ASSOCIATIONS=fail submit_ok -C "$ONE_LINE" -a def-other
}

@test "memory per node over the partition's MaxMemPerNode or its largest node: refused with both numbers" {
  refuse "this job asks for 61440 MiB per node (--mem 60G: -m/--mem-per-gpu x GPUs or processes) but partition 'gpu' allows 40960 MiB (MaxMemPerNode); lower -m" -- \
    -C "$ONE_LINE" -p gpu -g 2 -m 30G -t 1:00:00
  refuse "this job asks for 81920 MiB per node (--mem 80G: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition 'cpu' has 64000 MiB; lower -m" -- \
    -C "$ONE_LINE" -g 2 -m 40G
  # --sbatch-arg's --mem is the job's memory per node: checked as it is.
  refuse "this job asks for 51200 MiB per node (--mem 50G: -m/--mem-per-gpu x GPUs or processes) but partition 'gpu' allows 40960 MiB (MaxMemPerNode); lower -m" -- \
    -C "$ONE_LINE" -p gpu -g 1 -m 10G -t 1:00:00 --sbatch-arg=--mem=50G
  submit_ok -C "$ONE_LINE" -g 2 -m 30G
  submit_ok -C "$ONE_LINE" -p gpu -g 1 -m 30G -t 1:00:00 --sbatch-arg=--mem=0
}

@test "an account that is not the user's, or none without a default: refused naming the user's accounts" {
  refuse "--account 'def-other' is not one of user alice's accounts: def-lab, rrg-lab" -- -C "$ONE_LINE" -a def-other
  FAKE_DEFAULT_ACCOUNT="" refuse "user alice has no default SLURM account; give one with -a/--account: def-lab, rrg-lab" -- -C "$ONE_LINE"
  # Accounting on, but alice in no association.
  FAKE_ASSOCIATIONS=others refuse "user alice has no SLURM account on this cluster (sacctmgr show assoc); ask the admins for one" -- -C "$ONE_LINE"
  submit_ok -C "$ONE_LINE" -a rrg-lab
  submit_ok -C "$ONE_LINE"
  # No accounting at all: SLURM decides.
  FAKE_ASSOCIATIONS=none submit_ok -C "$ONE_LINE" -a def-other
}

@test "--dry-run asks the cluster nothing" {
  dry -C "$ONE_LINE" -p gpu -t 04:00:00 -a def-other
}

@test "a submission, and a refusal while trials.py runs beside the checks, leave nothing in TMPDIR" {
  export TMPDIR="$BATS_TEST_TMPDIR/tmp"
  mkdir -p "$TMPDIR"
  refuse "--account 'def-other' is not one of user alice's accounts" -- -C "$ONE_LINE" -a def-other
  run find "$TMPDIR" -mindepth 1
  assert_output ''
  submit_ok -C "$ONE_LINE"
  run find "$TMPDIR" -mindepth 1
  assert_output ''
}
