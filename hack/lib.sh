# shellcheck shell=bash
# Helpers shared by hack/'s scripts (sourced, not run). Messages go to stderr as "[TAG] text";
# a script sets LOG_TAG to its own name.
log() { printf '[%s] %s\n' "${LOG_TAG:-hack}" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-hack}" "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# step NAME DIR FUNCTION: build into DIR.tmp with `FUNCTION DIR.tmp DIR`, then publish it as DIR
# with a .done mark, so an interrupted build never looks finished; a finished DIR is kept.
step() {
  local name=$1 dir=$2 fn=$3 t0
  if [ -f "$dir/.done" ]; then
    log "$name: present ($dir)"
    return
  fi
  t0=$(now)
  log "$name: building into $dir"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  "$fn" "$dir.tmp" "$dir"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  touch "$dir/.done"
  log "$name: done in $(elapsed "$t0") s"
}
