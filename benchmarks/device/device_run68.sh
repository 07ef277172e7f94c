#!/bin/bash
# Session of 2026-12-01, 06:00, call 5: is the bf16 failure of test_speculative_step_graph_equals_host_acceptance
# (call 4: same tokens, one accepted draft fewer on one request) deterministic, and which routing change exposes it.
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 400 python3 benchmarks/debug_spec_equal.py 2>&1 | grep -E "PASS|FAIL|Error"
