//! Measured GPU utilization per node from Prometheus, polled off the decision loop.

use crate::error::ControllerError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often Prometheus is asked. The query already spans the whole idle period, so polling
/// faster than a scrape interval or two adds nothing.
pub const POLL: Duration = Duration::from_secs(30);

/// A node's value older than this is dropped: a node Prometheus stopped answering for may
/// have become busy since, and a missing value only falls back to the pod-based rule.
pub const STALE_AFTER: Duration = Duration::from_secs(5 * 60);

/// The PromQL: each node's peak utilization over the idle period. dcgm-exporter (and
/// gpuops's exporter, see docs/metrics.md) spell the node label `Hostname` before 4.6 and
/// `hostname` since, so both are kept.
pub fn query(idle: Duration) -> String {
    format!(
        "max by (Hostname, hostname) (max_over_time(DCGM_FI_DEV_GPU_UTIL[{}s]))",
        idle.as_secs().max(1)
    )
}

/// Checks a `--prometheus-url` value before anything starts: an http:// or https:// URL with
/// a host.
///
/// # Errors
/// Another scheme, or no host; the message names the value.
pub fn check_url(text: &str) -> Result<String, ControllerError> {
    let t = text.trim();
    let rest = t
        .strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"))
        .ok_or_else(|| bad(t, "not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err(bad(t, "the URL has no host"));
    }
    Ok(t.to_string())
}

/// `/api/v1/query?query=...` under `base` (a trailing `/` on `base` is fine).
pub fn query_url(base: &str, idle: Duration) -> String {
    format!(
        "{}/api/v1/query?query={}",
        base.trim_end_matches('/'),
        gpuops_observe::encode(&query(idle))
    )
}

fn bad(url: &str, message: impl Into<String>) -> ControllerError {
    ControllerError::Prometheus {
        url: url.to_string(),
        message: message.into(),
    }
}

/// Parses the answer of [`query`]: node name -> utilization percent. Series without a node
/// label and non-finite values (`NaN` when a GPU reported nothing) are left out, so such a
/// node counts as unmeasured rather than idle.
///
/// # Errors
/// A body that is not JSON, an answer with `status` other than `success`, or a result that is
/// not an instant vector; the message names `url`.
pub fn parse(url: &str, body: &str) -> Result<HashMap<String, f64>, ControllerError> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| bad(url, format!("answer is not JSON: {e}")))?;
    let status = v.get("status").and_then(|s| s.as_str()).unwrap_or("");
    if status != "success" {
        let kind = v.get("errorType").and_then(|s| s.as_str()).unwrap_or("?");
        let error = v
            .get("error")
            .and_then(|s| s.as_str())
            .unwrap_or("no error message");
        return Err(bad(
            url,
            format!("query failed (status {status:?}, {kind}): {error}"),
        ));
    }
    let data = v
        .get("data")
        .ok_or_else(|| bad(url, "answer has no data"))?;
    let kind = data.get("resultType").and_then(|s| s.as_str());
    if kind != Some("vector") {
        return Err(bad(
            url,
            format!("expected resultType \"vector\", got {kind:?}"),
        ));
    }
    let result = data
        .get("result")
        .and_then(|r| r.as_array())
        .ok_or_else(|| bad(url, "data.result is not a list"))?;
    let mut out: HashMap<String, f64> = HashMap::new();
    for (i, series) in result.iter().enumerate() {
        let label = |k: &str| {
            series
                .get("metric")
                .and_then(|m| m.get(k))
                .and_then(|s| s.as_str())
                .filter(|s| !s.is_empty())
        };
        let Some(node) = label("Hostname").or_else(|| label("hostname")) else {
            continue;
        };
        let value = series
            .get("value")
            .and_then(|p| p.get(1))
            .and_then(|s| s.as_str())
            .ok_or_else(|| {
                bad(
                    url,
                    format!("data.result[{i}].value is not [time, \"value\"]"),
                )
            })?;
        let util: f64 = value.parse().map_err(|_| {
            bad(
                url,
                format!("data.result[{i}].value {value:?} is not a number"),
            )
        })?;
        if !util.is_finite() {
            continue;
        }
        let e = out.entry(node.to_string()).or_insert(util);
        *e = e.max(util);
    }
    Ok(out)
}

/// The last good value per node, with when it was read.
#[derive(Debug, Default)]
pub struct Feed {
    values: Mutex<HashMap<String, (f64, Instant)>>,
    last_ok: Mutex<Option<Instant>>,
}

