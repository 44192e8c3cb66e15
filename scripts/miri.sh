#!/bin/sh
# Miri over the index's hand-written aligned buffer (`src/index/buckets.rs`, the crate's only
# allocation code): undefined behaviour in its allocation, growth, copies, slices and drop fails
# the run. Needs the nightly toolchain's `miri` and `rust-src` components (installed here if
# missing). Measured on the 2-core machine: 9 min, almost all of it compiling the crate for Miri.
set -eu
cd "$(dirname "$0")/.."
rustup component add miri rust-src --toolchain nightly >/dev/null
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri-build" \
    cargo +nightly miri test --lib index::buckets "$@"
