//! CPU time of the calling thread, and a criterion measurement of it.
//!
//! On a machine shared with other jobs (CI runners, a 2-core box running builds), wall time
//! also counts the time the scheduler gave to someone else, so a figure of a few milliseconds
//! can be off by several times. The thread's own CPU time is what the work costs, and what its
//! latency is on an idle core; benches report it beside the wall time.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// CPU time this thread has used.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts)
    };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measures the routine's thread CPU time instead of wall time (criterion runs the
/// routine on the thread that reads the measurement).
#[allow(dead_code)] // Used by the benches that measure CPU time, not by every includer.
pub struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }

    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, formatted as criterion formats wall time.
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}
