#!/usr/bin/env bash
# shellcheck disable=SC2016 # backticks in single quotes are Markdown code spans
# Data staging to node-local disk, page cache dropped before every run:
#   toolkit      hpc_files/node/keeper.sh itself (checks the tarball's .meta
#                and the free space, then 'tar -C DEST -xf TARBALL'), cache hit
#   tar_xf       bare 'tar -C DEST -xf TARBALL' (the anchor)
#   tar_pipe     'tar -C SRC -cf - . | tar -C DEST -xf -' (no tarball)
#   cp_r         'cp -r SRC DEST'
#   tar_xf_read  tar_xf, then read every file once (what training then does)
#   sqfs_read    'squashfuse IMAGE MNT', read every file once, unmount
#   tar_create   the first-time cost: the tarball as job_submitter.sh builds it
#   mksquashfs   the first-time cost of the squashfs image
# for 20,000 x 8 KiB files and for 4 x 64 MiB files (random, incompressible),
# interleaved after a discarded warm-up round.
#
# Usage: bench/staging.sh [--smoke] [--reps N] [--out FILE]   (as root, for drop_caches)
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_options 5 "$@"

bench_workdir staging "${BENCH_STAGING_DIR:-/var/tmp}"
mnt="$work/mnt"
bench_mount=$mnt
mkdir -p "$mnt" "$work/scratch/datasets" "$work/submission"

if [[ -n "$smoke" ]]; then
  # A smoke run checks that the script runs: dropping the page cache would
  # make every suite beside it (make test) read its files back from disk.
  cache_note="**warm cache** (--smoke: the page cache is not dropped)"
  cold=0
elif drop_caches; then
  cache_note="page cache dropped (\`sync; echo 3 > /proc/sys/vm/drop_caches\`) before every run"
  cold=1
else
  cache_note="**warm cache**: dropping the page cache is not permitted here ($(id -un)), so every number below is a warm-cache number"
  cold=0
fi

# make_dataset NAME COUNT BYTES: COUNT random files of BYTES each, 1000 per folder.
make_dataset() {
  "$BENCH_PY" - "$work/scratch/datasets/$1" "$2" "$3" <<'PY'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    sub = os.path.join(root, f"d{i // 1000:03d}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"f{i:06d}.bin"), "wb") as f:
        f.write(os.urandom(size))
PY
}

# build_tarball NAME TARBALL: exactly what lib/data.sh does (tar, then .meta).
build_tarball() {
  local name=$1 tarball=$2 bytes
  tar -C "$work/scratch" -cf "$tarball" -- "datasets/$name"
  bytes=$(du -sb --apparent-size "$work/scratch/datasets/$name" | cut -f1)
  printf 'tarball_bytes=%s\ncontent_bytes=%s\n' "$(stat -c %s "$tarball")" "$bytes" >"$tarball.meta"
}

read_all() {
  find "$1" -type f -print0 | xargs -0 cat >/dev/null
}

sqfs_error=""
# run_config CONFIG NAME: one timed run on data set NAME (prints seconds).
run_config() {
  local config=$1 name=$2 dest="$work/dest" tarball="$work/$2.tar" image="$work/$2.sqfs" t0
  rm -rf -- "${dest:?}" "$work/created.tar" "$work/created.sqfs"
  mkdir -p "$dest"
  ((cold == 0)) || drop_caches
  t0=$(now)
  case "$config" in
    toolkit)
      env -u HPC_STAGE_OUT -u HPC_COMPRESS SLURM_JOB_ID=bench SLURMD_NODENAME=bench \
        HPC_SUBMISSION_DIR="$work/submission" HPC_TMPDIR_MIMIC=0 SLURM_TMPDIR="$dest" \
        HPC_DATA_TARBALL="$tarball" bash "$BENCH_ROOT/hpc_files/node/keeper.sh" >/dev/null
      ;;
    tar_xf) tar -C "$dest" -xf "$tarball" ;;
    tar_pipe) tar -C "$work/scratch" -cf - "datasets/$name" | tar -C "$dest" -xf - ;;
    cp_r) cp -r "$work/scratch/datasets/$name" "$dest/" ;;
    tar_xf_read)
      tar -C "$dest" -xf "$tarball"
      read_all "$dest"
      ;;
    sqfs_read)
      squashfuse "$image" "$mnt"
      read_all "$mnt"
      fusermount -u "$mnt"
      ;;
    tar_create) build_tarball "$name" "$work/created.tar" ;;
    mksquashfs) mksquashfs "$work/scratch/datasets/$name" "$work/created.sqfs" -noappend -quiet -no-progress >/dev/null ;;
  esac
  since "$t0"
}

