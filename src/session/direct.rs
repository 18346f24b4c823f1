//! Direct writes: a writer whose frame would be the only thing to write writes it to the
//! transport itself, instead of queueing it and waking the driver task to write it. A
//! request/response exchange then costs one task hop per message (the driver waking the
//! reader) instead of two.
//!
//! The transport of a spawned session lives in an [`IoCell`], which the driver reads and writes
//! through [`SharedIo`] (its transport type) and writers through [`DirectWrite`]. Neither ever
//! waits for it: both only `try_lock` it and make one transport call under it, never across an
//! `.await`.
//!
//! - A writer that finds the transport taken queues its frame as usual.
//! - A direct write polls the transport with the driver's waker, which the core keeps from the
//!   driver's first sleep on and hands the writer with its admission: a transport that is not
//!   ready wakes the driver once it is, and the driver then writes what was queued meanwhile.
//!   Before that first sleep the write goes on without a waker, and what the transport leaves
//!   of it is the driver's, which sees it before it sleeps.
//! - The driver pays nothing for this on a transport call that finds the transport free. Only
//!   when a writer holds it does the driver leave its waker in the cell and raise a flag; the
//!   writer wakes it when it lets go.
//!
//! When a direct write is allowed (nothing queued, no batch in hand, no direct write since the
//! driver last ran; a series of frames, a burst of small ones or a writer's bulk, is the
//! driver's to write in batches instead: `Inner::direct_possible`) and what happens to the
//! part of a frame the transport did not take is the core's business.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes (control frames, header and payload) a direct write copies into one piece
/// and hands to the transport in one plain write: a message of 2 KiB or less with its header.
pub(crate) const SMALL_FRAME: usize = 2048 + crate::frame::HEADER_LEN;

/// What a direct write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Direct {
    /// Bytes of the frame the transport took (0: the frame is to be queued).
    pub(crate) written: usize,
    /// The transport holds bytes that a flush has not pushed out yet: the driver flushes.
    pub(crate) unflushed: bool,
}

impl Direct {
    const NOTHING: Direct = Direct {
        written: 0,
        unflushed: false,
    };
}

/// A transport that stream handles may write a frame to, see the module docs.
pub(crate) trait DirectWrite: Send + Sync {
    /// Offers `control` (control frames taken from the queue), `header` and `payload` to the
    /// transport, polling it with `waker` (the driver's), unless the transport is busy or
    /// gone: in one call (a small frame is appended to `control` for it, and `control`'s
    /// length and bytes are restored afterwards; its capacity may grow to [`SMALL_FRAME`]),
    /// or, for a larger frame on a transport without vectored writes, one call per part.
    fn write_frame(
        &self,
        control: &mut Vec<u8>,
        header: &[u8],
        payload: &[u8],
        waker: &Waker,
    ) -> Direct;
}

/// A spawned session's transport, shared by its driver and its writers.
pub(crate) struct IoCell<T> {
    /// `None` once the driver has gone: the transport is closed then, whoever still holds a
    /// handle.
    io: Mutex<Option<T>>,
    /// The driver's waker, left by a driver that found the transport taken.
    driver: Mutex<Option<Waker>>,
    /// The driver found the transport taken and waits to be woken.
    missed: AtomicBool,
    /// The driver went away while a writer held the transport: the writer drops it.
    closed: AtomicBool,
    vectored: bool,
}

impl<T: AsyncWrite> IoCell<T> {
    pub(crate) fn new(io: T) -> Arc<IoCell<T>> {
        Arc::new(IoCell {
            vectored: io.is_write_vectored(),
            io: Mutex::new(Some(io)),
            driver: Mutex::new(None),
            missed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        })
    }
}

impl<T> IoCell<T> {
    fn try_io(&self) -> Option<MutexGuard<'_, Option<T>>> {
        match self.io.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn driver(&self) -> MutexGuard<'_, Option<Waker>> {
        self.driver.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After a writer let go of the transport: wakes the driver if it found it taken, and
    /// drops the transport if the driver has gone meanwhile.
    fn released(&self) {
        if self.missed.swap(false, Ordering::SeqCst) {
            if let Some(driver) = self.driver().take() {
                driver.wake();
            }
        }
        if self.closed.load(Ordering::SeqCst) {
            if let Some(mut io) = self.try_io() {
                io.take();
            }
        }
    }
}

