# shellcheck shell=bash
# Experiments -> trials. A configs file, a sweep file, '--seeds' and a command
# after '--' all become one manifest as hpc_harness/trials.py defines it:
# trials.jsonl (one JSON object per trial) and commands.txt (line K+1 is trial
# K's command as shell words, expanded on the node). trials.py writes it,
# except for experiments that need no parsing (trials_in_bash below writes
# the same bytes without starting a python). A wandb sweep is K identical
# 'wandb agent --count 1' lines. Sourced; functions only.

# trials_python [VAR]: a python for trials.py on this machine (stdlib; PyYAML for --sweep).
trials_python() {
  if [[ -n "${HPC_PYTHON:-}" ]]; then
    emit "${1:-}" "$HPC_PYTHON"
  elif [[ -n "${opt_venv:-}" && -x "$opt_venv/bin/python" ]]; then
    emit "${1:-}" "$opt_venv/bin/python"
  elif [[ -x "$source_dir/.venv/bin/python" ]]; then
    emit "${1:-}" "$source_dir/.venv/bin/python"
  else
    emit "${1:-}" python3
  fi
}

# require_trials_python PYTHON: stop with one line unless PYTHON runs and is
# 3.9+ (an old login node's python3 would die on trials.py with a traceback).
require_trials_python() {
  local version
  version=$("$1" -c 'import sys; print("%d.%d.%d" % tuple(sys.version_info[:3])); sys.exit(sys.version_info < (3, 9))' 2>/dev/null) && return 0
  [[ -n "$version" ]] || die "expanding trials needs python 3.9 or newer; cannot run '$1' (set HPC_PYTHON to a newer python, or pass --venv)"
  die "expanding trials needs python 3.9 or newer; $1 is $version (set HPC_PYTHON to a newer python, or pass --venv)"
}

