//! Traffic shaping: which waiting request gets the next slot (priority bands, fair share among
//! tenants, bounded waits, shedding), what priority a request has, how many tokens a tenant
//! may spend per minute, and where a tenant stands for placement isolation.
//!
//! Pure: no I/O and no clock reads (time is passed in), so the disciplines are tested in
//! virtual time; the server's admission (`server::admission`) holds them behind locks and
//! does the waiting.

pub mod isolation;
pub mod priority;
pub mod queue;
pub mod rate;
pub mod saturation;
pub mod slots;

pub use isolation::{Arrivals, Isolation};
pub use priority::{Placement, Priorities, PriorityError, TenantPriority};
pub use queue::{Arrival, FairQueue, Queued, Refusal, Waiter};
pub use slots::{Ask, SlotBook};
