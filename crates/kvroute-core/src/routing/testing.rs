//! A `Target` for the decision core's unit tests: a worker id, a label, a load, a role,
//! whether it publishes KV events and its KV capacity, with nothing behind them.

use std::sync::Arc;

use super::Target;
use crate::fleet::{Load, Role, WorkerId};

/// A bare routing target.
pub(crate) struct TestTarget {
    pub(crate) key: WorkerId,
    pub(crate) label: Arc<str>,
    pub(crate) load: Arc<Load>,
    pub(crate) role: Role,
    pub(crate) events: bool,
    pub(crate) kv_blocks: Option<usize>,
}

impl TestTarget {
    /// Target `key` (labelled `t{key}`) in `role`, idle, publishing KV events.
    pub(crate) fn new(key: u32, role: Role) -> TestTarget {
        TestTarget {
            key: WorkerId(key),
            label: format!("t{key}").into(),
            load: Arc::new(Load::default()),
            role,
            events: true,
            kv_blocks: None,
        }
    }

    /// `n` idle `both` targets, publishing KV events or not.
    pub(crate) fn fleet(n: u32, events: bool) -> Vec<TestTarget> {
        (0..n)
            .map(|i| TestTarget {
                events,
                ..TestTarget::new(i, Role::Both)
            })
            .collect()
    }
}

impl Target for TestTarget {
    fn worker(&self) -> WorkerId {
        self.key
    }
    fn label(&self) -> &Arc<str> {
        &self.label
    }
    fn load(&self) -> &Arc<Load> {
        &self.load
    }
    fn routable(&self) -> bool {
        true
    }
    fn publishes_events(&self) -> bool {
        self.events
    }
    fn role(&self) -> Role {
        self.role
    }
    fn kv_blocks(&self) -> Option<usize> {
        self.kv_blocks
    }
}
