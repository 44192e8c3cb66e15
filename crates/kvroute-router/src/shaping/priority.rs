//! A request's priority: its band (by name, from a header or its tenant's default) and
//! whether it is sheddable.
//!
//! A tenant's header may ask for any band from its tenant's `max_priority` down: a client
//! can lower its own priority, never raise it above what its operator granted (without
//! tenants, every band is open to every client).

use std::fmt;

/// The default band names, highest first.
pub const DEFAULT_BANDS: [&str; 3] = ["high", "normal", "low"];
/// The default band.
pub const DEFAULT_BAND: &str = "normal";
/// The default header naming a request's band.
pub const DEFAULT_HEADER: &str = "x-kvroute-priority";
/// The default header marking a request sheddable (`true`/`1`) or not (`false`/`0`).
pub const DEFAULT_SHEDDABLE_HEADER: &str = "x-kvroute-sheddable";

/// The bands and how a request names one (`[priority]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Priorities {
    /// Band names, highest priority first.
    pub bands: Vec<String>,
    /// The band of a request that names none and whose tenant has no default.
    pub default_band: usize,
    /// Per band: whether its requests are sheddable unless they say otherwise.
    pub sheddable: Vec<bool>,
    /// The header naming a request's band (lower case).
    pub header: String,
    /// The header marking a request sheddable (lower case).
    pub sheddable_header: String,
    /// Router slots only the highest band may take: a request of another band waits while
    /// fewer than this many are free, so one of the highest band finds a slot at once.
    pub headroom: usize,
    /// Router slots only a tenant under its fair share may take (`shaping::slots`), so one
    /// arriving behind a flood starts at once instead of waiting for a slot to end.
    pub fair_reserve: usize,
}

impl Default for Priorities {
    fn default() -> Self {
        Priorities {
            bands: DEFAULT_BANDS.iter().map(|s| (*s).to_owned()).collect(),
            default_band: 1,
            sheddable: vec![false, false, false],
            header: DEFAULT_HEADER.into(),
            sheddable_header: DEFAULT_SHEDDABLE_HEADER.into(),
            headroom: 0,
            fair_reserve: 0,
        }
    }
}

/// A tenant's part in the priority of its requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantPriority {
    /// Its requests' band when they name none (`None`: the default band).
    pub band: Option<usize>,
    /// The highest band its requests may ask for (`None`: its own band).
    pub max_band: Option<usize>,
    /// Whether its requests are sheddable unless they say otherwise (`None`: the band's rule).
    pub sheddable: Option<bool>,
}

/// A request's place: band and sheddability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its band (0 is the highest).
    pub band: usize,
    /// Whether it may be shed first under saturation.
    pub sheddable: bool,
}

/// A priority a request cannot have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PriorityError {
    /// The header names no band.
    UnknownBand(String),
    /// The header asks for a band above what the tenant may use.
    AboveTenant { asked: String, highest: String },
    /// The sheddable header is neither true nor false.
    BadSheddable(String),
}

impl fmt::Display for PriorityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PriorityError::UnknownBand(b) => write!(f, "unknown priority `{b}`"),
            PriorityError::AboveTenant { asked, highest } => write!(
                f,
                "priority `{asked}` is above the highest your key may use (`{highest}`)"
            ),
            PriorityError::BadSheddable(v) => {
                write!(f, "sheddable must be `true` or `false`, not `{v}`")
            }
        }
    }
}

impl Priorities {
    /// The band named `name`.
    pub fn band(&self, name: &str) -> Option<usize> {
        self.bands.iter().position(|b| b == name)
    }

    /// The band's name (`-` past the last).
    pub fn name(&self, band: usize) -> &str {
        self.bands.get(band).map_or("-", String::as_str)
    }

    /// Where a request goes: the `asked` band (the header's value) if its tenant may use it,
    /// else the tenant's band or the default; sheddable as `sheddable` (the header) says,
    /// else as the tenant or the band says.
    pub fn place(
        &self,
        asked: Option<&str>,
        sheddable: Option<&str>,
        tenant: Option<&TenantPriority>,
    ) -> Result<Placement, PriorityError> {
        let own = tenant.and_then(|t| t.band).unwrap_or(self.default_band);
        let band = match asked.map(str::trim) {
            None | Some("") => own,
            Some(name) => {
                let band = self
                    .band(name)
                    .ok_or_else(|| PriorityError::UnknownBand(name.to_owned()))?;
                let highest = tenant.map(|t| t.max_band.unwrap_or(own)).unwrap_or(0);
                if band < highest {
                    return Err(PriorityError::AboveTenant {
                        asked: name.to_owned(),
                        highest: self.name(highest).to_owned(),
                    });
                }
                band
            }
        };
        let sheddable = match sheddable.map(|s| s.trim().to_ascii_lowercase()) {
            Some(v) if v == "true" || v == "1" => true,
            Some(v) if v == "false" || v == "0" => false,
            Some(v) => return Err(PriorityError::BadSheddable(v)),
            None => tenant
                .and_then(|t| t.sheddable)
                .unwrap_or_else(|| self.sheddable.get(band).copied().unwrap_or(false)),
        };
        Ok(Placement { band, sheddable })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_placed_by_header_tenant_and_default() {
        let mut p = Priorities::default();
        p.sheddable[2] = true;
        let open = p.place(None, None, None).unwrap();
        assert_eq!(
            open,
            Placement {
                band: 1,
                sheddable: false
            }
        );
        let low = p.place(Some("low"), None, None).unwrap();
        assert_eq!(
            low,
            Placement {
                band: 2,
                sheddable: true
            }
        );
        assert_eq!(p.place(Some("high"), Some("1"), None).unwrap().band, 0);
        assert!(p.place(Some("high"), Some("1"), None).unwrap().sheddable);
        let t = TenantPriority {
            band: Some(2),
            max_band: Some(1),
            sheddable: Some(false),
        };
        assert_eq!(
            p.place(None, None, Some(&t)).unwrap(),
            Placement {
                band: 2,
                sheddable: false
            }
        );
        assert_eq!(p.place(Some("normal"), None, Some(&t)).unwrap().band, 1);
        assert_eq!(
            p.place(Some("high"), None, Some(&t)).unwrap_err(),
            PriorityError::AboveTenant {
                asked: "high".into(),
                highest: "normal".into()
            }
        );
        // A tenant without a maximum may not rise above its own band.
        let plain = TenantPriority::default();
        assert!(p.place(Some("high"), None, Some(&plain)).is_err());
        assert_eq!(
            p.place(Some("urgent"), None, None).unwrap_err(),
            PriorityError::UnknownBand("urgent".into())
        );
        assert_eq!(
            p.place(None, Some("maybe"), None).unwrap_err(),
            PriorityError::BadSheddable("maybe".into())
        );
    }
}
