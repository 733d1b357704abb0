//! Where work runs concurrently with the caller. A [`Service`] (for SSD: the draft model and its
//! speculation cache) lives on a [`Worker`] and answers jobs, in order, one reply per job. The
//! caller sends a job, does its own work (the target's verify forward), then awaits the reply.
//!
//! Placement decides whether that overlap is real:
//! - natively, a worker is an OS thread that owns the service, so draft and target compute at
//!   the same time (on separate devices, or on separate cores);
//! - on wasm32 without threads, a worker is inline: a job runs on the caller's thread when its
//!   reply is awaited. The results are identical; only the overlap is lost.
//!
//! - remote: the service lives elsewhere (a browser Web Worker) behind a [`Channel`] that carries
//!   jobs and replies as plain data across `postMessage`. Its clock is not ours, so replies
//!   measure time as [`RelSpan`]s, durations from the moment the job began.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;

use futures::future::LocalBoxFuture;
use futures::FutureExt;
#[cfg(not(target_arch = "wasm32"))]
use futures::{channel::mpsc, StreamExt};
use web_time::Instant;

use crate::error::{Error, Result};

/// State that answers jobs on a worker.
pub trait Service: 'static {
    type Job: Send + 'static;
    type Reply: Send + 'static;
    fn handle(&mut self, job: Self::Job) -> LocalBoxFuture<'_, Result<Self::Reply>>;
}

/// The caller's end of a link to a service running elsewhere: jobs out, replies back in order.
pub trait Channel<J, R> {
    fn send(&mut self, job: J) -> Result<()>;
    /// The next reply. Fails, rather than waits forever, once the far side has stopped or gone
    /// silent, and from then on at once.
    fn recv(&mut self) -> LocalBoxFuture<'_, Result<R>>;
    /// Ask the far side to cut short the job it is running and those queued behind it: their
    /// replies still come, sooner. A thread or inline service shares its caller's memory and is
    /// told through it instead.
    fn interrupt(&mut self);
    /// Whether the far side is known to have stopped (every later call fails).
    fn has_stopped(&self) -> bool {
        false
    }
}

/// A handle to a service running on a worker. Jobs are handled in the order they are sent; every
/// job yields exactly one reply, received in the same order.
pub struct Worker<J, R> {
    place: Place<J, R>,
    /// Jobs sent whose replies have not been received yet.
    in_flight: usize,
}

enum Place<J, R> {
    #[cfg(not(target_arch = "wasm32"))]
    Thread {
        /// `None` once shutting down: the thread's job stream ends and it exits.
        jobs: Option<mpsc::UnboundedSender<J>>,
        replies: mpsc::UnboundedReceiver<Result<R>>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
    Inline {
        service: Box<dyn Service<Job = J, Reply = R>>,
        queue: VecDeque<J>,
    },
    Remote(Box<dyn Channel<J, R>>),
}

impl<J: Send + 'static, R: Send + 'static> Worker<J, R> {
    /// Run `service` on its own OS thread named `name`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn thread<S: Service<Job = J, Reply = R> + Send>(name: &str, mut service: S) -> Result<Self> {
        use std::panic::catch_unwind;
        let (job_tx, mut job_rx) = mpsc::unbounded::<J>();
        let (reply_tx, reply_rx) = mpsc::unbounded::<Result<R>>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Some(job) = futures::executor::block_on(job_rx.next()) {
                    // A panicking job must not take the worker down: its caller gets an error,
                    // and the next job (a new generation starts from scratch) runs normally.
                    let reply = catch_unwind(AssertUnwindSafe(|| futures::executor::block_on(service.handle(job))))
                        .unwrap_or_else(|panic| Err(Error::Worker(panic_message(&panic))));
                    if reply_tx.unbounded_send(reply).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Worker(format!("cannot start the {name} thread: {e}")))?;
        Ok(Worker {
            place: Place::Thread { jobs: Some(job_tx), replies: reply_rx, thread: Some(thread) },
            in_flight: 0,
        })
    }

    /// Run `service` on the caller's thread, each job when its reply is awaited.
    pub fn inline<S: Service<Job = J, Reply = R>>(service: S) -> Self {
        Worker { place: Place::Inline { service: Box::new(service), queue: VecDeque::new() }, in_flight: 0 }
    }

    /// A service reached through `channel`; it runs concurrently with the caller.
    pub fn remote(channel: Box<dyn Channel<J, R>>) -> Self {
        Worker { place: Place::Remote(channel), in_flight: 0 }
    }

    /// Whether jobs run concurrently with the caller.
    pub fn is_concurrent(&self) -> bool {
        !matches!(self.place, Place::Inline { .. })
    }

    pub fn send(&mut self, job: J) -> Result<()> {
        match &mut self.place {
            #[cfg(not(target_arch = "wasm32"))]
            Place::Thread { jobs, .. } => jobs
                .as_ref()
                .and_then(|jobs| jobs.unbounded_send(job).ok())
                .ok_or_else(|| Error::Worker("the worker thread has stopped".into()))?,
            Place::Inline { queue, .. } => queue.push_back(job),
            Place::Remote(channel) => channel.send(job)?,
        }
        self.in_flight += 1;
        Ok(())
    }

