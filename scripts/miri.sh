#!/bin/sh
# Miri over the index's hand-written aligned buffer (`crates/kvroute-core/src/index/buckets.rs`,
# the only allocation code): undefined behaviour in its allocation, growth, copies, slices and
# drop fails the run. Only the core crate is built for Miri (no sockets, servers or clients in
# it). Needs the nightly toolchain's `miri` and `rust-src` components (installed here if
# missing; .ci/run installs the toolchain).
set -eu
cd "$(dirname "$0")/.."
rustup component add miri rust-src --toolchain nightly >/dev/null
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri-build" \
    cargo +nightly miri test -p kvroute-core --lib index::buckets "$@"
