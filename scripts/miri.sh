#!/bin/sh
# Miri over the index's hand-written aligned buffer (`crates/kvroute-core/src/index/buckets.rs`,
# the only allocation code): undefined behaviour in its allocation, growth, copies, slices and
# drop fails the run. Only the core crate is built for Miri (no sockets, servers or clients in
# it): 2 min 43 s from a cold target dir on the shared 2-core machine (`time sh
# scripts/miri.sh`), against 9 min for the whole crate before the split. Needs the nightly
# toolchain with `miri` and `rust-src`: installed here when missing (an installed nightly is
# not updated).
set -eu
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    rustup toolchain install nightly --no-self-update --profile minimal --component miri \
        --component rust-src
fi
rustup component add miri rust-src --toolchain nightly >/dev/null
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri-build" \
    cargo +nightly miri test -p kvroute-core --lib index::buckets "$@"