    /// The reply to the oldest job not yet answered.
    pub async fn recv(&mut self) -> Result<R> {
        if self.in_flight == 0 {
            return Err(Error::Worker("awaited a reply to a job never sent".into()));
        }
        match &mut self.place {
            #[cfg(not(target_arch = "wasm32"))]
            Place::Thread { replies, .. } => {
                let reply = replies.next().await;
                // Counted only once a reply is in hand: a caller that abandons this future leaves
                // the reply to be drained rather than mistaken for the next job's.
                self.in_flight -= 1;
                reply.unwrap_or_else(|| Err(Error::Worker("the worker thread has stopped".into())))
            }
            Place::Inline { service, queue } => {
                let job = queue.pop_front().expect("one queued job per reply in flight");
                self.in_flight -= 1;
                AssertUnwindSafe(service.handle(job))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|panic| Err(Error::Worker(panic_message(&panic))))
            }
            Place::Remote(channel) => {
                let reply = channel.recv().await;
                self.in_flight -= 1;
                reply
            }
        }
    }

    /// Whether the service is known to be gone: a thread that ended, a remote one that stopped.
    pub fn has_stopped(&self) -> bool {
        match &self.place {
            #[cfg(not(target_arch = "wasm32"))]
            Place::Thread { thread, .. } => thread.as_ref().is_none_or(|t| t.is_finished()),
            Place::Inline { .. } => false,
            Place::Remote(channel) => channel.has_stopped(),
        }
    }

    /// Ask a remote service to cut its jobs in flight short (see [`Channel::interrupt`]).
    pub fn interrupt(&mut self) {
        if let Place::Remote(channel) = &mut self.place {
            channel.interrupt();
        }
    }

    /// Discard the replies of jobs a caller abandoned (an error or a cancelled future), so the
    /// next caller starts in step. Inline jobs are dropped unrun.
    pub async fn drain(&mut self) {
        match &mut self.place {
            #[cfg(not(target_arch = "wasm32"))]
            Place::Thread { .. } => {
                while self.in_flight > 0 {
                    let failed = self.recv().await.is_err();
                    let alive = matches!(&self.place, Place::Thread { thread: Some(t), .. } if !t.is_finished());
                    if failed && !alive {
                        self.in_flight = 0;
                    }
                }
            }
            Place::Inline { queue, .. } => {
                queue.clear();
                self.in_flight = 0;
            }
            Place::Remote(_) => {
                while self.in_flight > 0 {
                    let _ = self.recv().await;
                }
            }
        }
    }
}

impl<J, R> Drop for Worker<J, R> {
    fn drop(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Place::Thread { jobs, thread, .. } = &mut self.place {
            jobs.take();
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown cause".into());
    format!("worker panicked: {msg}")
}

/// A stretch of time one side spent working.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub start: Instant,
    pub end: Instant,
}

impl Span {
    /// From `start` until now.
    pub fn since(start: Instant) -> Span {
        Span { start, end: Instant::now() }
    }

    pub fn ms(&self) -> f64 {
        self.end.saturating_duration_since(self.start).as_secs_f64() * 1000.0
    }

    /// How long both spans were running at once.
    pub fn overlap_ms(&self, other: &Span) -> f64 {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        Span { start, end }.ms()
    }
}

/// A stretch of time as a worker reports it: milliseconds from the moment it began the job, so
/// that it means the same on either side of a `postMessage`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RelSpan {
    pub start_ms: f64,
    pub end_ms: f64,
}

impl RelSpan {
    pub fn from_span(span: Span, job_start: Instant) -> RelSpan {
        let ms = |t: Instant| t.saturating_duration_since(job_start).as_secs_f64() * 1000.0;
        RelSpan { start_ms: ms(span.start), end_ms: ms(span.end) }
    }

    /// On the caller's clock, for a job that began at `job_start`.
    pub fn at(self, job_start: Instant) -> Span {
        let t = |ms: f64| job_start + std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0);
        Span { start: t(self.start_ms), end: t(self.end_ms) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    /// Doubles jobs and counts them; panics on 13.
    struct Doubler(u32);

    impl Service for Doubler {
        type Job = u32;
        type Reply = (u32, u32);
        fn handle(&mut self, job: u32) -> LocalBoxFuture<'_, Result<(u32, u32)>> {
            Box::pin(async move {
                assert_ne!(job, 13, "unlucky job");
                self.0 += 1;
                Ok((job * 2, self.0))
            })
        }
    }

    fn exercise(mut w: Worker<u32, (u32, u32)>) {
        block_on(async {
            w.send(1).unwrap();
            w.send(2).unwrap();
            assert_eq!(w.recv().await.unwrap(), (2, 1));
            assert_eq!(w.recv().await.unwrap(), (4, 2));
            assert!(w.recv().await.is_err(), "no job in flight");
            w.send(13).unwrap();
            let err = w.recv().await.unwrap_err();
            assert!(matches!(err, Error::Worker(_)), "{err}");
            w.send(5).unwrap();
            w.send(6).unwrap();
            w.drain().await;
            w.send(7).unwrap();
            assert_eq!(w.recv().await.unwrap().0, 14, "replies stay in step after a drain");
        });
    }

    #[test]
    fn thread_worker_answers_in_order_and_survives_panics() {
        let w = Worker::thread("test-worker", Doubler(0)).unwrap();
        assert!(w.is_concurrent());
        exercise(w);
    }

    #[test]
    fn inline_worker_behaves_the_same() {
        let w = Worker::inline(Doubler(0));
        assert!(!w.is_concurrent());
        exercise(w);
    }

    #[test]
    fn span_overlap() {
        let t = Instant::now();
        let ms = std::time::Duration::from_millis;
        let a = Span { start: t, end: t + ms(10) };
        let b = Span { start: t + ms(4), end: t + ms(20) };
        let c = Span { start: t + ms(30), end: t + ms(40) };
        assert!((a.overlap_ms(&b) - 6.0).abs() < 1e-6);
        assert_eq!(a.overlap_ms(&c), 0.0);
    }
}
