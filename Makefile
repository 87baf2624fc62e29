# Two commands do all set-up on a fresh Debian/Ubuntu machine (as root):
#   make demo   install what is missing, start the local SLURM cluster, submit
#               the example 2-node training job through hpc_files/job_submitter.sh
#   make test   install what is missing, run shellcheck, ruff, bats (unit and
#               CLI under the default bash and bash 4.2; integration and
#               reliability on local clusters), pytest and the benchmarks'
#               smoke run
#   make test-portability  the integration suite with bash 4.2 first on PATH,
#               then on a local SLURM 24.11 cluster beside the default one
#   make bench  run the benchmarks (bench/) and rewrite docs/reports/BENCHMARKS.md
#   make gpu-check  on a machine with a CUDA GPU: the loop-overhead benchmark on
#               it (rewrites docs/reports/BENCHMARKS_GPU.md) and the harness's tests with CUDA
#   make mutation  mutation testing of the training core (mutmut, fast
#               tests only, under 60 min on 2 cores): rewrites docs/reports/MUTATION.md
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
CLUSTER := local_cluster/cluster.sh
export SLURM_CONF ?= $(CURDIR)/.cluster/etc/slurm.conf
BATS_JOBS ?= 1

.PHONY: help deps demo test lint shellcheck ruff cluster-suites \
	check-bash42 bats-unit bats-unit-bash42 bats-unit-both cpu-suites bats-integration bats-reliability suites test-portability pytest test-reliability cluster-up cluster-up-reliability cluster-down cluster-status golden \
	bench bench-smoke bench-smoke-cluster bench-smoke-cpu gpu-check mutation

help:
	@sed -n 's/^#   //p' Makefile

deps:
	@tools/install_deps.sh all

cluster-up: deps
	@$(CLUSTER) up

cluster-down:
	@$(CLUSTER) down
	@[[ ! -d $(RELIABILITY_CLUSTER) ]] || HPC_CLUSTER_DIR=$(RELIABILITY_CLUSTER) $(CLUSTER) down

cluster-status:
	@$(CLUSTER) status

demo: cluster-up
	@tools/demo.sh

lint: shellcheck ruff check-bash42

# Two shellcheck processes (each file is checked on its own, sources
# followed): both cores instead of one.
shellcheck: deps
	@files=$$(tools/shell_files.sh); echo "shellcheck: $$(wc -w <<<"$$files") files"; \
	  xargs -P 2 -n 20 shellcheck -x <<<"$$files"

# Fails on bash constructs newer than 4.2 (what it checks: its header).
check-bash42:
	@BASH42_OPTIONAL=1 tools/check_bash42.sh

ruff: deps
	@$(VENV)/bin/ruff check hpc_harness hpc_search hpc_files tests bench
	@$(VENV)/bin/ruff format --check hpc_harness hpc_search hpc_files tests bench

# $(call beside,BACKGROUND,FOREGROUND): both commands at once; BACKGROUND's
# output is kept and printed when both have ended; fails if either failed.
beside = log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
  $(1) >"$$log" 2>&1 & background=$$!; \
  rc=0; $(2) || rc=$$?; \
  wait "$$background" || rc=$$?; cat "$$log"; exit "$$rc"

# $(call timed,NAME,COMMAND): COMMAND, then a line with its wall time and
# the CPU its processes used (times: user and system of the children this
# shell waited for; jobs on the local cluster are slurmd's, not counted), so
# that make test's log says where its time goes.
timed = start=$$SECONDS; rc=0; $(2) || rc=$$?; \
  cpu=$$(mktemp); times >"$$cpu"; \
  echo "time: $(1) $$((SECONDS - start)) s, CPU $$(tail -n 1 "$$cpu")"; rm -f "$$cpu"; exit "$$rc"

# Unit and CLI tests: no cluster needed (sbatch is stubbed where it must be).
bats-unit: deps
	@$(call timed,bats-unit,bats --timing --jobs $(BATS_JOBS) -r tests/bats/unit tests/bats/cli)

# The same suites with GNU bash 4.2 first on PATH (EL7-era nodes): bats itself
# and every script under test run under 4.2 (bash_version.bats checks it).
bats-unit-bash42: deps
	@$(call timed,bats-unit-bash42,BASH42_OPTIONAL=1 tools/with_bash42.sh bats --timing --jobs $(BATS_JOBS) -r tests/bats/unit tests/bats/cli)

