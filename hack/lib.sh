# shellcheck shell=bash
# Helpers shared by hack/'s scripts (sourced, not run). Messages go to stderr as "[TAG] text";
# a script sets LOG_TAG to its own name.
log() { printf '[%s] %s\n' "${LOG_TAG:-hack}" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-hack}" "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
