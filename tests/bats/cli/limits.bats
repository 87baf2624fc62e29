#!/usr/bin/env bats
# What the cluster would refuse is refused at submission with its numbers:
# --time over the partition's MaxTime, memory over its nodes', an account
# that is not the user's. scontrol, sinfo and sacctmgr are stand-ins that
# answer as a production cluster (accounting in slurmdbd) would. No cluster.

load '../test_helper'
load 'cli_helper'

setup() {
  cli_setup
  local bin="$BATS_TEST_TMPDIR/cluster-bin"
  mkdir -p "$bin"
  cat >"$bin/scontrol" <<'STUB'
#!/usr/bin/env bash
case "$*" in
  "show config") printf 'AccountingStorageType   = accounting_storage/slurmdbd\nMaxArraySize            = 1001\n' ;;
  "show partition -o") printf 'PartitionName=cpu Default=YES MaxTime=1-00:00:00 MaxMemPerNode=UNLIMITED\nPartitionName=gpu MaxTime=03:00:00 MaxMemPerNode=40960\n' ;;
  "show partition cpu -o") printf 'PartitionName=cpu Default=YES MaxTime=1-00:00:00 MaxMemPerNode=UNLIMITED\n' ;;
  "show partition gpu -o") printf 'PartitionName=gpu MaxTime=03:00:00 MaxMemPerNode=40960\n' ;;
  *) exit 1 ;;
esac
STUB
  printf '#!/usr/bin/env bash\nprintf "30000\\n64000\\n"\n' >"$bin/sinfo"
  cat >"$bin/sacctmgr" <<'STUB'
#!/usr/bin/env bash
case "$*" in
  *"show assoc"*) printf 'rrg-lab\ndef-lab\ndef-lab\n' ;;
  *"show user"*) printf '%s\n' "${FAKE_DEFAULT_ACCOUNT-def-lab}" ;;
esac
STUB
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
  submit_ok -C "$ONE_LINE" -p gpu -t 03:00:00
}

@test "memory per node over the partition's MaxMemPerNode or its largest node: refused with both numbers" {
  refuse "this job asks for 61440 MiB per node (--mem 60G: -m/--mem-per-gpu x GPUs or processes) but partition 'gpu' allows 40960 MiB (MaxMemPerNode); lower -m" -- \
    -C "$ONE_LINE" -p gpu -g 2 -m 30G -t 1:00:00
  refuse "this job asks for 81920 MiB per node (--mem 80G: -m/--mem-per-gpu x GPUs or processes) but the largest node of partition 'cpu' has 64000 MiB; lower -m" -- \
    -C "$ONE_LINE" -g 2 -m 40G
  submit_ok -C "$ONE_LINE" -g 2 -m 30G
}

@test "an account that is not the user's, or none without a default: refused naming the user's accounts" {
  refuse "--account 'def-other' is not one of user alice's accounts: def-lab, rrg-lab" -- -C "$ONE_LINE" -a def-other
  FAKE_DEFAULT_ACCOUNT="" refuse "user alice has no default SLURM account; give one with -a/--account: def-lab, rrg-lab" -- -C "$ONE_LINE"
  submit_ok -C "$ONE_LINE" -a rrg-lab
  submit_ok -C "$ONE_LINE"
}

@test "--dry-run asks the cluster nothing" {
  dry -C "$ONE_LINE" -p gpu -t 04:00:00 -a def-other
}
