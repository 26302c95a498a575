//! HTTP(S) GETs for Prometheus and agent `/metrics` URLs through reqwest (rustls): chunked and
//! compressed bodies, HTTP/1.1 and 2, a bearer token or basic auth for a Prometheus behind a proxy.

use crate::error::ObserveError;
use std::path::PathBuf;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(15);

type Result<T, E = ObserveError> = std::result::Result<T, E>;

/// How to authenticate to Prometheus (and to the `--metrics` URLs, which share the flags).
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Bearer token for --prometheus.
    pub prometheus_token: Option<String>,
    /// File holding the bearer token (re-read each run).
    pub prometheus_token_file: Option<PathBuf>,
    /// Basic auth for --prometheus as USER:PASSWORD.
    pub prometheus_basic_auth: Option<String>,
    /// Extra CA certificate (PEM) to trust for https:// URLs.
    pub prometheus_ca: Option<PathBuf>,
}

/// How a request authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    None,
    Bearer(String),
    Basic(String, Option<String>),
}

/// A client for one source: the TLS setup and the credentials.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
    auth: Auth,
}

impl Http {
    /// Credentials from the flags apply to the Prometheus URL; the agents' URLs get none.
    pub fn new(args: &HttpOptions, with_auth: bool) -> Result<Http> {
        let mut b = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .user_agent(concat!("gpuops/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &args.prometheus_ca {
            let pem = std::fs::read(ca).map_err(|source| ObserveError::File {
                what: format!("reading {}", ca.display()),
                source,
            })?;
            let cert =
                reqwest::Certificate::from_pem(&pem).map_err(|source| ObserveError::HttpSetup {
                    what: format!("{}: not a PEM certificate", ca.display()),
                    source,
                })?;
            b = b.add_root_certificate(cert);
        }
        let client = b.build().map_err(|source| ObserveError::HttpSetup {
            what: "setting up the HTTP client".into(),
            source,
        })?;
        let auth = if !with_auth {
            Auth::None
        } else if let Some(t) = &args.prometheus_token {
            Auth::Bearer(t.trim().to_string())
        } else if let Some(f) = &args.prometheus_token_file {
            let t = std::fs::read_to_string(f).map_err(|source| ObserveError::File {
                what: format!("--prometheus-token-file {}", f.display()),
                source,
            })?;
            Auth::Bearer(t.trim().to_string())
        } else if let Some(up) = &args.prometheus_basic_auth {
            let (u, p) = match up.split_once(':') {
                Some((u, p)) => (u.to_string(), Some(p.to_string())),
                None => (up.clone(), None),
            };
            Auth::Basic(u, p)
        } else {
            Auth::None
        };
        Ok(Http { client, auth })
    }

    /// GETs `url` and returns the body of a 2xx answer as text (decoded whole, so a chunk
    /// boundary inside a UTF-8 character is no problem).
    pub async fn get(&self, url: &str) -> Result<String> {
        let mut parsed = reqwest::Url::parse(url).map_err(|source| ObserveError::Url {
            url: url.to_string(),
            source,
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ObserveError::Scheme {
                url: url.to_string(),
            });
        }
        // Credentials in the URL become basic auth, and never appear in messages.
        let mut auth = self.auth.clone();
        if !parsed.username().is_empty() {
            auth = Auth::Basic(decode(parsed.username()), parsed.password().map(decode));
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
        }
        let shown = parsed.to_string();
        let mut req = self.client.get(parsed);
        req = match auth {
            Auth::None => req,
            Auth::Bearer(t) => req.bearer_auth(t),
            Auth::Basic(u, p) => req.basic_auth(u, p),
        };
        let resp = req.send().await.map_err(|source| ObserveError::Get {
            url: shown.clone(),
            source,
        })?;
        let status = resp.status();
        let body = resp.text().await.map_err(|source| ObserveError::Read {
            url: shown.clone(),
            source,
        })?;
        if !status.is_success() {
            return Err(ObserveError::Status {
                url: shown,
                status,
                body: body
                    .chars()
                    .take(300)
                    .collect::<String>()
                    .trim()
                    .to_string(),
            });
        }
        Ok(body)
    }
}

/// Undoes the URL's percent-encoding of a user name or password.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes a query parameter value.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::io::{Read, Write};