impl Feed {
    /// Records one successful answer; nodes missing from it keep their older value until
    /// it goes stale.
    pub fn update(&self, at: Instant, values: HashMap<String, f64>) {
        if let Ok(mut m) = self.values.lock() {
            for (node, u) in values {
                m.insert(node, (u, at));
            }
        }
        if let Ok(mut l) = self.last_ok.lock() {
            *l = Some(at);
        }
    }

    /// Values no older than `max_age` at `now`; older ones are forgotten.
    pub fn fresh(&self, now: Instant, max_age: Duration) -> HashMap<String, f64> {
        let Ok(mut m) = self.values.lock() else {
            return HashMap::new();
        };
        m.retain(|_, (_, at)| now.saturating_duration_since(*at) <= max_age);
        m.iter().map(|(k, (u, _))| (k.clone(), *u)).collect()
    }

    /// Time since the last successful answer, `None` before the first.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.last_ok
            .lock()
            .ok()
            .and_then(|l| *l)
            .map(|at| now.saturating_duration_since(at))
    }
}

/// One request: fetch and parse.
///
/// # Errors
/// The request failed (refused, timed out, HTTP error) or the answer did not parse.
pub async fn fetch(
    http: &gpuops_observe::Http,
    base: &str,
    idle: Duration,
) -> Result<HashMap<String, f64>, ControllerError> {
    let url = query_url(base, idle);
    // Errors go to the log: never with the URL's password.
    let shown = redact(base);
    let body = http
        .get(&url)
        .await
        .map_err(|e| bad(&shown, gpuops_observe::chain(&e)))?;
    parse(&shown, &body)
}

/// How the controller reaches Prometheus.
#[derive(Clone, PartialEq, Eq)]
pub struct Source {
    /// Base URL, http:// or https://.
    pub url: String,
    /// File with a bearer token, read again before every query: projected service-account
    /// tokens rotate while the controller runs.
    pub bearer_token_file: Option<std::path::PathBuf>,
    /// CA certificate (PEM) to trust for an https:// URL, besides the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// How often to ask ([`POLL`] in production).
    pub poll: Duration,
}

// The URL may carry basic-auth credentials: it is shown without them, and the token file is
// shown by its path only.
impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("url", &redact(&self.url))
            .field("bearer_token_file", &self.bearer_token_file)
            .field("ca_file", &self.ca_file)
            .field("poll", &self.poll)
            .finish()
    }
}

/// `url` without `user:password@`.
pub fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

impl Source {
    /// An HTTP client with the CA and the token as they are now.
    ///
    /// # Errors
    /// A file that cannot be read, a CA that is not PEM; the message names the flag and the
    /// file, never the token.
    pub fn client(&self) -> Result<gpuops_observe::Http, ControllerError> {
        let shown = redact(&self.url);
        for (flag, file) in [
            ("--prometheus-bearer-token-file", &self.bearer_token_file),
            ("--prometheus-ca-file", &self.ca_file),
        ] {
            if let Some(f) = file {
                std::fs::metadata(f)
                    .map_err(|e| bad(&shown, format!("{flag} {}: {e}", f.display())))?;
            }
        }
        if let Some(ca) = &self.ca_file {
            // The TLS library takes a file without any certificate silently, and every
            // https:// query would then fail on an unknown issuer instead.
            let text = std::fs::read_to_string(ca).map_err(|e| {
                bad(
                    &shown,
                    format!("--prometheus-ca-file {}: {e}", ca.display()),
                )
            })?;
            if !text.contains("-----BEGIN CERTIFICATE-----") {
                return Err(bad(
                    &shown,
                    format!(
                        "--prometheus-ca-file {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
                        ca.display()
                    ),
                ));
            }
        }
        let opts = gpuops_observe::HttpOptions {
            prometheus_token_file: self.bearer_token_file.clone(),
            prometheus_ca: self.ca_file.clone(),
            ..gpuops_observe::HttpOptions::default()
        };
        gpuops_observe::Http::new(&opts, true).map_err(|e| bad(&shown, gpuops_observe::chain(&e)))
    }
}

