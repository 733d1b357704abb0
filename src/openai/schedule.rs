//! The pool's thread: requests join the batch as sequences free up, and one step of every
//! running generation follows another; each sequence's tokens go back to its request's reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

use futures::executor::block_on;

use crate::decode::{BoxedSink, FinishReason};
use crate::engine::{GenerateOptions, Prompt};
use crate::error::Error;
use crate::pool::Pool;

/// One request for the pool: `n` sequences of one prompt.
pub struct Work {
    pub prompt: Prompt,
    pub opts: GenerateOptions,
    pub n: usize,
    pub events: Sender<Event>,
    /// One per sequence: set by the reader to stop it.
    pub stopped: Vec<Arc<AtomicBool>>,
}

/// What the pool tells a request's reader.
pub enum Event {
    Joined { prompt_tokens: usize },
    Tokens { index: usize, tokens: Vec<u32> },
    /// A sequence ended, or failed (status, message).
    Done { index: usize, result: Result<FinishReason, (u16, String)> },
}

/// The status a refused or failed sequence answers with.
fn status(e: &Error) -> (u16, String) {
    let code = match e {
        Error::InvalidArgument(_) | Error::InvalidOption { .. } | Error::InvalidGrammar(_) | Error::PromptTooLong { .. } | Error::ContextOverflow { .. } => 400,
        _ => 500,
    };
    (code, e.to_string())
}

/// Serve `queue` on `pool` until every sender is gone and nothing runs.
pub fn run(mut pool: Pool, queue: Receiver<Work>) {
    let mut owners: HashMap<u64, (Sender<Event>, usize)> = HashMap::new();
    // A request taken from the queue that waits for sequences to free up.
    let mut waiting: Option<Work> = None;
    let mut open = true;
    loop {
        if pool.running() == 0 && waiting.is_none() {
            match queue.recv() {
                Ok(w) => waiting = Some(w),
                Err(_) => return,
            }
        }
        let mut arrivals = Vec::new();
        let mut free = pool.free();
        loop {
            let w = match waiting.take() {
                Some(w) => w,
                None if open => match queue.try_recv() {
                    Ok(w) => w,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                },
                None => break,
            };
            if w.n > free {
                waiting = Some(w);
                break;
            }
            free -= w.n;
            arrivals.push(w);
        }
        join(&mut pool, arrivals, &mut owners);
        for (id, result) in block_on(pool.step()) {
            if let Some((events, index)) = owners.remove(&id) {
                let _ = events.send(Event::Done { index, result: result.map(|g| g.finish).map_err(|e| status(&e)) });
            }
        }
        if !open && pool.running() == 0 && waiting.is_none() {
            return;
        }
    }
}

/// Join every sequence of `arrivals`; a sequence refused is answered at once.
fn join(pool: &mut Pool, arrivals: Vec<Work>, owners: &mut HashMap<u64, (Sender<Event>, usize)>) {
    let mut sequences = Vec::new();
    let mut whose = Vec::new();
    for w in arrivals {
        for (index, stopped) in w.stopped.iter().enumerate() {
            let mut opts = w.opts.clone();
            // The n samples of one request differ.
            opts.sampling.seed = opts.sampling.seed.wrapping_add(index as u64);
            let (events, stopped) = (w.events.clone(), stopped.clone());
            let sink: BoxedSink<'static> = Box::new(move |tokens: &[u32]| {
                !stopped.load(Ordering::Relaxed) && events.send(Event::Tokens { index, tokens: tokens.to_vec() }).is_ok()
            });
            sequences.push((w.prompt.clone(), opts, sink));
            whose.push((w.events.clone(), index));
        }
    }
    for (joined, (events, index)) in pool.join_all(sequences).into_iter().zip(whose) {
        match joined {
            Ok(j) => {
                let _ = events.send(Event::Joined { prompt_tokens: j.prompt_tokens });
                owners.insert(j.id, (events, index));
            }
            Err(e) => drop(events.send(Event::Done { index, result: Err(status(&e)) })),
        }
    }
}
