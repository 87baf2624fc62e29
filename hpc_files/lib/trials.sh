# shellcheck shell=bash disable=SC2034,SC2154
# (SC2034/SC2154: the opt_*, site_* and plan_* variables are shared by the
# libraries that job_submitter.sh sources together; shellcheck -x on
# job_submitter.sh checks them as a whole.)
# Experiments -> trials. A configs file, a sweep file, '--seeds' and a command
# after '--' all become one manifest through hpc_harness/trials.py (one code
# path): trials.jsonl (one JSON object per trial) and commands.txt (line K+1 is
# trial K's command as shell words, expanded on the node). A wandb sweep is K
# identical 'wandb agent --count 1' lines. Sourced; functions only.

# trials_python: a python for trials.py on this machine (stdlib; PyYAML for --sweep).
trials_python() {
  if [[ -n "${HPC_PYTHON:-}" ]]; then
    printf '%s' "$HPC_PYTHON"
  elif [[ -n "${opt_venv:-}" && -x "$opt_venv/bin/python" ]]; then
    printf '%s' "$opt_venv/bin/python"
  elif [[ -x "$source_dir/.venv/bin/python" ]]; then
    printf '%s' "$source_dir/.venv/bin/python"
  else
    printf '%s' python3
  fi
}

# trials_args: the experiment source as trials.py options (into trials_argv).
trials_args() {
  trials_argv=(--prog "$HPC_PROG")
  if [[ -n "${opt_sweep:-}" ]]; then
    trials_argv+=(--sweep "$opt_sweep" --sweep-seed "$opt_sweep_seed")
    [[ -z "${opt_trials:-}" ]] || trials_argv+=(--trials "$opt_trials")
  elif ((${#opt_command[@]} > 0)); then
    # The command after '--' is one configs line, quoted so it means exactly
    # the words given.
    inline_configs=$(mktemp "${TMPDIR:-/tmp}/hpc-inline.XXXXXX") || die "mktemp failed"
    register_cleanup "$inline_configs"
    shell_quote "${opt_command[@]}" >"$inline_configs"
    printf '\n' >>"$inline_configs"
    trials_argv+=(--configs "$inline_configs")
  else
    trials_argv+=(--configs "$opt_configs")
  fi
  [[ -z "${opt_seeds:-}" ]] || trials_argv+=(--seeds "$opt_seeds")
}

wandb_agent_line() {
  shell_quote wandb agent --count 1 "$opt_wandb_sweep"
}

# list_trials: print the manifest to stdout; writes nothing.
list_trials() {
  local k
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    for ((k = 0; k < opt_sweep_count; k++)); do
      printf '{"argv":["wandb","agent","--count","1","%s"],"params":{},"source":"wandb:%s","trial":%d}\n' \
        "$opt_wandb_sweep" "$opt_wandb_sweep" "$k"
    done
    return 0
  fi
  trials_args
  "$(trials_python)" "$HPC_HARNESS_DIR/trials.py" "${trials_argv[@]}" --list
}

# count_trials: how many trials, without writing anything (for --dry-run).
count_trials() {
  local count
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    printf '%s' "$opt_sweep_count"
    return 0
  fi
  count=$(list_trials | wc -l) || exit $?
  printf '%s' "$((count))"
}

# write_trials DIR: writes DIR/trials.jsonl and DIR/commands.txt; prints the count.
write_trials() {
  local dir=$1 k
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    list_trials >"$dir/trials.jsonl" || die "cannot write $dir/trials.jsonl"
    for ((k = 0; k < opt_sweep_count; k++)); do
      wandb_agent_line
      printf '\n'
    done >"$dir/commands.txt" || die "cannot write $dir/commands.txt"
    printf '%s' "$opt_sweep_count"
    return 0
  fi
  trials_args
  "$(trials_python)" "$HPC_HARNESS_DIR/trials.py" "${trials_argv[@]}" --out-dir "$dir"
}
