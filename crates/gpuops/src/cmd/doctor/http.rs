//! A plain-HTTP GET for Prometheus and agent `/metrics` URLs (no TLS: port-forward or in-cluster).

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(15);

/// `http://host[:port]/path?query` -> (host:port, host, path?query).
fn split_url(url: &str) -> Result<(String, String, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!(
            "{url}: only http:// URLs are supported (for https use `kubectl port-forward` to a local port)"
        );
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        bail!("{url}: no host");
    }
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let host = authority.split(':').next().unwrap_or(authority).to_string();
    Ok((addr, host, path.to_string()))
}

/// GETs `url` and returns the body of a 200 answer.
pub fn get(url: &str) -> Result<String> {
    let (addr, host, path) = split_url(url)?;
    let sock = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&sock, TIMEOUT)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    // HTTP/1.0: the server closes the connection after the body, and does not chunk it.
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: */*\r\nUser-Agent: gpuops\r\n\r\n"
    )
    .with_context(|| format!("writing to {addr}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading from {addr}"))?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("{url}: not an HTTP answer");
    };
    let status = head.lines().next().unwrap_or("");
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code != "200" {
        bail!(
            "{url}: {status}: {}",
            body.chars().take(300).collect::<String>()
        );
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok(if chunked {
        dechunk(body)
    } else {
        body.to_string()
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
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
    use super::*;

    #[test]
    fn urls_and_encoding() {
        let (addr, host, path) =
            split_url("http://prom.monitoring:9090/api/v1/query?query=up").unwrap();
        assert_eq!(
            (addr.as_str(), host.as_str(), path.as_str()),
            (
                "prom.monitoring:9090",
                "prom.monitoring",
                "/api/v1/query?query=up"
            )
        );
        assert_eq!(split_url("http://p").unwrap().0, "p:80");
        assert!(split_url("https://p").is_err());
        assert_eq!(
            encode("a{b=~\"c|d\"}[1h]"),
            "a%7Bb%3D~%22c%7Cd%22%7D%5B1h%5D"
        );
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }

    #[test]
    fn a_local_server_answers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(
                    n > 0,
                    "request cut short: {:?}",
                    String::from_utf8_lossy(&got)
                );
                got.extend_from_slice(&buf[..n]);
            }
            assert!(String::from_utf8_lossy(&got).starts_with("GET /metrics HTTP/1.0"));
            s.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nup 1\n")
                .unwrap();
        });
        assert_eq!(
            get(&format!("http://127.0.0.1:{port}/metrics")).unwrap(),
            "up 1\n"
        );
        server.join().unwrap();
    }
}
