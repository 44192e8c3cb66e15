//! The bucket array of a [`super::table::Table`]: a vector whose large instances sit on
//! 2 MiB-aligned memory the kernel may back with transparent huge pages.
//!
//! The index's tables are probed at random, one cache line per operation. On 4 KiB pages
//! nearly every probe of a table of a few MiB also misses the TLB, and under virtualisation a
//! page walk costs more than the cache miss itself: a profile of event application showed the
//! software prefetch of the next engine-map bucket stalling (the walk) for most of the
//! insertion time. A `Vec` cannot ask for an alignment larger than its element's, so this
//! is the part of `Vec` the tables use, over an allocation aligned to 2 MiB once it is at
//! least [`HUGE_MIN`] bytes (the allocator counts exactly the bytes asked for; the kernel
//! backs the untouched alignment slack with nothing).

use std::alloc::{Layout, alloc, dealloc};
use std::mem::{align_of, size_of};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Arrays at least this large are 2 MiB-aligned and advised to use huge pages.
const HUGE_MIN: usize = 1 << 20;
/// The huge page size (x86-64, aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// A growable array of `Copy` buckets; see the module docs.
pub(crate) struct Buckets<B: Copy> {
    ptr: NonNull<B>,
    len: usize,
    cap: usize,
}

// SAFETY: `Buckets` owns its allocation exclusively, like a `Vec<B>`; sending or sharing it is
// as safe as sending or sharing the `B`s it holds.
#[allow(unsafe_code)]
unsafe impl<B: Copy + Send> Send for Buckets<B> {}
// SAFETY: as above; `&Buckets` only gives `&[B]`.
#[allow(unsafe_code)]
unsafe impl<B: Copy + Sync> Sync for Buckets<B> {}

impl<B: Copy> Buckets<B> {
    /// The layout of `cap` buckets.
    #[allow(
        clippy::expect_used,
        reason = "a table larger than the address space is a capacity overflow, as for `Vec`"
    )]
    fn layout(cap: usize) -> Layout {
        let bytes = cap
            .checked_mul(size_of::<B>())
            .expect("table size overflows");
        let align = if bytes >= HUGE_MIN {
            HUGE_PAGE
        } else {
            align_of::<B>()
        };
        Layout::from_size_align(bytes, align).expect("valid table layout")
    }

    /// An empty array with room for `cap` buckets, none written yet.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        if cap == 0 || size_of::<B>() == 0 {
            return Buckets {
                ptr: NonNull::dangling(),
                len: 0,
                cap: if size_of::<B>() == 0 { usize::MAX } else { 0 },
            };
        }
        let layout = Self::layout(cap);
        // SAFETY: the layout has a non-zero size (cap > 0, B not zero-sized).
        #[allow(unsafe_code)]
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<B>()) else {
            std::alloc::handle_alloc_error(layout);
        };
        if layout.align() == HUGE_PAGE {
            advise_huge_pages(raw as usize, layout.size());
        }
        Buckets { ptr, len: 0, cap }
    }

    /// Buckets in use.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Buckets the allocation has room for.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Makes room for `additional` more buckets beyond the length (exactly, like
    /// `Vec::reserve_exact`).
    #[allow(
        clippy::expect_used,
        reason = "a table larger than the address space is a capacity overflow, as for `Vec`"
    )]
    pub(crate) fn reserve_exact(&mut self, additional: usize) {
        let need = self
            .len
            .checked_add(additional)
            .expect("table size overflows");
        if need <= self.cap {
            return;
        }
        let mut grown = Buckets::with_capacity(need);
        grown.extend_from_slice(self);
        *self = grown;
    }

    /// Appends the buckets of `src`, which must fit in the capacity.
    fn extend_from_slice(&mut self, src: &[B]) {
        assert!(self.cap - self.len >= src.len(), "room reserved");
        // SAFETY: the destination range lies inside our allocation (checked above) and cannot
        // overlap `src`, which is borrowed from elsewhere.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(self.len), src.len());
        }
        self.len += src.len();
    }

    /// Sets the length to `n`, writing `value` into new buckets (growing exactly if needed).
    pub(crate) fn resize(&mut self, n: usize, value: B) {
        if n <= self.len {
            self.len = n;
            return;
        }
        self.reserve_exact(n - self.len);
        for i in self.len..n {
            // SAFETY: `i < n <= cap`: inside our allocation; `B: Copy`, so writing over
            // uninitialised memory drops nothing.
            #[allow(unsafe_code)]
            unsafe {
                self.ptr.as_ptr().add(i).write(value)
            };
        }
        self.len = n;
    }
}

impl<B: Copy> Deref for Buckets<B> {
    type Target = [B];

    #[inline]
    fn deref(&self) -> &[B] {
        // SAFETY: the first `len` buckets are initialised, and the pointer is valid (dangling
        // only when `len` is 0, which `from_raw_parts` allows for an aligned non-null pointer).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<B: Copy> DerefMut for Buckets<B> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [B] {
        // SAFETY: as for `deref`, and `&mut self` makes the access exclusive.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<B: Copy> Clone for Buckets<B> {
    fn clone(&self) -> Self {
        let mut c = Buckets::with_capacity(self.cap);
        c.extend_from_slice(self);
        c
    }
}

impl<B: Copy> Drop for Buckets<B> {
    fn drop(&mut self) {
        if self.cap == 0 || size_of::<B>() == 0 {
            return;
        }
        // SAFETY: allocated in `with_capacity` with exactly this layout (the capacity never
        // changes after allocation), and not freed before.
        #[allow(unsafe_code)]
        unsafe {
            dealloc(self.ptr.as_ptr().cast(), Self::layout(self.cap))
        };
    }
}

#[cfg(all(target_os = "linux", not(miri)))]
fn advise_huge_pages(addr: usize, bytes: usize) {
    // SAFETY: the range is an allocation we own and have not touched yet; MADV_HUGEPAGE only
    // changes how the kernel backs it and cannot fail in a way that affects memory safety (an
    // error leaves 4 KiB pages).
    #[allow(unsafe_code)]
    unsafe {
        libc::madvise(addr as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
    }
}

/// Elsewhere (and under Miri, which cannot call `madvise`): 4 KiB pages.
#[cfg(any(not(target_os = "linux"), miri))]
fn advise_huge_pages(_addr: usize, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_keeps_contents_and_aligns_large_arrays() {
        let mut b: Buckets<[u64; 8]> = Buckets::with_capacity(2);
        b.resize(3, [7; 8]);
        b[1][0] = 1;
        b.reserve_exact(HUGE_MIN / 64);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0][0], b[1][0], b[2][7]), (7, 1, 7));
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        b.resize(1, [0; 8]);
        let c = b.clone();
        assert_eq!(c.len(), 1);
        let empty: Buckets<[u64; 8]> = Buckets::with_capacity(0);
        assert!(empty.is_empty());
    }
}
