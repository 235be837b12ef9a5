//! The bounded replay buffer of one process's output events.
//!
//! A process never waits for readers: its output is always appended here, and when the
//! buffer exceeds its budget the oldest events are dropped. A reader asks for the events
//! after the last sequence number it saw; if some of those were dropped it first gets a
//! synthetic `lost` event saying how many data bytes it missed. Pure logic, no I/O.

use std::collections::VecDeque;

use bytes::Bytes;
use space_core::process::{ExitStatus, OutputEvent, OutputStream, ProcessId};

/// Bookkeeping cost of one event besides its data (sequence number, framing, JSON keys).
const EVENT_OVERHEAD: usize = 64;
/// How many dropped events we remember the position of, to report exact lost byte counts.
const DROPPED_INDEX: usize = 4096;

/// One stored event; data stays raw and is base64-encoded when read.
#[derive(Debug, Clone)]
enum Stored {
    Started { id: ProcessId, pid: u32 },
    Data { stream: OutputStream, data: Bytes },
    Exit(ExitStatus),
}

impl Stored {
    fn data_len(&self) -> u64 {
        match self {
            Stored::Data { data, .. } => data.len() as u64,
            _ => 0,
        }
    }

    fn cost(&self) -> usize {
        self.data_len() as usize + EVENT_OVERHEAD
    }

    fn to_event(&self, seq: u64) -> OutputEvent {
        match self {
            Stored::Started { id, pid } => OutputEvent::Started {
                seq,
                id: *id,
                pid: *pid,
            },
            Stored::Data { stream, data } => OutputEvent::data(seq, *stream, data),
            Stored::Exit(status) => OutputEvent::Exit {
                seq,
                status: *status,
            },
        }
    }
}

/// What a reader gets for one call of [`OutputBuffer::read_after`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// Events in order, possibly starting with a `lost` event.
    pub events: Vec<OutputEvent>,
    /// The `exit` event is among `events`: the stream is complete.
    pub finished: bool,
}

/// The replay buffer.
#[derive(Debug)]
pub struct OutputBuffer {
    events: VecDeque<(u64, Stored)>,
    cost: usize,
    budget: usize,
    next_seq: u64,
    dropped_data: u64,
    /// (seq, dropped data bytes up to and including seq) for recently dropped events.
    dropped_index: VecDeque<(u64, u64)>,
    exited: bool,
}

impl OutputBuffer {
    /// An empty buffer holding at most about `budget` bytes of events.
    pub fn new(budget: usize) -> Self {
        OutputBuffer {
            events: VecDeque::new(),
            cost: 0,
            budget,
            next_seq: 1,
            dropped_data: 0,
            dropped_index: VecDeque::new(),
            exited: false,
        }
    }

