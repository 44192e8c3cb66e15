//! How the process's allocator returns large buffers.
//!
//! glibc's `malloc` serves an allocation above its mmap threshold (128 KiB at start) from its
//! own mapping, unmapped when freed. But the threshold is dynamic: each time such a mapping is
//! freed, the threshold rises to its size (up to 32 MiB). After one large request body has come
//! and gone, the next bodies, token ids and hash lists of up to that size are carved from the
//! heap instead, and the heap keeps what it grew by. Measured on a 32 MiB body of one-digit
//! token ids (`tests/it/body_memory.rs`): the router's peak resident memory rose 2.90–3.04×
//! the body with the dynamic threshold and 2.35× with a fixed one. A router's working set is
//! its request bodies, so the threshold is fixed at 256 KiB: anything larger is mapped, and
//! given back the moment it is freed.
//!
//! An operator's own `MALLOC_MMAP_THRESHOLD_` is left alone.

/// The size from which allocations get a mapping of their own.
pub const MMAP_THRESHOLD_BYTES: i32 = 256 << 10;

/// Fixes the allocator's mmap threshold (see the module's doc), unless the environment sets
/// it; does nothing on other allocators. Called once, before the runtime's threads start.
pub fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: `mallopt` only sets a tunable of glibc's allocator; it is called before any
        // other thread exists.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        }
    }
}
