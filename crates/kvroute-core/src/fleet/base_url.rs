//! Where a worker listens (`BaseUrl`), and how its URL is shown: never with its userinfo.

use http::Uri;
use thiserror::Error;

/// Why a worker URL was rejected.
#[derive(Debug, Error, PartialEq)]
pub enum WorkerUrlError {
    /// Not a URL at all.
    #[error("`{0}` is not a valid URL (expected e.g. http://127.0.0.1:8101)")]
    Invalid(String),
    /// A scheme the proxy does not speak.
    #[error("`{0}`: only http:// and https:// workers are supported")]
    Scheme(String),
    /// No host.
    #[error("`{0}` has no host")]
    NoHost(String),
}

/// Where a worker listens: `http[s]://host:port` plus an optional path prefix.
///
/// Shown (`Display`, `Debug`: logs, errors, the admin API, `/debug`) without its userinfo: a
/// URL such as `http://user:secret@host` is written `http://***@host`, so a password in a
/// worker's URL never leaves the process.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseUrl {
    authority: http::uri::Authority,
    prefix: String,
    /// `https://`: reached over TLS (`[proxy.tls]`).
    tls: bool,
}

impl BaseUrl {
    /// Parses `http[s]://host[:port][/prefix]`.
    ///
    /// A trailing `/v1` is dropped: it is what an OpenAI client's `base_url` ends with, so
    /// operators paste it, but kvroute adds `/v1/…` itself and every request would go to
    /// `/v1/v1/…` and 404. The worker's URL as shown (admin API, logs) says what is used.
    pub fn parse(s: &str) -> Result<BaseUrl, WorkerUrlError> {
        // Errors echo the URL: without its userinfo (a password).
        let shown = || redact_userinfo(s);
        let uri: Uri = s.parse().map_err(|_| WorkerUrlError::Invalid(shown()))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(_) => return Err(WorkerUrlError::Scheme(shown())),
            None => return Err(WorkerUrlError::Invalid(shown())),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| WorkerUrlError::NoHost(shown()))?;
        if authority.host().is_empty() {
            return Err(WorkerUrlError::NoHost(shown()));
        }
        let path = uri.path().trim_end_matches('/');
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_string();
        Ok(BaseUrl {
            authority,
            prefix,
            tls,
        })
    }

    /// `host:port`, the default worker id.
    pub fn host_port(&self) -> String {
        match self.authority.port_u16() {
            Some(p) => format!("{}:{}", self.authority.host(), p),
            None => format!("{}:{}", self.authority.host(), self.default_port()),
        }
    }

    fn default_port(&self) -> u16 {
        if self.tls { 443 } else { 80 }
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// Whether the worker is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The URI of `path` (which starts with `/`) on this worker.
    pub fn join(&self, path_and_query: &str) -> Uri {
        let pq = format!("{}{}", self.prefix, path_and_query);
        Uri::builder()
            .scheme(self.scheme())
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build()
            .unwrap_or_else(|_| Uri::from_static("http://invalid/"))
    }

    /// The URL's authority (with its userinfo, if any).
    pub fn authority(&self) -> &http::uri::Authority {
        &self.authority
    }

    /// The `Host` header value: `host[:port]`, never the userinfo (a password would reach
    /// the engine and every proxy's logs on the way).
    pub fn host_header(&self) -> &str {
        let a = self.authority.as_str();
        a.rsplit_once('@').map_or(a, |(_, host)| host)
    }

    /// Whether `other` reaches the same server and path: host compared without case, a
    /// missing port read as the scheme's default.
    pub fn same_endpoint(&self, other: &BaseUrl) -> bool {
        self.host_port().eq_ignore_ascii_case(&other.host_port()) && self.prefix == other.prefix
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let authority = self.authority.as_str();
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((_, host)) => ("***@", host),
            None => ("", authority),
        };
        write!(f, "{}://{userinfo}{host}{}", self.scheme(), self.prefix)
    }
}

impl std::fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BaseUrl({self})")
    }
}

/// `text` with the userinfo of any URL in it replaced by `***` (`http://u:p@h` →
/// `http://***@h`): for messages that echo a URL as given, before it could be parsed.
pub fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace() || c == '`')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rsplit_once('@') {
            Some((_, host)) => {
                out.push_str("***@");
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35 item 0: `GET /admin/workers`, logs and errors showed a worker URL's password.
    #[test]
    fn userinfo_is_never_shown() {
        let url = BaseUrl::parse("http://alice:s3cret@10.0.0.1:8000/v1").unwrap();
        assert_eq!(url.to_string(), "http://***@10.0.0.1:8000");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(url.host_port(), "10.0.0.1:8000");
        assert_eq!(url.host_header(), "10.0.0.1:8000");
        assert_eq!(
            BaseUrl::parse("http://h:1").unwrap().to_string(),
            "http://h:1"
        );
        let e = BaseUrl::parse("ftp://bob:pw@h:1").unwrap_err().to_string();
        assert!(!e.contains("pw") && e.contains("ftp://***@h:1"), "{e}");
        assert_eq!(
            redact_userinfo("`http://u:p@a:1/x` and https://b:2"),
            "`http://***@a:1/x` and https://b:2"
        );
    }
}