impl<T> DirectWrite for IoCell<T>
where
    T: AsyncWrite + Unpin + Send,
{
    fn write_frame(
        &self,
        control: &mut Vec<u8>,
        header: &[u8],
        payload: &[u8],
        waker: &Waker,
    ) -> Direct {
        let Some(mut guard) = self.try_io() else {
            return Direct::NOTHING;
        };
        let Some(io) = guard.as_mut() else {
            return Direct::NOTHING;
        };
        let mut cx = Context::from_waker(waker);
        let mut io = Pin::new(io);
        // An error (or a transport taking nothing) leaves the frame to the queue: the driver
        // meets the error itself when it writes it, and ends the session as it would have.
        let control_len = control.len();
        let total = control_len + header.len() + payload.len();
        let mut written = 0;
        if total <= SMALL_FRAME {
            // One contiguous write: a vectored one costs the kernel more than the copy here
            // (a 64-byte round trip over TCP, BENCHMARK-HISTORY.md, "Small direct writes in
            // one piece"), and a transport without vectored writes takes the frame in one
            // call instead of one per part. The frame goes after the control frames in their
            // room, which the thread lends and which keeps its capacity: the copy allocates
            // nothing once the thread's room has grown to a small frame.
            control.reserve_exact(SMALL_FRAME - control_len);
            control.extend_from_slice(header);
            control.extend_from_slice(payload);
            if let Poll::Ready(Ok(n)) = io.as_mut().poll_write(&mut cx, control) {
                written = n;
            }
            control.truncate(control_len);
        } else if self.vectored {
            let slices = [&control[..], header, payload].map(IoSlice::new);
            if let Poll::Ready(Ok(n)) = io.as_mut().poll_write_vectored(&mut cx, &slices) {
                written = n;
            }
        } else {
            // Part by part, until one is not taken whole.
            let parts = [&control[..], header, payload];
            for part in parts.into_iter().filter(|part| !part.is_empty()) {
                let taken = match io.as_mut().poll_write(&mut cx, part) {
                    Poll::Ready(Ok(n)) => n.min(part.len()),
                    _ => 0,
                };
                written += taken;
                if taken < part.len() {
                    break;
                }
            }
        }
        let written = written.min(total);
        let unflushed = written > 0 && !matches!(io.poll_flush(&mut cx), Poll::Ready(Ok(())));
        drop(guard);
        self.released();
        Direct { written, unflushed }
    }
}

/// The driver's view of an [`IoCell`]: its transport.
pub(crate) struct SharedIo<T>(pub(crate) Arc<IoCell<T>>);

impl<T: Unpin> SharedIo<T> {
    /// Runs one transport call, unless a writer holds the transport: then the writer wakes
    /// this task when it lets go.
    fn with_io<R>(
        &self,
        cx: &mut Context<'_>,
        call: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        let cell = &self.0;
        let mut guard = match cell.try_io() {
            Some(guard) => guard,
            None => {
                {
                    let mut driver = cell.driver();
                    if !driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *driver = Some(cx.waker().clone());
                    }
                }
                cell.missed.store(true, Ordering::SeqCst);
                // The writer may have let go before it could see the flag.
                match cell.try_io() {
                    Some(guard) => guard,
                    None => return Poll::Pending,
                }
            }
        };
        match guard.as_mut() {
            Some(io) => call(Pin::new(io), cx),
            None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl<T> Drop for SharedIo<T> {
    /// The driver is done with the transport: it is closed now, not when the last stream
    /// handle goes.
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        if let Some(mut io) = self.0.try_io() {
            io.take();
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SharedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.with_io(cx, |io, cx| io.poll_read(cx, buf))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SharedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.with_io(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.with_io(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.0.vectored
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with_io(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with_io(cx, |io, cx| io.poll_shutdown(cx))
    }
}