    /// A one-shot HTTP/1.1 server: answers `response` and hands back the request's head.
    fn serve_once(response: Vec<u8>) -> (String, std::thread::JoinHandle<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let h = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "request cut short");
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(&response).unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        (url, h)
    }

    #[test]
    fn failed_gets_are_typed_with_their_cause_and_say_it_once() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}/metrics");
        let http = Http::new(&HttpOptions::default(), false).unwrap();
        let refused = rt().block_on(http.get(&url)).unwrap_err();
        match &refused {
            ObserveError::Get { url: shown, source } => {
                assert_eq!(shown, &url);
                assert!(source.is_connect(), "{source}");
            }
            other => panic!("{other:?}"),
        }
        // The display carries the cause; the chain does not repeat it.
        assert_eq!(crate::error::chain(&refused), refused.to_string());
        let bad = rt().block_on(http.get("not a url")).unwrap_err();
        assert!(matches!(bad, ObserveError::Url { .. }), "{bad:?}");
        assert!(std::error::Error::source(&bad).is_some());
        assert_eq!(crate::error::chain(&bad), bad.to_string());
        let ftp = rt().block_on(http.get("ftp://x/y")).unwrap_err();
        assert!(matches!(ftp, ObserveError::Scheme { .. }), "{ftp:?}");
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_chunked_answer_splitting_a_utf8_character() {
        // "é" is C3 A9: the first chunk ends after C3.
        let body = "gpu_info{name=\"Caf\u{e9}\"} 1\n".as_bytes().to_vec();
        let cut = body.iter().position(|b| *b == 0xC3).unwrap() + 1;
        let mut resp =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        for part in [&body[..cut], &body[cut..]] {
            resp.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            resp.extend_from_slice(part);
            resp.extend_from_slice(b"\r\n");
        }
        resp.extend_from_slice(b"0\r\n\r\n");
        let (url, h) = serve_once(resp);
        let http = Http::new(&HttpOptions::default(), false).unwrap();
        let got = rt().block_on(http.get(&format!("{url}/metrics"))).unwrap();
        assert_eq!(got, "gpu_info{name=\"Caf\u{e9}\"} 1\n");
        let head = h.join().unwrap();
        assert!(head.starts_with("GET /metrics HTTP/1.1\r\n"), "{head}");
    }

    #[test]
    fn bearer_token_and_basic_auth() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nup 1\n".to_vec();
        let (url, h) = serve_once(ok.clone());
        let args = HttpOptions {
            prometheus_token: Some("s3cret\n".into()),
            ..HttpOptions::default()
        };
        let http = Http::new(&args, true).unwrap();
        assert_eq!(rt().block_on(http.get(&url)).unwrap(), "up 1\n");
        assert!(
            h.join()
                .unwrap()
                .contains("authorization: Bearer s3cret\r\n"),
            "the token, trimmed"
        );

        let (url, h) = serve_once(ok.clone());
        let args = HttpOptions {
            prometheus_basic_auth: Some("prom:p@ss".into()),
            ..HttpOptions::default()
        };
        let http = Http::new(&args, true).unwrap();
        rt().block_on(http.get(&url)).unwrap();
        // base64("prom:p@ss")
        assert!(
            h.join()
                .unwrap()
                .contains("authorization: Basic cHJvbTpwQHNz\r\n")
        );

        // In the URL: basic auth, and the password is not in an error message.
        let (url, h) =
            serve_once(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 6\r\n\r\nno way".to_vec());
        let with_user = url.replace("http://", "http://prom:hunter2@");
        let http = Http::new(&HttpOptions::default(), true).unwrap();
        let err = rt().block_on(http.get(&with_user)).unwrap_err().to_string();
        assert!(
            h.join()
                .unwrap()
                .contains("authorization: Basic cHJvbTpodW50ZXIy\r\n")
        );
        assert!(
            err.contains("HTTP 401 Unauthorized: no way") && !err.contains("hunter2"),
            "{err}"
        );

        // Without with_auth (an agent's URL) no credentials are sent.
        let (url, h) = serve_once(ok);
        let args = HttpOptions {
            prometheus_token: Some("s3cret".into()),
            ..HttpOptions::default()
        };
        rt().block_on(Http::new(&args, false).unwrap().get(&url))
            .unwrap();
        assert!(
            !h.join()
                .unwrap()
                .to_ascii_lowercase()
                .contains("authorization")
        );
    }

    #[test]
    fn unreachable_and_bad_urls_say_which() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let http = Http::new(&HttpOptions::default(), false).unwrap();
        let err = rt()
            .block_on(http.get(&format!("http://127.0.0.1:{port}/metrics")))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("http://127.0.0.1:{port}/metrics: ")),
            "{err}"
        );
        assert!(rt().block_on(http.get("ftp://x/y")).is_err());
        assert!(rt().block_on(http.get("not a url")).is_err());
        assert_eq!(
            encode("a{b=~\"c|d\"}[1h]"),
            "a%7Bb%3D~%22c%7Cd%22%7D%5B1h%5D"
        );
        assert_eq!(decode("p%40ss"), "p@ss");
    }
}
