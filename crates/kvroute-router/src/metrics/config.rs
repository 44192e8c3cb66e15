//! The metrics of the configuration the router runs: which file, loaded when, and its
//! reloads (SIGHUP, or the change watch).

use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The configuration the router runs and its reloads (SIGHUP).
#[derive(Clone)]
pub struct ConfigMetrics {
    /// `kvroute_config_reloads_total{result}`: `applied`, or `refused` (the file could not be
    /// read or is invalid; the running configuration is kept).
    pub reloads: IntCounterVec,
    /// `kvroute_config_info{sha256}`: always 1; the SHA-256 of the loaded file.
    pub info: IntGaugeVec,
    /// `kvroute_config_loaded_timestamp_seconds`: when the configuration running was loaded.
    pub loaded_at: prometheus::Gauge,
    /// `kvroute_config_restart_pending`: 1 when the loaded file changes keys that only a
    /// restart applies.
    pub restart_pending: IntGauge,
}

impl ConfigMetrics {
    pub(super) fn register(registry: &Registry) -> ConfigMetrics {
        let m = ConfigMetrics {
            reloads: IntCounterVec::new(
                Opts::new(
                    "kvroute_config_reloads_total",
                    "Configuration reloads: applied, or refused (the file could not be read or \
                     is invalid; the running configuration is kept).",
                ),
                &["result"],
            )
            .expect("static metric definition"),
            info: IntGaugeVec::new(
                Opts::new(
                    "kvroute_config_info",
                    "Always 1; sha256 is the SHA-256 of the configuration file loaded last.",
                ),
                &["sha256"],
            )
            .expect("static metric definition"),
            loaded_at: prometheus::Gauge::new(
                "kvroute_config_loaded_timestamp_seconds",
                "When the running configuration was loaded (Unix time).",
            )
            .expect("static metric definition"),
            restart_pending: IntGauge::new(
                "kvroute_config_restart_pending",
                "1 when the loaded file changes keys that only a restart applies.",
            )
            .expect("static metric definition"),
        };
        for c in [
            Box::new(m.reloads.clone()) as Box<dyn Collector>,
            Box::new(m.info.clone()),
            Box::new(m.loaded_at.clone()),
            Box::new(m.restart_pending.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Records that the file with digest `sha256` is the one running, loaded now.
    pub fn loaded(&self, sha256: &str) {
        self.info.reset();
        self.info.with_label_values(&[sha256]).set(1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.loaded_at.set(now.as_secs_f64());
    }
}