commands="$work/commands.tsv"
{
  printf 'toolkit\t%s\n' "hpc_files/node/keeper.sh (meta + df checks, tar -C DEST -xf TARBALL)"
  printf 'tar_xf\t%s\n' "tar -C DEST -xf TARBALL"
  printf 'tar_pipe\t%s\n' "tar -C SRC -cf - DATA | tar -C DEST -xf -"
  printf 'cp_r\t%s\n' "cp -r SRC/DATA DEST/"
  printf 'tar_xf_read\t%s\n' "tar -C DEST -xf TARBALL; cat every file"
  printf 'sqfs_read\t%s\n' "squashfuse IMAGE MNT; cat every file; fusermount -u MNT"
  printf 'tar_create\t%s\n' "tar -C SCRATCH -cf TARBALL -- DATA (+ .meta), as lib/data.sh"
  printf 'mksquashfs\t%s\n' "mksquashfs DATA IMAGE -noappend (gzip, default)"
} >"$commands"

if [[ -n "$smoke" ]]; then
  datasets=("small:500:8192" "large:2:4194304")
else
  datasets=("small:20000:8192" "large:4:67108864")
fi

load_before=$(loadavg)
sections=""
for spec in "${datasets[@]}"; do
  IFS=: read -r name count bytes <<<"$spec"
  bench_note "creating $name: $count x $bytes bytes"
  make_dataset "$name" "$count" "$bytes"
  build_tarball "$name" "$work/$name.tar"
  configs=(toolkit tar_xf tar_pipe cp_r tar_xf_read)
  if mksquashfs "$work/scratch/datasets/$name" "$work/$name.sqfs" -noappend -quiet -no-progress >/dev/null 2>"$work/mksquashfs.err"; then
    if squashfuse "$work/$name.sqfs" "$mnt" 2>"$work/fuse.err" && fusermount -u "$mnt"; then
      configs+=(sqfs_read)
    else
      sqfs_error="squashfuse failed: $(tr '\n' ' ' <"$work/fuse.err")"
    fi
    configs+=(mksquashfs)
  else
    sqfs_error="mksquashfs failed: $(tr '\n' ' ' <"$work/mksquashfs.err")"
  fi
  configs+=(tar_create)
  samples="$work/$name.tsv"
  for r in "${rounds[@]}"; do
    for c in $(round_order "$r" "${configs[@]}"); do
      s=$(run_config "$c" "$name")
      ((r < 0)) || record "$samples" "$c" "$r" "$s"
    done
    bench_note "$name: round $r done"
  done
  rm -rf -- "${work:?}/dest"
  tar_bytes=$(stat -c %s "$work/$name.tar")
  sqfs_bytes=$([[ -f "$work/$name.sqfs" ]] && stat -c %s "$work/$name.sqfs" || echo n/a)
  toolkit_ratio=$("$BENCH_PY" - "$samples" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(dict)
for line in open(sys.argv[1]):
    c, r, v = line.split("\t")
    d[c][int(r)] = float(v)
rs = [d["toolkit"][r] / d["tar_xf"][r] for r in d["toolkit"] if r in d["tar_xf"]]
print(f"{statistics.median(rs):.3f}")
PY
)
  goal=$(awk -v r="$toolkit_ratio" 'BEGIN { print (r <= 1.1 ? "met" : "NOT met") }')
  sections+=$(
    printf '\n### %s: %s files x %s bytes (tarball %s bytes, squashfs image %s bytes)\n\n' \
      "$name" "$count" "$bytes" "$tar_bytes" "$sqfs_bytes"
    md_table "$samples" "$commands" tar_xf "toolkit,tar_xf,tar_pipe,cp_r,tar_xf_read,sqfs_read,tar_create,mksquashfs"
    printf '\nToolkit cache-hit extraction = **%sx bare `tar -xf`** (goal <= 1.1x: %s). ' "$toolkit_ratio" "$goal"
    printf 'First-time cost = `tar_create` + `toolkit` (the tarball is built once per data change, then every job only extracts).\n'
  )
  sections+=$'\n'
done
load_after=$(loadavg)

section=$(
  printf '## 3. Data staging (node-side extraction)\n\n'
  printf 'Source, tarball, image and destination on the same disk (%s). %s; the clean-up (rm of the last destination, sync) is not timed. ' \
    "$(df -PT "$work" | awk 'NR == 2 { print $2 " on " $1 }')" "$cache_note"
  printf '%s interleaved reps after %s. Load before/after: %s / %s.\n' "$reps" \
    "$(warmup_note)" "$load_before" "$load_after"
  [[ -z "$sqfs_error" ]] || printf '\nsquashfs: %s\n' "$sqfs_error"
  printf '%s\n' "$sections"
)
bench_section "$section"
