//! A byte proxy in front of the DRA plugin's registration socket that makes the kubelet's
//! requests acceptable to our HTTP/2 server.
//!
//! Why: the kubelet's plugin watcher (k8s.io/kubernetes v1.35.4,
//! pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go `dial`) dials the socket's
//! bare path, so grpc-go sends that path as `:authority`. A path is not a valid authority, and
//! the h2 crate under tonic answers such a request with RST_STREAM PROTOCOL_ERROR: the kubelet
//! logs `RegisterPlugin error -- failed to get plugin info using RPC GetInfo ... PROTOCOL_ERROR`
//! and never registers the driver (seen on the test bed's real node). Go servers accept it; the
//! kubelet's DRA calls themselves dial `unix:<path>` and send `localhost`. So the agent listens
//! on the registration path the kubelet watches and forwards every connection to the plugin's
//! own socket, rewriting the `:authority` of the kubelet's header blocks to `localhost`.
//!
//! Only HEADERS frames that carry a whole header block (END_HEADERS) are rewritten; everything
//! else passes unchanged. A rewritten literal keeps its HPACK indexing mode, so the server's
//! dynamic table holds `localhost` where the client's holds the path, and later references to
//! that entry resolve to `localhost` too.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HPACK's static table index of `:authority`.
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

/// Reads an HPACK integer with an `n`-bit prefix at `buf[*pos]`.
fn integer(buf: &[u8], pos: &mut usize, n: u32) -> Option<u64> {
    let mask = (1u16 << n) as u8 - 1;
    let mut value = u64::from(*buf.get(*pos)? & mask);
    *pos += 1;
    if value < u64::from(mask) {
        return Some(value);
    }
    let mut shift = 0;
    loop {
        let b = *buf.get(*pos)?;
        *pos += 1;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// Skips an HPACK string literal; returns (raw bytes, huffman) of its content.
fn string<'a>(buf: &'a [u8], pos: &mut usize) -> Option<(&'a [u8], bool)> {
    let huffman = *buf.get(*pos)? & 0x80 != 0;
    let len = usize::try_from(integer(buf, pos, 7)?).ok()?;
    let end = pos.checked_add(len)?;
    let bytes = buf.get(*pos..end)?;
    *pos = end;
    Some((bytes, huffman))
}

/// The header block with every literal `:authority` value replaced by `localhost`; `None`
/// when the block cannot be parsed (then it is passed on as it was).
pub fn rewrite_authority(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut pos = 0;
    while pos < block.len() {
        let start = pos;
        let b = block[pos];
        if b & 0x80 != 0 {
            integer(block, &mut pos, 7)?;
            out.extend_from_slice(&block[start..pos]);
            continue;
        }
        if b & 0xe0 == 0x20 {
            integer(block, &mut pos, 5)?;
            out.extend_from_slice(&block[start..pos]);
            continue;
        }
        // A literal: with incremental indexing (01), or without / never indexed (0000, 0001).
        let prefix = if b & 0xc0 == 0x40 { 6 } else { 4 };
        let index = integer(block, &mut pos, prefix)?;
        let is_authority = if index == 0 {
            let (name, huffman) = string(block, &mut pos)?;
            !huffman && name == b":authority"
        } else {
            index == AUTHORITY_INDEX
        };
        let name_end = pos;
        string(block, &mut pos)?;
        out.extend_from_slice(&block[start..name_end]);
        if is_authority {
            out.push(LOCALHOST.len() as u8);
            out.extend_from_slice(LOCALHOST);
        } else {
            out.extend_from_slice(&block[name_end..pos]);
        }
    }
    Some(out)
}

/// A HEADERS frame's payload with its header block rewritten (padding and priority kept).
fn rewrite_headers_payload(flags: u8, payload: &[u8]) -> Option<Vec<u8>> {
    let mut start = 0;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start = 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    let block = payload.get(start..end)?;
    let mut out = payload[..start].to_vec();
    out.extend(rewrite_authority(block)?);
    out.extend_from_slice(&payload[end..]);
    Some(out)
}

/// Copies the client's side of one connection, rewriting the header blocks.
async fn client_to_server(
    mut from: tokio::net::unix::OwnedReadHalf,
    mut to: tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<()> {
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: pass the rest through untouched.
        tokio::io::copy(&mut from, &mut to).await?;
        return Ok(());
    }
    loop {
        let mut header = [0u8; 9];
        if from.read_exact(&mut header).await.is_err() {
            return to.shutdown().await;
        }
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        let (kind, flags) = (header[3], header[4]);
        if kind == HEADERS
            && flags & END_HEADERS != 0
            && let Some(new) = rewrite_headers_payload(flags, &payload)
        {
            let n = new.len();
            header[0] = (n >> 16) as u8;
            header[1] = (n >> 8) as u8;
            header[2] = n as u8;
            payload = new;
        }
        to.write_all(&header).await?;
        to.write_all(&payload).await?;
    }
}

async fn forward(client: UnixStream, target: PathBuf) {
    let server = match UnixStream::connect(&target).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "DRA registration proxy: the plugin's socket {} does not answer: {e}", target.display());
            return;
        }
    };
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let up = client_to_server(client_r, server_w);
    let down = async move {
        let (mut r, mut w) = (server_r, client_w);
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    };
    let _ = tokio::join!(up, down);
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Serves `listen` (the path the kubelet watches) by forwarding to `target` until `stop`; the
/// socket is made again when it vanishes (a kubelet restart may clear the directory), and
/// removed at the end.
pub async fn serve(listen: PathBuf, target: PathBuf, mut stop: watch::Receiver<bool>) {
    let mut listener: Option<UnixListener> = None;
    let mut said: Option<String> = None;
    loop {
        if listener.is_none() || !listen.exists() {
            match bind(&listen) {
                Ok(l) => {
                    listener = Some(l);
                    said = None;
                }
                Err(e) => {
                    let text = e.to_string();
                    if said.as_ref() != Some(&text) {
                        tracing::error!(error = %e, "DRA registration proxy: cannot listen on {}: {e}", listen.display());
                        said = Some(text);
                    }
                    listener = None;
                }
            }
        }
        let accept = async {
            match &listener {
                Some(l) => l.accept().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.changed() => break,
            accepted = accept => {
                if let Some((client, _)) = accepted {
                    tokio::spawn(forward(client, target.clone()));
                }
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if *stop.borrow() {
            break;
        }
    }
    let _ = std::fs::remove_file(&listen);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A literal with incremental indexing of static name 1 (`:authority`), raw value `v`.
    fn authority_literal(v: &[u8]) -> Vec<u8> {
        let mut b = vec![0x40 | 1, v.len() as u8];
        b.extend_from_slice(v);
        b
    }

    #[test]
    fn the_kubelets_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let path = b"/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (indexed)
        block.extend(authority_literal(path));
        // :path as a literal without indexing of static name 4.
        block.extend([0x04, 0x05]);
        block.extend(b"/a/Gi");
        // a size update then a literal with a new name.
        block.push(0x3f);
        block.push(0x01);
        block.extend([0x40, 0x02]);
        block.extend(b"te");
        block.push(0x08);
        block.extend(b"trailers");
        let out = rewrite_authority(&block).unwrap();
        let mut want = vec![0x83, 0x86];
        want.extend(authority_literal(b"localhost"));
        want.extend([0x04, 0x05]);
        want.extend(b"/a/Gi");
        want.extend([0x3f, 0x01, 0x40, 0x02]);
        want.extend(b"te");
        want.push(0x08);
        want.extend(b"trailers");
        assert_eq!(out, want);
    }

    #[test]
    fn a_long_value_with_a_multibyte_length_and_a_literal_name_are_rewritten() {
        let long = vec![b'/'; 200];
        // Length 200 with a 7-bit prefix: 127, then 73.
        let mut block = vec![0x00, 0x0a];
        block.extend(b":authority");
        block.extend([0x7f, 73]);
        block.extend(&long);
        let out = rewrite_authority(&block).unwrap();
        let mut want = vec![0x00, 0x0a];
        want.extend(b":authority");
        want.push(9);
        want.extend(b"localhost");
        assert_eq!(out, want);
    }

    #[test]
    fn a_truncated_block_is_left_alone_and_padding_and_priority_are_kept() {
        assert_eq!(rewrite_authority(&[0x41, 0x20, b'a']), None);
        let mut payload = vec![2]; // pad length
        payload.extend([0, 0, 0, 1, 16]); // priority
        payload.extend(authority_literal(b"/x"));
        payload.extend([0, 0]); // padding
        let out = rewrite_headers_payload(PADDED | PRIORITY | END_HEADERS, &payload).unwrap();
        let mut want = vec![2, 0, 0, 0, 1, 16];
        want.extend(authority_literal(b"localhost"));
        want.extend([0, 0]);
        assert_eq!(out, want);
    }
}
