//! `[index]`: bounds of the KV index. Its defaults are [`IndexSettings::default`], which the
//! simulator uses too, so the live router and `kvroute simulate` bound the index alike.

use std::time::Duration;

use super::file::FileIndex;
use super::values::seconds;
use super::{ConfigError, invalid};

/// Bounds of the KV index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexSettings {
    /// Most (block, worker) entries kept from KV events.
    pub max_entries: usize,
    /// How long a routed block is assumed cached on a worker without events.
    pub approx_ttl: Duration,
    /// Most predicted blocks kept per worker.
    pub approx_capacity_blocks: usize,
}

impl Default for IndexSettings {
    fn default() -> Self {
        IndexSettings {
            max_entries: 1 << 24,
            approx_ttl: Duration::from_secs(120),
            approx_capacity_blocks: 1 << 16,
        }
    }
}

/// Fewest exact entries accepted: below this the index forgets faster than engines evict.
const MIN_MAX_ENTRIES: usize = 1024;

impl IndexSettings {
    /// The settings of `[index]`.
    pub(super) fn from_file(file: &FileIndex) -> Result<IndexSettings, ConfigError> {
        let d = IndexSettings::default();
        let index = IndexSettings {
            max_entries: file.max_entries.unwrap_or(d.max_entries),
            approx_ttl: seconds("index.approx_ttl_s", file.approx_ttl_s, d.approx_ttl, 0.001)?,
            approx_capacity_blocks: file
                .approx_capacity_blocks
                .unwrap_or(d.approx_capacity_blocks),
        };
        if index.max_entries < MIN_MAX_ENTRIES {
            return Err(invalid("index.max_entries", "must be at least 1024"));
        }
        Ok(index)
    }
}
