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
