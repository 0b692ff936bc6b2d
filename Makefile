# Quick start: `make demo` trains a small model with the embedded default exporter;
# `make test` runs the whole suite (what CI runs), `make test-fast` the unit tests that are not
# marked slow (under 2 minutes on 2 cores). All set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed with pip, never pinned by the package; 2.13.0 is the CPU build CI uses.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint bench bench-spans bench-limits bench-tensor bench-overhead gpu-check bench-bad-day \
	bench-report bench-integrations bench-scale bench-prometheus bench-health \
	bench-health-alerts bench-faults semconv rules mutation clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[all]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/otel-training demo

# One torch thread unless set: on 2 shared cores a second thread's waiting only adds time
# (test_demo: 35 s with torch's default threads against 6 s with one while a core is busy).
test: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest $(PYTEST_ARGS)
	$(VENV)/bin/ruff check src tests bench scripts examples

# The unit tests without those marked slow (child processes, gcc, torch.compile, long property
# searches, real framework runs); tests/integration/ left out. One torch thread, as the tests'
# child processes have (support.child_env): two threads on a core another process is using wait
# on each other, and the demo's tests take six times as long.
test-fast: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest tests --ignore=tests/integration \
		-m "not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests bench scripts examples
	$(VENV)/bin/ruff format --check src tests bench scripts examples

bench: setup
	$(PY) bench/record_metrics.py

# Installs aidot-training-telemetry into build/bench-aidot-venv on first run (apart from ours);
# runs again with the tests' NVTX recorder attached as a profiler (built here with gcc).
bench-spans: setup
	mkdir -p build
	gcc -shared -fPIC -O2 -pthread -o build/libnvtx_recorder.so tests/nvtx_injection/recorder.c
	$(PY) bench/spans.py --nvtx-injection build/libnvtx_recorder.so

bench-tensor: setup
	$(PY) bench/tensor_metrics.py

# All telemetry on vs OTEL_SDK_DISABLED=true on the demo's training step (needs gcc for NVTX).
bench-overhead: setup
	$(PY) bench/overhead.py

# On a CUDA machine: sync-free tensor metrics and deferred reads, executor vs naive, NVML.
gpu-check:
	bash bench/gpu_check.sh

# Shutdown bounds, 200 SIGTERMs, an 80,000-span burst and case A11, in real processes.
bench-limits: setup
	$(PY) bench/limits.py

bench-bad-day: setup
	$(PY) bench/bad_day.py

# A synthetic 10,000-step job of 8 ranks in 3 attempts (about 1.3 GB in a temporary directory,
# removed after): otel-training report, trace and health over every attempt, each timed in a
# process of its own. BENCH_REPORT_ARGS: e.g. --against REV to run REV's source side by side.
BENCH_REPORT_ARGS ?=
bench-report: setup
	$(PY) bench/report.py $(BENCH_REPORT_ARGS)

# The ground truth of docs/health.md in all its variants (SIGKILL, SIGTERM, SLURM_RESTART_COUNT,
# no restart counter, rank 0 killed first, default span groups): each bucket's error.
bench-health: setup
	$(PY) bench/health.py

# The Lightning and Hugging Face callbacks against the same training without them.
bench-integrations: setup
	$(PY) bench/integrations.py

# The scale model: series, points/s, spans/s, bytes/s, gateways and backend for 8 to 16,384
# ranks and each span preset, derived from the registry, the views and the span groups
# (docs/scale.md). A few seconds.
bench-scale: setup
	$(PY) bench/scale_model.py

# Debian's Prometheus (2.x, installed) scraping 65,536 generated series shaped like ours: head
# series, resident memory, bytes per series, and the extrapolation to 4,096 ranks. About 2 min.
bench-prometheus: setup
	$(PY) bench/prometheus_scale.py

# Hangs (4 ways x 5), stragglers (10) and a healthy control against the run-health rules,
# with 4 gloo ranks and Debian's Prometheus (about half an hour, mostly waiting).
bench-health-alerts: setup
	$(PY) bench/health_alerts.py

# The fault-injection campaign of issue 24: at least 300 incidents (hangs in data loading, in
# DDP's all-reduce, a GIL-held call, SIGSTOP, SIGKILL, unfinished saves; stragglers, spikes,
# restarts, shrinks) and a healthy gauntlet on 2-8 gloo ranks, judged by `otel-training health` and by the rules in Debian's Prometheus:
# detection latency over the threshold, culprit accuracy, false alarms per kind (about two
# hours, mostly waiting). BENCH_FAULTS_ARGS: e.g. --quick (about a quarter of an hour),
# --kinds gil,sigstop --repeats 5, --json PATH.
BENCH_FAULTS_ARGS ?=
bench-faults: setup
	$(PY) bench/faults.py $(BENCH_FAULTS_ARGS)

# Mutation testing (mutmut) of the modules that hold definitions and rules, each with its own
# fast tests ([tool.otel_training.mutation] in pyproject.toml): the kill rate per module and
# every survivor (docs/testing.md, with the time each module takes). Not part of `make test`.
# MUTATION_ARGS: module names to run only those, --keep, --max-children N, --fail-under 90.
MUTATION_ARGS ?=
mutation: setup
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

semconv: setup
	$(PY) scripts/generate_semconv.py

# collector-config/rules/training.yaml, from scripts/generate_rules.py.
rules: setup
	$(PY) scripts/generate_rules.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info otel-training-telemetry mutants