# Both unit runs at once: each keeps one core busy and they share nothing
# (saves about 2 minutes of make test on 2 cores); the 4.2 run's output is
# printed when both have ended.
bats-unit-both: deps
	@$(call beside,$(SUB_MAKE) bats-unit-bash42,$(SUB_MAKE) bats-unit)

# Integration tests submit real jobs to the local cluster.
bats-integration: cluster-up
	@$(call timed,bats-integration,bats --timing -r tests/bats/integration)

# The reliability suite (faults, load, security, hostile inputs) on a cluster
# of its own: it preempts with whole-node jobs, kills a slurmd and fills the
# queue with 1500 array tasks, which would disturb another suite's jobs.
# Clusters in two folders share no daemon, port, node-local folder or cgroup
# (local_cluster/cluster.sh), so it runs beside the integration suite.
RELIABILITY_CLUSTER := $(CURDIR)/.cluster-reliability
RELIABILITY_CONF := $(RELIABILITY_CLUSTER)/etc/slurm.conf
cluster-up-reliability: deps
	@HPC_CLUSTER_DIR=$(RELIABILITY_CLUSTER) $(CLUSTER) up
# Its output, durations included, is kept in build/reliability.tap:
# tools/reliability_report.sh --from build/reliability.tap writes the report.
bats-reliability: cluster-up-reliability
	@mkdir -p build; start=$$SECONDS; \
	  HPC_CLUSTER_DIR=$(RELIABILITY_CLUSTER) SLURM_CONF=$(RELIABILITY_CONF) \
	  bats --timing -r tests/bats/reliability | tee build/reliability.tap; \
	  echo "# suite: $$((SECONDS - start)) s" >>build/reliability.tap

PYTEST := $(PY) -m pytest -q
# Two workers (pytest-xdist), each taking the next test as it frees up
# (worksteal): alone they use both cores; in make test they end with the
# other suites instead of running alone on one core for their last minutes.
PYTEST_WORKERS ?= 2
pytest: cluster-up
	@$(call timed,pytest,$(PYTEST) -n $(PYTEST_WORKERS) --dist worksteal --durations=60)

# Every suite at once, in two lines. The cluster line (the integration and
# reliability suites side by side, each on its own cluster) mostly waits on
# SLURM's timers and its jobs' sleeps, but its waits are bounded: a batch
# step that starts late fails its launch, a job that runs slow misses a
# test's bound. The CPU line (the two unit runs and pytest, all three at
# once: pytest waits too, on W&B agents' heartbeats and gloo rendezvous)
# only needs cores, so it runs under nice: it takes the cores the cluster
# line leaves idle and yields them as soon as a daemon or a job wants one.
# Nice 10, not 19: the unit tests that time a signal's handling still get a
# tenth of a core against a busy cluster line.
# pytest and the unit runs need no cluster and use no file or port of the
# cluster suites (jobs' MASTER_PORT is 15000-28999, torchrun --standalone
# takes an ephemeral port). The cluster line's output is printed when both
# lines have ended. -o deps: the sub-makes do not check the dependencies
# again (each check imports torch); -o cluster-up...: nor start the
# clusters, which suites has started (two 'cluster.sh up' at once write the
# same files).
SUB_MAKE := $(MAKE) --no-print-directory -o deps
SUITE_MAKE := $(SUB_MAKE) -o cluster-up -o cluster-up-reliability
NICE := nice -n 10
suites: cluster-up cluster-up-reliability
	@$(call beside,$(SUITE_MAKE) cluster-suites,$(NICE) $(SUITE_MAKE) cpu-suites)
