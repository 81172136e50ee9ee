# Shared environment for the project's scripts (sourced, not run).
# - a cargo target directory outside the clone, so every clone and CI run reuses one build;
# - tools installed by scripts/setup on PATH.
# shellcheck shell=bash

DC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DC_CACHE="${DEDUP_CACHE_DIR:-$HOME/.cache/dedup-console}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$DC_CACHE/target}"
export PATH="$HOME/.cargo/bin:$DC_CACHE/npm-tools/node_modules/.bin:$PATH"
# rustup must not install toolchains implicitly; scripts/setup installs the one in
# rust-toolchain.toml explicitly.
export RUSTUP_AUTO_INSTALL=0
# The built site (wasm, js, css) that `serve` reads; cargo-leptos writes it here.
export DEDUP_SITE_ROOT="${DEDUP_SITE_ROOT:-$DC_ROOT/target/site}"

dc_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
dc_as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# dc_usage: the running script's usage, its header comment (from line 2 to the line before its
# `set -…`), without the comment marks.
dc_usage() { sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
# dc_refuse <message>: the message and the usage on stderr, exit 2 (a wrong command line).
dc_refuse() { printf '%s: %s\n\n' "$(basename "$0")" "$1" >&2; dc_usage >&2; exit 2; }
# dc_no_arguments "$@", for scripts that take none: -h or --help prints the usage and exits 0;
# any other argument is refused (exit 2), before the script does anything.
dc_no_arguments() {
  [ $# -gt 0 ] || return 0
  case "$1" in
    -h|--help) dc_usage; exit 0 ;;
    *) dc_refuse "takes no arguments: $1" ;;
  esac
}
