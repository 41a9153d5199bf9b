//! A bump allocator for the short-lived front ends (the hook and the
//! wrapper, both a few hundred microseconds from exec to exit or exec):
//! allocations come from a fixed buffer in `.bss` and are never given back,
//! except the latest one, which can grow or be freed in place. When the
//! buffer is used up (a very large `config.json`), allocations go to the
//! system allocator, so nothing fails that would not fail without it.
//!
//! Why: the hook and the wrapper ship statically linked. With musl (no
//! CPUID cache probing at each start, unlike static glibc) its allocator
//! costs more than the rest of the process's work on the create path
//! (many small allocations, `mmap`/`munmap` for larger ones); here
//! allocating is an add and a compare-and-swap.
//!
//! Only for processes that exit soon: memory freed is not reused (the
//! long-lived agent and shim do not use it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `N` bytes of arena; past them, the system allocator.
pub struct Arena<const N: usize> {
    buf: UnsafeCell<[u8; N]>,
    /// Offset of the first free byte in `buf`.
    next: AtomicUsize,
}

// SAFETY: `buf` is handed out in disjoint ranges claimed with a
// compare-and-swap on `next`; the arena never reads or writes it itself.
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Arena<N> {
    pub const fn new() -> Arena<N> {
        Arena {
            buf: UnsafeCell::new([0; N]),
            next: AtomicUsize::new(0),
        }
    }

    fn base(&self) -> usize {
        self.buf.get() as usize
    }

    fn owns(&self, p: *mut u8) -> bool {
        let a = p as usize;
        a >= self.base() && a < self.base() + N
    }

    /// Bytes of the arena handed out (for tests).
    pub fn used(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }

    /// A range of the arena for `layout`, or null when it does not fit.
    fn claim(&self, layout: Layout) -> *mut u8 {
        let base = self.base();
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            // Aligned in address space (the buffer itself is only byte-aligned).
            let Some(start) = (base + cur)
                .checked_next_multiple_of(layout.align())
                .map(|a| a - base)
            else {
                return std::ptr::null_mut();
            };
            let end = match start.checked_add(layout.size()) {
                Some(e) if e <= N => e,
                _ => return std::ptr::null_mut(),
            };
            match self
                .next
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (base + start) as *mut u8,
                Err(now) => cur = now,
            }
        }
    }
}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every pointer returned is either a range of `buf` claimed by one
// caller only, aligned to and as large as the layout asked, or the system
// allocator's; each is given back to the allocator it came from.
unsafe impl<const N: usize> GlobalAlloc for Arena<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.claim(layout);
        if !p.is_null() {
            return p;
        }
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if self.owns(p) {
            // The latest allocation is handed back; the others stay used.
            let end = p as usize - self.base() + layout.size();
            let _ = self.next.compare_exchange(
                end,
                p as usize - self.base(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return;
        }
        // SAFETY: not ours, so the system allocator's, with its layout.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !self.owns(p) {
            // SAFETY: the system allocator's block, forwarded.
            return unsafe { System.realloc(p, layout, new_size) };
        }
        let start = p as usize - self.base();
        // The latest allocation grows or shrinks in place when it fits.
        if let Some(new_end) = start.checked_add(new_size).filter(|&e| e <= N) {
            let end = start + layout.size();
            if self
                .next
                .compare_exchange(end, new_end, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return p;
            }
        }
        if new_size <= layout.size() {
            return p; // shrinking: the block is large enough
        }
        // SAFETY: GlobalAlloc::realloc's contract: new_size is non-zero and
        // does not overflow when rounded up to the alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a valid layout, as above.
        let q = unsafe { self.alloc(new_layout) };
        if !q.is_null() {
            // SAFETY: both blocks are at least layout.size() long and disjoint.
            unsafe { std::ptr::copy_nonoverlapping(p, q, layout.size()) };
            // SAFETY: p is ours, with its layout.
            unsafe { self.dealloc(p, layout) };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn aligned_disjoint_and_freed_at_the_top() {
        let a: Box<Arena<4096>> = Box::default();
        unsafe {
            let p = a.alloc(l(3, 1));
            let q = a.alloc(l(16, 16));
            assert!(a.owns(p) && a.owns(q));
            assert_eq!(q as usize % 16, 0);
            assert!(q as usize >= p as usize + 3);
            // p is not the latest: stays used; q is: freed in place.
            let used = a.used();
            a.dealloc(p, l(3, 1));
            assert_eq!(a.used(), used);
            a.dealloc(q, l(16, 16));
            assert_eq!(a.used(), q as usize - a.base());
        }
    }

    #[test]
    fn realloc_grows_in_place_or_copies() {
        let a: Box<Arena<4096>> = Box::default();
        unsafe {
            let p = a.alloc(l(8, 8));
            p.copy_from(b"abcdefgh".as_ptr(), 8);
            let p2 = a.realloc(p, l(8, 8), 64);
            assert_eq!(p2, p, "the latest block grows in place");
            let q = a.alloc(l(8, 8));
            let p3 = a.realloc(p2, l(64, 8), 128);
            assert_ne!(p3, p2, "a block below another is copied");
            assert_eq!(std::slice::from_raw_parts(p3, 8), b"abcdefgh");
            assert!(a.owns(q) && a.owns(p3));
        }
    }

    #[test]
    fn past_the_arena_the_system_allocator() {
        let a: Box<Arena<256>> = Box::default();
        unsafe {
            let p = a.alloc(l(200, 8));
            assert!(a.owns(p));
            let q = a.alloc(l(100, 8));
            assert!(!q.is_null() && !a.owns(q), "does not fit: System's");
            q.write_bytes(7, 100);
            let q2 = a.realloc(q, l(100, 8), 10_000);
            assert!(!q2.is_null() && !a.owns(q2));
            assert_eq!(*q2.add(99), 7);
            a.dealloc(q2, l(10_000, 8));
            // The arena's block grows past the end: copied to System's.
            p.write_bytes(5, 200);
            let p2 = a.realloc(p, l(200, 8), 1000);
            assert!(!a.owns(p2));
            assert_eq!(*p2.add(199), 5);
            a.dealloc(p2, l(1000, 8));
        }
    }
}
