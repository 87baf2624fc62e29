#!/usr/bin/env bash
# Submits a PyTorch training run to SLURM: parse options -> load the site
# profile -> validate -> plan the layout -> build the data tarball -> render one
# batch script in a submission folder -> sbatch (or only write the folder with
# --no-submit, or only print the script with --dry-run). See --help.
#
# Usage: bash hpc_files/job_submitter.sh [options] [-- COMMAND [ARG...]]
# Works from any directory: the project root is the folder holding hpc_files/.
set -euo pipefail

# This script's folder (the toolkit's hpc_files/), absolute, from its path
# (no dirname process); '.' when run by its name.
HPC_FILES_DIR=${BASH_SOURCE[0]%/*}
[[ "$HPC_FILES_DIR" != "${BASH_SOURCE[0]}" ]] || HPC_FILES_DIR=.
HPC_FILES_DIR=$(cd "$HPC_FILES_DIR" && pwd)
# shellcheck source=lib/common.sh
source "$HPC_FILES_DIR/lib/common.sh"
# shellcheck source=lib/options.sh
source "$HPC_FILES_DIR/lib/options.sh"
# shellcheck source=lib/site.sh
source "$HPC_FILES_DIR/lib/site.sh"
# shellcheck source=lib/validate.sh
source "$HPC_FILES_DIR/lib/validate.sh"
# shellcheck source=lib/plan.sh
source "$HPC_FILES_DIR/lib/plan.sh"
# shellcheck source=lib/trials.sh
source "$HPC_FILES_DIR/lib/trials.sh"
# shellcheck source=lib/data.sh
source "$HPC_FILES_DIR/lib/data.sh"
# shellcheck source=lib/render.sh
source "$HPC_FILES_DIR/lib/render.sh"
# shellcheck source=lib/submit.sh
source "$HPC_FILES_DIR/lib/submit.sh"
# shellcheck source=lib/limits.sh
source "$HPC_FILES_DIR/lib/limits.sh"
# shellcheck source=lib/experiment.sh
source "$HPC_FILES_DIR/lib/experiment.sh"

main() {
  trap 'stop_background; run_cleanup; remove_unsubmitted_dir' EXIT
  parse_options "$@"
  if [[ -n "${opt_help:-}" ]]; then
    print_help
    return 0
  fi
  if [[ -n "${opt_version:-}" ]]; then
    echo "job_submitter.sh $HPC_VERSION"
    return 0
  fi
  project_paths
  if [[ -n "${opt_retry_failed:-}" ]]; then
    retry_failed
    return 0
  fi
  apply_defaults
  if [[ -n "${opt_prune_data_cache:-}" ]]; then
    validate_scratch
    plan_paths
    prune_data_cache
    return 0
  fi
  ask_sweep_count
  start_code_record
  load_site
  ask_slurm
  validate_settings
  plan_settings
  if [[ -n "${opt_list_trials:-}" ]]; then
    list_trials
    return 0
  fi
  prepare_trials
  validate_data_paths
  start_data_digest
  validate_experiment_folder
  validate_allocation
  queue_after_running
  check_wandb_credentials
  finish_trials
  refuse_bayes_unsubmitted
  refuse_bayes_over_trials
  plan_array "$trials_count" "${bayes_first:-}"
  validate_array_size "$plan_trial_count"
  validate_interactive_trials "$plan_trial_count"
  plan_array_split
  if [[ -n "${opt_dry_run:-}" ]]; then
    preview_submission
    return 0
  fi
  make_submission_dir
  plan_submission_folder "$submission_dir"
  fill_submission_dir "$@"
  prune_start
  stage_data_tarball
  render_script >"$submission_dir/job.sbatch" || die "cannot write $submission_dir/job.sbatch"
  warn_if_other_command_checkpointed
  if [[ -n "${opt_no_submit:-}" ]]; then
    report_unsubmitted
    return 0
  fi
  clear_stop_record
  [[ -z "${opt_interactive:-}" ]] || run_interactive
  bayes_start "$@"
  submit_setup_job
  submit_job
  submit_bayes_controller
  report_submission
  [[ -z "${opt_wait:-}" ]] || wait_for_job
}

# Sourced, it only defines main (the golden plan fixtures are made so).
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0
main "$@"