    fn push(&mut self, ev: Stored) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.cost += ev.cost();
        self.events.push_back((seq, ev));
        // Never drop the newest event: a reader must always be able to see `exit`.
        while self.cost > self.budget && self.events.len() > 1 {
            if let Some((s, old)) = self.events.pop_front() {
                self.cost -= old.cost();
                self.dropped_data += old.data_len();
                self.dropped_index.push_back((s, self.dropped_data));
                if self.dropped_index.len() > DROPPED_INDEX {
                    self.dropped_index.pop_front();
                }
            }
        }
        seq
    }

    /// Records the start of the process.
    pub fn push_started(&mut self, id: ProcessId, pid: u32) -> u64 {
        self.push(Stored::Started { id, pid })
    }

    /// Records a chunk of output (the caller keeps chunks at most `MAX_OUTPUT_CHUNK`).
    /// Ignored after `exit`, which is always the last event.
    pub fn push_data(&mut self, stream: OutputStream, data: Bytes) -> Option<u64> {
        if self.exited || data.is_empty() {
            return None;
        }
        Some(self.push(Stored::Data { stream, data }))
    }

    /// Records the end of the process; later pushes are ignored.
    pub fn push_exit(&mut self, status: ExitStatus) -> Option<u64> {
        if self.exited {
            return None;
        }
        self.exited = true;
        Some(self.push(Stored::Exit(status)))
    }

    /// Sequence number of the newest event (0 if none).
    #[cfg(test)]
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// The sequence number a reader of live events only starts after: the newest event's,
    /// or for an exited process the one before its `exit` (so a late reader still sees how
    /// it ended).
    pub fn live_after(&self) -> u64 {
        let last = self.next_seq - 1;
        if self.exited {
            last.saturating_sub(1)
        } else {
            last
        }
    }

    /// Data bytes dropped up to and including `seq`, as far as we still know; 0 if `seq`
    /// is older than the index (then the reported loss is an upper bound).
    fn dropped_through(&self, seq: u64) -> u64 {
        let idx = self.dropped_index.partition_point(|(s, _)| *s <= seq);
        if idx == 0 {
            0
        } else {
            self.dropped_index[idx - 1].1
        }
    }

    /// Events with `seq > after`, at most `max_events` (plus a leading `lost` event when the
    /// reader asked for events that were dropped).
    pub fn read_after(&self, after: u64, max_events: usize) -> ReadResult {
        let mut events = Vec::new();
        let first_kept = self.events.front().map_or(self.next_seq, |(s, _)| *s);
        if after.saturating_add(1) < first_kept {
            let bytes = self
                .dropped_data
                .saturating_sub(self.dropped_through(after));
            events.push(OutputEvent::Lost {
                seq: first_kept - 1,
                bytes,
            });
        }
        let start = self.events.partition_point(|(s, _)| *s <= after);
        // A reader that already saw `exit` is done too.
        let mut finished = self.exited && start == self.events.len();
        for (seq, ev) in self.events.iter().skip(start).take(max_events) {
            finished = matches!(ev, Stored::Exit(_));
            events.push(ev.to_event(*seq));
        }
        ReadResult { events, finished }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> ExitStatus {
        ExitStatus {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
        }
    }

    #[test]
    fn replays_in_order_and_finishes_with_exit() {
        let mut b = OutputBuffer::new(1 << 20);
        assert_eq!(b.push_started(7, 100), 1);
        assert_eq!(
            b.push_data(OutputStream::Stdout, Bytes::from_static(b"hi")),
            Some(2)
        );
        assert_eq!(b.push_data(OutputStream::Stderr, Bytes::new()), None);
        assert_eq!(b.push_exit(status()), Some(3));
        assert_eq!(
            b.push_data(OutputStream::Stdout, Bytes::from_static(b"late")),
            None
        );
        let r = b.read_after(0, 100);
        assert!(r.finished);
        assert_eq!(
            r.events.iter().map(OutputEvent::seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        let r = b.read_after(2, 100);
        assert_eq!(r.events.len(), 1);
        assert!(r.finished);
        let r = b.read_after(3, 100);
        assert!(
            r.finished && r.events.is_empty(),
            "a reader past exit is done"
        );
        let r = b.read_after(0, 1);
        assert!(!r.finished);
        assert_eq!(r.events.len(), 1);
    }

    #[test]
    fn drops_oldest_and_reports_lost_bytes() {
        // Budget for about three 100-byte chunks.
        let mut b = OutputBuffer::new(3 * (100 + EVENT_OVERHEAD));
        b.push_started(1, 1); // seq 1
        for _ in 0..10 {
            b.push_data(OutputStream::Stdout, Bytes::from(vec![b'x'; 100])); // seqs 2..=11
        }
        let r = b.read_after(0, 100);
        let OutputEvent::Lost { seq, bytes } = r.events[0] else {
            panic!("expected lost: {:?}", r.events)
        };
        let first = r.events[1].seq();
        assert_eq!(seq, first - 1);
        // Everything before `first` was dropped: the started event and (first - 2) chunks.
        assert_eq!(bytes, (first - 2) * 100);
        // A reader that saw seq 3 missed fewer bytes.
        let r = b.read_after(3, 100);
        let OutputEvent::Lost { bytes, .. } = r.events[0] else {
            panic!()
        };
        assert_eq!(bytes, (first - 4) * 100);
        // A reader that is up to date with the drop point gets no lost event.
        let r = b.read_after(first - 1, 100);
        assert!(matches!(r.events[0], OutputEvent::Data { .. }));
    }

    #[test]
    fn live_readers_start_at_the_newest_event_or_the_exit() {
        let mut b = OutputBuffer::new(1 << 20);
        b.push_started(7, 100);
        assert_eq!(b.live_after(), 1);
        b.push_data(OutputStream::Stdout, Bytes::from_static(b"old"));
        let after = b.live_after();
        assert!(
            b.read_after(after, 10).events.is_empty(),
            "nothing live yet"
        );
        b.push_data(OutputStream::Stdout, Bytes::from_static(b"new"));
        let r = b.read_after(after, 10);
        assert_eq!(
            r.events,
            vec![OutputEvent::data(3, OutputStream::Stdout, b"new")]
        );
        b.push_exit(status());
        let r = b.read_after(b.live_after(), 10);
        assert!(r.finished);
        assert!(matches!(r.events[..], [OutputEvent::Exit { seq: 4, .. }]));
        // Even when the budget kept nothing but the exit.
        let mut tiny = OutputBuffer::new(10);
        tiny.push_started(1, 1);
        tiny.push_data(OutputStream::Stdout, Bytes::from(vec![0; 100]));
        tiny.push_exit(status());
        let r = tiny.read_after(tiny.live_after(), 10);
        assert!(
            matches!(r.events[..], [OutputEvent::Exit { seq: 3, .. }]),
            "{r:?}"
        );
    }

    #[test]
    fn exit_is_never_dropped() {
        let mut b = OutputBuffer::new(10);
        b.push_data(OutputStream::Stdout, Bytes::from(vec![0; 1000]));
        b.push_exit(status());
        let r = b.read_after(0, 10);
        assert!(r.finished);
        assert!(matches!(r.events.last(), Some(OutputEvent::Exit { .. })));
        assert_eq!(b.last_seq(), 2);
    }
}