/// Polls every `source.poll` into `feed` until `shutdown`. Each request has the HTTP client's
/// timeout and runs here, never in the decision loop, which only reads `feed`.
///
/// # Errors
/// When the HTTP client cannot be set up (a token or CA file that cannot be read): checked
/// once here so a wrong flag stops the start instead of only logging every 30 s.
pub fn spawn(
    source: Source,
    idle: Duration,
    feed: Arc<Feed>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ControllerError> {
    let mut http = source.client()?;
    let base = source.url.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                r = fetch(&http, &base, idle) => match r {
                    Ok(v) => {
                        tracing::debug!(nodes = v.len(), "GPU utilization read from Prometheus");
                        feed.update(Instant::now(), v);
                    }
                    Err(e) => tracing::warn!(error = %e, "GPU utilization not read; keeping the last values"),
                },
            }
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                () = tokio::time::sleep(source.poll) => {}
            }
            // The token file again (rotation); on failure the previous client is kept.
            match source.client() {
                Ok(h) => http = h,
                Err(e) => tracing::warn!(error = %e, "keeping the previous Prometheus credentials"),
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const URL: &str = "http://prom.example:9090";

    #[test]
    fn query_names_the_idle_window_and_both_label_spellings() {
        let q = query(Duration::from_secs(600));
        assert_eq!(
            q,
            "max by (Hostname, hostname) (max_over_time(DCGM_FI_DEV_GPU_UTIL[600s]))"
        );
        let u = query_url("http://p:9090/", Duration::from_secs(60));
        assert!(
            u.starts_with("http://p:9090/api/v1/query?query=max%20by%20"),
            "{u}"
        );
        assert!(u.contains("%5B60s%5D"), "{u}");
    }

    #[test]
    fn check_url_accepts_http_and_refuses_the_rest() {
        assert_eq!(check_url(" http://p:9090/ ").unwrap(), "http://p:9090/");
        assert!(check_url("https://u:pw@prom.example/prometheus").is_ok());
        for (bad, want) in [
            ("prom:9090", "not an http:// or https:// URL"),
            ("ftp://p", "not an http:// or https:// URL"),
            ("http://", "no host"),
            ("http://:9090", "no host"),
            ("https://u:p@/x", "no host"),
        ] {
            let e = check_url(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn vector_result_maps_nodes_to_percent() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"Hostname":"gpu-a"},"value":[1700000000.1,"0"]},
            {"metric":{"hostname":"gpu-b"},"value":[1700000000.1,"87.5"]},
            {"metric":{"Hostname":"gpu-c","hostname":""},"value":[1700000000.1,"3"]},
            {"metric":{"hostname":"gpu-c"},"value":[1700000000.1,"5"]},
            {"metric":{},"value":[1700000000.1,"9"]}
        ]}}"#;
        let m = parse(URL, body).unwrap();
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m["gpu-a"], 0.0);
        assert_eq!(m["gpu-b"], 87.5);
        // Both spellings for one node (an exporter upgrade mid-window): the busier one wins.
        assert_eq!(m["gpu-c"], 5.0);
    }

    #[test]
    fn empty_result_is_no_measurement() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(parse(URL, body).unwrap().is_empty());
    }

    #[test]
    fn nan_and_inf_are_left_out_not_idle() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"Hostname":"a"},"value":[1,"NaN"]},
            {"metric":{"Hostname":"b"},"value":[1,"+Inf"]},
            {"metric":{"Hostname":"c"},"value":[1,"1"]}]}}"#;
        let m = parse(URL, body).unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn error_status_names_url_and_message() {
        let body = r#"{"status":"error","errorType":"bad_data","error":"parse error at char 4"}"#;
        let e = parse(URL, body).unwrap_err().to_string();
        assert!(e.contains(URL), "{e}");
        assert!(
            e.contains("bad_data") && e.contains("parse error at char 4"),
            "{e}"
        );
    }

    #[test]
    fn malformed_answers_are_clear_errors_naming_the_url() {
        for (body, want) in [
            ("<html>proxy error</html>", "not JSON"),
            (r#"{"status":"success"}"#, "no data"),
            (
                r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#,
                "\"vector\"",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":{}}}"#,
                "not a list",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"a"}}]}}"#,
                "data.result[0].value",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"a"},"value":[1,"x"]}]}}"#,
                "\"x\" is not a number",
            ),
        ] {
            let e = parse(URL, body).unwrap_err().to_string();
            assert!(e.contains(URL) && e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn feed_keeps_last_good_values_and_drops_stale_ones() {
        let feed = Feed::default();
        let t0 = Instant::now();
        assert!(feed.age(t0).is_none());
        feed.update(t0, HashMap::from([("a".into(), 0.0), ("b".into(), 50.0)]));
        // A later answer without `a` (its exporter missed a scrape) keeps a's value.
        let t1 = t0 + Duration::from_secs(120);
        feed.update(t1, HashMap::from([("b".into(), 60.0)]));
        let m = feed.fresh(t1, STALE_AFTER);
        assert_eq!((m["a"], m["b"]), (0.0, 60.0));
        assert_eq!(
            feed.age(t1 + Duration::from_secs(7)),
            Some(Duration::from_secs(7))
        );
        // Past STALE_AFTER since a was last read, a is forgotten; b is still fresh.
        let m = feed.fresh(t0 + STALE_AFTER + Duration::from_secs(1), STALE_AFTER);
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["b"]);
    }

    /// A loopback HTTP server answering one fixed document; returns the request line.
    fn serve_once(status: &str, body: &'static str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let status = status.to_string();
        let h = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "request cut short");
                got.extend_from_slice(&buf[..n]);
            }
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        (url, h)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn fetch_queries_the_http_api() {
        let (url, h) = serve_once(
            "200 OK",
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"Hostname":"gpu-0"},"value":[1,"12"]}]}}"#,
        );
        let http =
            gpuops_observe::Http::new(&gpuops_observe::HttpOptions::default(), true).unwrap();
        let m = runtime()
            .block_on(fetch(&http, &url, Duration::from_secs(600)))
            .unwrap();
        assert_eq!(m["gpu-0"], 12.0);
        let request = h.join().unwrap();
        let line = request.lines().next().unwrap();
        assert!(
            line.starts_with("GET /api/v1/query?query=max%20by%20%28Hostname%2C%20hostname%29"),
            "{line}"
        );
    }

    #[test]
    fn fetch_errors_name_the_url() {
        let (url, h) = serve_once(
            "400 Bad Request",
            r#"{"status":"error","errorType":"bad_data","error":"nope"}"#,
        );
        let http =
            gpuops_observe::Http::new(&gpuops_observe::HttpOptions::default(), true).unwrap();
        let e = runtime()
            .block_on(fetch(&http, &url, Duration::from_secs(600)))
            .unwrap_err()
            .to_string();
        h.join().unwrap();
        assert!(e.contains(&url) && e.contains("400"), "{e}");
        // Nothing listens: refused, still naming the URL.
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let e = runtime()
            .block_on(fetch(&http, &dead, Duration::from_secs(600)))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&dead), "{e}");
    }

    fn source(url: &str) -> Source {
        Source {
            url: url.to_string(),
            bearer_token_file: None,
            ca_file: None,
            poll: POLL,
        }
    }

    #[test]
    fn the_bearer_token_is_sent_from_its_file_and_read_again_for_each_client() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first-s3cret\n").unwrap();
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let mut src = source("");
        src.bearer_token_file = Some(token.clone());
        for want in ["first-s3cret", "rotated-s3cret"] {
            let (url, h) = serve_once("200 OK", body);
            src.url = url;
            let http = src.client().unwrap();
            runtime()
                .block_on(fetch(&http, &src.url, Duration::from_secs(60)))
                .unwrap();
            let request = h.join().unwrap().to_ascii_lowercase();
            assert!(
                request.contains(&format!("authorization: bearer {want}\r\n")),
                "{request}"
            );
            std::fs::write(&token, "rotated-s3cret").unwrap();
        }
        // What may reach a log: the source's Debug and the client's errors.
        let shown = format!("{src:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("token"), "names the file: {shown}");
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let e = runtime()
            .block_on(fetch(
                &src.client().unwrap(),
                &dead,
                Duration::from_secs(60),
            ))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn url_passwords_stay_out_of_debug_and_errors() {
        let src = source("http://admin:pa55word@127.0.0.1:1/prom");
        let shown = format!("{src:?}");
        assert!(!shown.contains("pa55word"), "{shown}");
        assert!(shown.contains("http://***@127.0.0.1:1/prom"), "{shown}");
        assert_eq!(redact("https://p.example/x@y"), "https://p.example/x@y");
        let e = runtime()
            .block_on(fetch(
                &src.client().unwrap(),
                &src.url,
                Duration::from_secs(60),
            ))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pa55word") && e.contains("127.0.0.1:1"), "{e}");
    }

    #[test]
    fn unreadable_token_or_ca_files_name_the_flag_and_the_file() {
        let mut src = source("https://p.example");
        src.bearer_token_file = Some("/nonexistent/token".into());
        let e = src.client().unwrap_err().to_string();
        assert!(
            e.contains("--prometheus-bearer-token-file /nonexistent/token"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let mut src = source("https://p.example");
        src.ca_file = Some(ca.clone());
        let e = src.client().unwrap_err().to_string();
        assert!(e.contains(&ca.display().to_string()), "{e}");
        src.ca_file = Some("/nonexistent/ca.pem".into());
        let e = src.client().unwrap_err().to_string();
        assert!(
            e.contains("--prometheus-ca-file /nonexistent/ca.pem"),
            "{e}"
        );
    }
}
