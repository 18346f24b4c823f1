//! A global allocator that counts the bytes allocated and not freed on the current thread, for
//! the memory tests: a test binary that needs it declares `mod counting;`, which makes it that
//! binary's global allocator. Counting is per thread, so a test that runs the session on a
//! current-thread runtime on its own thread counts only what the session and the application
//! allocate, whatever other tests run meanwhile.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct LiveBytes;

#[global_allocator]
static ALLOCATOR: LiveBytes = LiveBytes;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed on this thread since counting started.
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn track(delta: i64) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            LIVE.with(|live| {
                let now = live.get() + delta;
                live.set(now);
                PEAK.with(|peak| peak.set(peak.get().max(now)));
            });
        }
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the counting around it
// touches only const-initialised thread-locals, which do not allocate.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as i64);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }
}

pub fn start_counting() {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    COUNTING.with(|c| c.set(true));
}

/// The most that was live at once since counting started.
pub fn peak() -> usize {
    PEAK.with(Cell::get).max(0) as usize
}

/// Bytes live now, counted since `start_counting`.
pub fn live() -> usize {
    LIVE.with(Cell::get).max(0) as usize
}