# The reliability suite and the benchmarks' smoke run (on the reliability
# cluster: a smoke run on the other would add jobs to the ones its tests
# count) end well before the integration suite would: the integration
# suite's files go to both clusters from one queue (tools/bats_queue.sh),
# the reliability cluster taking the files left once its own work is done.
# Each file runs whole on one cluster; they share no job, file or port.
INTEGRATION_QUEUE := build/integration.queue
cluster-suites: cluster-up cluster-up-reliability
	@mkdir -p build; tools/bats_queue.sh init $(INTEGRATION_QUEUE) tests/bats/integration/slow_first \
	  tests/bats/integration/*.bats
	@$(call beside,{ echo "reliability:"; rc=0; $(SUITE_MAKE) bats-reliability || rc=$$?; \
	  SLURM_CONF=$(RELIABILITY_CONF) $(SUITE_MAKE) bench-smoke-cluster || rc=$$?; \
	  echo "integration (on the reliability cluster):"; \
	  ($(call timed,integration-second,SLURM_CONF=$(RELIABILITY_CONF) \
	    tools/bats_queue.sh run $(INTEGRATION_QUEUE) second)) || rc=$$?; exit "$$rc"; },\
	  (echo "integration:"; $(call timed,integration,tools/bats_queue.sh run $(INTEGRATION_QUEUE) first)))
# The benchmarks that need no cluster follow the unit runs, which end
# minutes before pytest.
cpu-suites: deps
	@$(call beside,$(SUITE_MAKE) pytest,(rc=0; $(SUB_MAKE) bats-unit-both || rc=$$?; \
	  $(SUB_MAKE) bench-smoke-cpu || rc=$$?; exit "$$rc"))

# The benchmarks' smoke run (1 rep, tiny sizes), which checks that they
# still work, is part of suites (cluster-suites).
# The venv (pip, seconds to minutes) builds while shellcheck, the bash 4.2
# check and both clusters start, which need none of it; ruff and the suites
# follow.
test:
	@tools/install_deps.sh system
	@$(call beside,$(SUB_MAKE) shellcheck check-bash42 cluster-up cluster-up-reliability,tools/install_deps.sh venv)
	@$(SUITE_MAKE) ruff suites

# The integration suite with bash 4.2 first on PATH (against the default
# cluster), then on SLURM 24.11 (its own cluster, started and stopped here).
test-portability: cluster-up
	@tools/test_portability.sh

# The whole reliability suite (faults, security, load); writes docs/reports/RELIABILITY.md.
test-reliability: cluster-up
	@tools/reliability_report.sh

# Benchmarks (minutes; needs root for dropping the page cache): docs/reports/BENCHMARKS.md.
bench: cluster-up
	@tools/install_deps.sh bench
	@bench/run_all.sh

# About 2 minutes: checks that every benchmark script still runs; its report (not real
# numbers) replaces build/BENCHMARKS.smoke.md, so runs leave no files behind.
# make test runs it in two parts: those that submit to a cluster on one
# (bench-smoke-cluster), the others beside the CPU-bound suites.
bench-smoke: cluster-up
	@mkdir -p build && bench/run_all.sh --smoke --out build/BENCHMARKS.smoke.md
	@$(GPU_LOOP_SMOKE)
bench-smoke-cluster: cluster-up
	@mkdir -p build && bench/run_all.sh --smoke --cluster yes --out build/BENCHMARKS.smoke-cluster.md
bench-smoke-cpu: deps
	@mkdir -p build && bench/run_all.sh --smoke --cluster no --out build/BENCHMARKS.smoke-cpu.md
	@$(GPU_LOOP_SMOKE)
GPU_LOOP_SMOKE = $(PY) bench/gpu_loop_overhead.py --smoke --out build/BENCHMARKS_GPU.smoke.md >/dev/null \
	  && echo "bench: gpu_loop_overhead smoke ok (CPU here; build/BENCHMARKS_GPU.smoke.md)"

# The checks that need a CUDA GPU (CI has none; tools/gpu_check.sh says what they are).
gpu-check:
	@PYTHON=$${PYTHON:-$(PY)} tools/gpu_check.sh build/gpu_check
	@cp build/gpu_check/BENCHMARKS_GPU.md docs/reports/BENCHMARKS_GPU.md

# Mutation testing of the training core (tools/mutation.py): docs/reports/MUTATION.md.
mutation: deps
	@tools/install_deps.sh mutation
	@$(PY) tools/mutation.py

# Regenerate the golden batch scripts on purpose, then review the diff.
golden: deps
	@tests/bats/fixtures/golden/regenerate.sh

# Rewrite docs/options.md from job_submitter.sh --help (tests/bats/cli/docs.bats checks it).
docs-options:
	@python3 tools/docs.py options