# trials_args: the experiment source as trials.py options (into trials_argv).
trials_args() {
  trials_argv=(--prog "$HPC_PROG")
  if [[ -n "${opt_sweep:-}" ]]; then
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

# The same manifest without python, for experiments that need no parsing.
# Starting a python for trials.py takes about 30 ms, most of a submission;
# for the two common sources below the manifest is simple enough to write
# here, byte for byte as trials.py writes it (tests/bats/unit/lib_trials.bats
# compares the two):
#   - a command after '--' whose words are ASCII (any ASCII: quotes, '$',
#     tabs...): trials.py reads shell_quote's line back into the same words;
#   - a configs file in ASCII whose experiment lines are plain: words of
#     letters, digits and _./:=,+@%^-# separated by spaces or tabs, maybe
#     followed by a ' # comment'; blank and comment lines are skipped.
# Anything else (quotes, '\', '$' or a continuation in a configs line,
# non-ASCII, --seeds where a trial already passes --seed, no experiment at
# all) goes to trials.py, which stays the one authority on what a line means
# and on every error message; so do files over 200 lines and manifests over
# 1000 trials, which python writes faster than bash.

# trials_in_bash: fills trials_jsonl and trials_commands (one element per
# trial: its trials.jsonl and commands.txt lines) and returns 0, or returns
# 1 when trials.py must do it.
trials_in_bash() {
  local IFS=$' \t\n' word json argv text line number=0 seeds=0 i k trial=0
  local -a texts=() numbers=() argvs=() lines=() words=()
  # Python's str.strip() whitespace, in ASCII (a configs line has no \n).
  local strip_chars=$' \t\v\f\r\x1c\x1d\x1e\x1f'
  local plain_chars=$'[:alnum:]_./:=,+@%^# \t-'
  trials_jsonl=()
  trials_commands=()
  [[ -z "${opt_sweep:-}" && -z "${opt_wandb_sweep:-}" ]] || return 1
  [[ -z "${opt_seeds:-}" ]] || to_decimal "$opt_seeds" seeds
  if ((${#opt_command[@]} > 0)); then
    argv=""
    for word in "${opt_command[@]}"; do
      [[ "$word" != *[![:ascii:]]* && "$word" != *$'\n'* ]] || return 1
      ((seeds == 0)) || [[ "$word" != --seed && "$word" != --seed=* ]] || return 1
      json_string json "$word"
      argv+=${argv:+,}$json
    done
    shell_quote_to text "${opt_command[@]}"
    texts=("$text") numbers=(1) argvs=("$argv")
  else
    mapfile -n 201 -t lines 2>/dev/null <"$opt_configs" || return 1
    ((${#lines[@]} <= 200)) || return 1
    # read stops at a NUL byte with status 0: trials.py refuses such a file.
    ! IFS= read -r -d '' text 2>/dev/null <"$opt_configs" || return 1
    [[ "$text" != *[![:ascii:]]* ]] || return 1
    mapfile -t lines <<<"$text"
    for line in "${lines[@]}"; do
      number=$((number + 1))
      line=${line%$'\r'}
      text=${line#"${line%%[!"$strip_chars"]*}"}
      [[ -n "$text" && "$text" != \#* ]] || continue
      # A '#' after a space or tab starts a comment; what is left must be plain.
      text=${line%%[$' \t']#*}
      [[ "$text" != *[!$plain_chars]* ]] || return 1
      text=${text#"${text%%[!$' \t']*}"}
      text=${text%"${text##*[!$' \t']}"}
      # Plain words hold no quote and no glob character: split on spaces and tabs.
      # shellcheck disable=SC2206 # that splitting is the point
      words=($text)
      if ((seeds > 0)); then
        for word in "${words[@]}"; do
          [[ "$word" != --seed && "$word" != --seed=* ]] || return 1
        done
      fi
      printf -v argv '"%s",' "${words[@]}"
      texts+=("$text") numbers+=("$number") argvs+=("${argv%,}")
    done
  fi
  ((${#texts[@]} > 0 && ${#texts[@]} * (seeds > 0 ? seeds : 1) <= 1000)) || return 1
  for ((i = 0; i < ${#texts[@]}; i++)); do
    if ((seeds == 0)); then
      trials_jsonl+=("{\"argv\":[${argvs[i]}],\"params\":{},\"source\":\"configs:${numbers[i]}\",\"trial\":$trial}")
      trials_commands+=("${texts[i]}")
      trial=$((trial + 1))
      continue
    fi
    for ((k = 0; k < seeds; k++)); do
      trials_jsonl+=("{\"argv\":[${argvs[i]},\"--seed=$k\"],\"params\":{\"seed\":$k},\"source\":\"configs:${numbers[i]}\",\"trial\":$trial}")
      trials_commands+=("${texts[i]} --seed=$k")
      trial=$((trial + 1))
    done
  done
}

# json_string VAR TEXT: TEXT (ASCII) as a JSON string, as Python's json.dumps
# writes it: \" \\ \b \f \n \r \t, other control characters as \u00XX.
json_string() {
  local text=$2 rest before char bs=\\
  if [[ "$text" == *[\"\\[:cntrl:]]* ]]; then
    # Backslashes doubled by hand: bash 4.2 reads a '\\' in a replacement
    # string as one backslash. (A backslash before another character, as
    # below, means the same on every version.)
    rest=$text text=""
    while [[ "$rest" == *"$bs"* ]]; do
      before=${rest%%"$bs"*}
      text+=$before$bs$bs
      rest=${rest#*"$bs"}
    done
    text+=$rest
    text=${text//'"'/"$bs"'"'}
    text=${text//$'\b'/"${bs}b"}
    text=${text//$'\f'/"${bs}f"}
    text=${text//$'\n'/"${bs}n"}
    text=${text//$'\r'/"${bs}r"}
    text=${text//$'\t'/"${bs}t"}
    while [[ "$text" == *[[:cntrl:]]* ]]; do
      before=${text%%[[:cntrl:]]*}
      char=${text:${#before}:1}
      printf -v before '%su%04x' "$bs" "'$char"
      text=${text//"$char"/"$before"}
    done
  fi
  printf -v "$1" '"%s"' "$text"
}

wandb_agent_line() {
  shell_quote wandb agent --count 1 "$opt_wandb_sweep"
}

# list_trials: print the manifest to stdout; writes nothing.
list_trials() {
  local k python
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    for ((k = 0; k < plan_sweep_count; k++)); do
      printf '{"argv":["wandb","agent","--count","1","%s"],"params":{},"source":"wandb:%s","trial":%d}\n' \
        "$opt_wandb_sweep" "$opt_wandb_sweep" "$k"
    done
    return 0
  fi
  if trials_in_bash; then
    printf '%s\n' "${trials_jsonl[@]}"
    return 0
  fi
  trials_args
  trials_python python
  require_trials_python "$python"
  "$python" "$HPC_HARNESS_DIR/trials.py" "${trials_argv[@]}" --list
}

# write_trials DIR: writes DIR/trials.jsonl and DIR/commands.txt; sets
# trials_count. Exits as trials.py did when it refuses the experiments.
write_trials() {
  local dir=$1 k python out
  if [[ -n "${opt_wandb_sweep:-}" ]]; then
    list_trials >"$dir/trials.jsonl" || die "cannot write $dir/trials.jsonl"
    for ((k = 0; k < plan_sweep_count; k++)); do
      wandb_agent_line
      printf '\n'
    done >"$dir/commands.txt" || die "cannot write $dir/commands.txt"
    trials_count=$plan_sweep_count
    return 0
  fi
  if trials_in_bash; then
    printf '%s\n' "${trials_jsonl[@]}" >"$dir/trials.jsonl" || die "cannot write $dir/trials.jsonl"
    printf '%s\n' "${trials_commands[@]}" >"$dir/commands.txt" || die "cannot write $dir/commands.txt"
    trials_count=${#trials_jsonl[@]}
    return 0
  fi
  trials_args
  trials_python python
  require_trials_python "$python"
  out=$("$python" "$HPC_HARNESS_DIR/trials.py" "${trials_argv[@]}" --out-dir "$dir") || exit $?
  # method bayes prints 'COUNT FIRST': FIRST is this round's first trial.
  read -r trials_count bayes_first <<<"$out"
}

# bayes_journal: the study's journal file, in the experiment folder.
bayes_journal() {
  printf '%s/optuna.journal' "$plan_exp_dir"
}

# bayes_start ARGV...: method bayes, once the submission folder is written:
# the study (named after round 1's folder) in the journal holds this round's
# trials and they are the folder's manifest; bayes.json records what the
# controller needs (ARGV: the submitter's, replayed for the next round).
bayes_start() {
  [[ -n "${bayes_first:-}" ]] || return 0
  local python round=${HPC_BAYES_ROUND:-1}
  bayes_study=${HPC_BAYES_STUDY:-${submission_dir##*/}}
  trials_python python
  "$python" "$HPC_FILES_DIR/lib/bayes.py" start --submission "$submission_dir" \
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
  trials_python python
  shell_quote_to wrap "$python" "$HPC_FILES_DIR/lib/bayes.py" controller --submission "$submission_dir" --project "$project_name"
  output=$(cd "$submission_dir" && env -u WANDB_API_KEY sbatch "${args[@]}" --wrap="$wrap" 2>&1) ||
    die "sbatch refused the method-bayes controller job (round job $job_id is queued; run: $wrap): ${output//$'\n'/ }"
  bayes_controller_id=${output%%;*}
  printf '%s\n' "$bayes_controller_id" >"$submission_dir/bayes_controller_job_id"
  info "bayes: round ${HPC_BAYES_ROUND:-1} of ${opt_rounds:-1}; controller job $bayes_controller_id runs after job $job_id"
}
