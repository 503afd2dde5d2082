#!/usr/bin/env bash
# Regenerates the shipped sample dumps from the case table (run from anywhere).
# tests/test_cases.py re-runs each `kdadbg gen` line below and checks the shipped files match.
set -euo pipefail
cd "$(dirname "$0")/.."
kdadbg gen sample_inputs/basic.safetensors --preset basic --B 1 --T 256 --H 2 --K 64 --V 64 --force
kdadbg gen sample_inputs/varlen_short.safetensors --preset varlen_short --force
kdadbg gen sample_inputs/strong_gates.safetensors --preset strong_gates --force
kdadbg gen sample_inputs/kv_layout.safetensors --preset kv_layout --force
