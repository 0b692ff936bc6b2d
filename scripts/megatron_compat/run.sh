#!/usr/bin/env bash
# Runs Megatron-LM's own unit tests of megatron/core/telemetry/training_metrics.py, unchanged,
# against otel_training.metrics.instruments.
# Usage: scripts/megatron_compat/run.sh PATH/TO/Megatron-LM [python]
set -euo pipefail
megatron=${1:?usage: $0 PATH/TO/Megatron-LM [python]}
python=${2:-python}
here=$(cd "$(dirname "$0")" && pwd)
test_file="$megatron/tests/unit_tests/telemetry/test_training_metrics.py"
[ -f "$test_file" ] || { echo "no $test_file" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$test_file" "$work/"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q -p no:cacheprovider \
  --rootdir "$work" "$work/test_training_metrics.py"
