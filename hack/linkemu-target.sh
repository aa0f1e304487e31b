#!/usr/bin/env bash
# Prints linkemu's cargo build directory: outside the source tree, in torbed's cache, so a fresh
# clone reuses the compiled dependencies (the same place torbed.backends.local.emulator builds the binary).
echo "${TORBED_CACHE:-$HOME/.cache/torbed}/linkemu/target"
