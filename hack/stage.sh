# Sourced by the test commands (hack/run-tests.sh, hack/run-e2e.sh, .ci/run): one function,
# `stage NAME CMD...`, that runs one stage of a test command and says where the time went.
#
#   - prints "stage NAME: S s (budget B s)" when the stage ends, and appends a line
#     NAME <tab> seconds <tab> budget <tab> exit code to $TORBED_TEST_REPORTS/stages.tsv
#     (.ci/run prints that file as a table at the end);
#   - the budget comes from hack/stage-budgets.tsv (one place to read and change them); a stage
#     past its budget is a failure under CI=true and a warning elsewhere (a developer's loaded
#     machine should not fail a correct change, CI's budget must not creep up unseen);
#   - a stage that ends while .ci/run's background builds still run (TORBED_BACKGROUND_RC
#     names their exit-code file, empty until they end) is not held to its budget: on a cold
#     machine its time is theirs;
#   - a failing stage stops the command at once with its exit code.
#
# Budgets are wall seconds on this project's 2-core machine. Build stages are sized for a cold
# machine (nothing cached); test stages for the tests alone, because the builds they need ran in
# a stage of their own before them.

TORBED_TEST_REPORTS=${TORBED_TEST_REPORTS:-build/test-reports}
export TORBED_TEST_REPORTS

_stage_budget() {
  local file=${TORBED_STAGE_BUDGETS:-"$(dirname "${BASH_SOURCE[0]}")/stage-budgets.tsv"}
  awk -v n="$1" -F'\t' '$1 == n { print $2; found = 1 } END { if (!found) print "" }' "$file"
}

stage() {
  local name=$1 budget t0 rc secs
  shift
  budget=$(_stage_budget "$name")
  if [ -z "$budget" ]; then
    echo "stage $name: no budget in hack/stage-budgets.tsv (add one)" >&2
    return 2
  fi
  echo "::: stage $name (budget ${budget} s): $*"
  t0=$(date +%s)
  rc=0
  "$@" || rc=$?
  secs=$(( $(date +%s) - t0 ))
  mkdir -p "$TORBED_TEST_REPORTS"
  printf '%s\t%s\t%s\t%s\n' "$name" "$secs" "$budget" "$rc" >> "$TORBED_TEST_REPORTS/stages.tsv"
  echo "::: stage $name: ${secs} s (budget ${budget} s), exit $rc"
  if [ $rc -ne 0 ]; then
    echo "stage $name failed (exit $rc)" >&2
    return $rc
  fi
  if [ "$secs" -gt "$budget" ]; then
    # .ci/run builds the e2e prerequisites in the background while the fast tiers run; on a
    # cold machine (nothing cached) those builds take the CPU for most of an hour, and a test
    # stage's budget (sized for the tests alone) measures them, not the tests. A stage that
    # ends while they still run is reported, not failed; warm, they end within minutes.
    if [ -n "${TORBED_BACKGROUND_RC:-}" ] && [ ! -s "$TORBED_BACKGROUND_RC" ]; then
      echo "stage $name took ${secs} s, past its budget of ${budget} s, beside the e2e builds still" \
           "running in the background (a cold machine): reported, not failed" >&2
      return 0
    fi
    if [ "${CI:-}" = true ]; then
      echo "stage $name took ${secs} s, past its budget of ${budget} s (hack/stage-budgets.tsv):" \
           "find what grew in $TORBED_TEST_REPORTS (per-test durations, junit XML)" >&2
      return 3
    fi
    echo "stage $name took ${secs} s, past its CI budget of ${budget} s (a failure under CI=true)" >&2
  fi
  return 0
}
