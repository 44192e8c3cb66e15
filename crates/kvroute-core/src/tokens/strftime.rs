//! `strftime_now(format)`, the date function transformers gives chat templates.
//!
//! Llama 3.x templates print today's date into the system prompt
//! (`strftime_now("%d %b %Y")`). The engine renders with its own clock; we render with ours in
//! UTC (engines run in UTC containers in practice), so the prompt prefix — and its block
//! hashes — agree except around midnight, when a miss costs one routing decision, nothing more.
//! Only the directives such templates use are supported; others are copied through verbatim.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A calendar instant in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateTime {
    /// Year, e.g. 2025.
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    /// 0..=23
    pub hour: u32,
    /// 0..=59
    pub minute: u32,
    /// 0..=59
    pub second: u32,
    /// 0 = Monday … 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

impl DateTime {
    /// The calendar date of `secs` seconds after the Unix epoch.
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Howard Hinnant's days-to-civil algorithm.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUM[(month - 1) as usize] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
            // 1970-01-01 was a Thursday (3).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday,
        }
    }

    /// The current time.
    pub fn now() -> DateTime {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        DateTime::from_unix(secs)
    }

    /// Formats like C's `strftime` in the C locale.
    pub fn format(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let month = MONTHS[(self.month - 1) as usize];
            let weekday = WEEKDAYS[self.weekday as usize];
            let hour12 = if self.hour.is_multiple_of(12) {
                12
            } else {
                self.hour % 12
            };
            match chars.next() {
                Some('Y') => out.push_str(&self.year.to_string()),
                Some('y') => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                Some('m') => out.push_str(&format!("{:02}", self.month)),
                Some('d') => out.push_str(&format!("{:02}", self.day)),
                Some('e') => out.push_str(&format!("{:2}", self.day)),
                Some('H') => out.push_str(&format!("{:02}", self.hour)),
                Some('I') => out.push_str(&format!("{hour12:02}")),
                Some('M') => out.push_str(&format!("{:02}", self.minute)),
                Some('S') => out.push_str(&format!("{:02}", self.second)),
                Some('p') => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                Some('j') => out.push_str(&format!("{:03}", self.yday)),
                Some('B') => out.push_str(month),
                Some('b') | Some('h') => out.push_str(&month[..3]),
                Some('A') => out.push_str(weekday),
                Some('a') => out.push_str(&weekday[..3]),
                Some('F') => {
                    out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day))
                }
                Some('T') => out.push_str(&format!(
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                )),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// The template global `strftime_now(format)`.
pub fn strftime_now(format: String) -> String {
    DateTime::now().format(&format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = DateTime::from_unix(1_709_211_909);
        assert_eq!(t.format("%Y-%m-%d %H:%M:%S"), "2024-02-29 13:05:09");
        assert_eq!(t.format("%d %b %Y"), "29 Feb 2024");
        assert_eq!(t.format("%A %B %j %I%p %%"), "Thursday February 060 01PM %");
        let epoch = DateTime::from_unix(0);
        assert_eq!(epoch.format("%F %T %a"), "1970-01-01 00:00:00 Thu");
        assert_eq!(
            DateTime::from_unix(-1).format("%F %T"),
            "1969-12-31 23:59:59"
        );
    }
}
