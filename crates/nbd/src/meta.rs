//! Metadata contexts: `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT` during the
//! handshake, and the block status descriptors of the one context compcache offers,
//! `base:allocation`.
//!
//! # What `base:allocation` says
//! From [`compcache_store::Store::block_status`]: a page that reads as zeroes and holds no
//! memory ([`Allocation::Hole`]: never written, discarded, or written with zeroes, which the
//! store keeps as a same-filled page with fill word 0, only a slot entry, as zram does) is
//! `NBD_STATE_HOLE | NBD_STATE_ZERO`; anything else (compressed, raw, same-filled with a
//! non-zero word, on the backing device) is 0, data. The rule is nbdkit's memory plugin's:
//! `HOLE` exactly where nothing is stored (its sparse array reports a page it holds as `ZERO`
//! only, even when the page is all zeroes, and a page it does not hold as `HOLE | ZERO`).
//! compcache stores nothing for a zero-filled page but its slot entry, as zram does, so such
//! a page is a hole too; the copying clients (`nbdcopy`, `qemu-img convert`) skip it either
//! way. A page same-filled with a non-zero word is reported as data, not as a hole: `HOLE`
//! without `ZERO` would tell a client that its contents are undefined.
//!
//! One deviation the spec's wording does not foresee: it says a write to an extent without
//! `HOLE` must not fail with `ENOSPC`. In a compressed store every write allocates a new
//! object before the old one is freed, so with `--mem-limit` an overwrite of data can fail with
//! `ENOSPC` as a first write can; without a limit it fails only when memory itself runs out.
//!
//! # Negotiation
//! Both options need `NBD_OPT_STRUCTURED_REPLY` first (the spec: SET MUST NOT come before it,
//! and the server MAY refuse LIST; nbdkit refuses both): `NBD_REP_ERR_INVALID`. Queries:
//! `base:allocation` selects or lists the context; `base:` lists it (and selects nothing); a
//! query in an unknown namespace, or an unknown leaf of `base:`, is ignored as the spec
//! requires; a query without a namespace (no colon) is `NBD_REP_ERR_INVALID`. LIST without
//! queries lists every context. SET replaces the previous selection even when it fails.

use crate::wire::*;
use compcache_store::{Allocation, Extent};

/// The one metadata context compcache offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id of `base:allocation` when selected (the server's choice; clients treat it as opaque
/// and take it from the `NBD_REP_META_CONTEXT` reply). LIST replies carry 0, as the spec says.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// The most descriptors one BLOCK_STATUS reply carries (128 KiB of them: the reply is built in
/// the worker's request buffer, which keeps up to 1 MiB without reallocating). A range with
/// more extents is answered for its first part; the client asks again from where it ends, as
/// the spec allows. That is at least 64 MiB of the worst case (every page changing state),
/// and the whole range in the usual one (long runs).
pub const MAX_EXTENTS: usize = 16 << 10;
/// The size of one block status descriptor: length and flags, 32 bits each.
pub const DESCRIPTOR_BYTES: usize = 8;

/// The data of LIST/SET_META_CONTEXT, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    pub export: &'a [u8],
    pub queries: Vec<&'a [u8]>,
}

/// Parses the data of LIST/SET_META_CONTEXT: export name length, name, number of queries,
/// then each query's length and bytes; nothing may be left over.
pub fn parse_request(data: &[u8]) -> Result<MetaRequest<'_>, String> {
    let mut rest = data;
    let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
        if rest.len() < n {
            return Err(format!("meta context request: {what} of {n} bytes overruns the {}-byte option", data.len()));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let name_len = be32(take(4, "the export name length")?) as usize;
    let export = take(name_len, "the export name")?;
    let count = be32(take(4, "the number of queries")?) as usize;
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = be32(take(4, "a query length")?) as usize;
        queries.push(take(len, "a query")?);
    }
    if !rest.is_empty() {
        return Err(format!("meta context request: {} bytes after the last of its {count} queries", rest.len()));
    }
    Ok(MetaRequest { export, queries })
}

/// Whether `query` names `base:allocation`: for SET the exact name only; for LIST also the
/// wildcard `base:`. Another leaf of `base:`, or another namespace, names nothing (and is no
/// error). A query without a namespace is an error.
pub fn selects_base_allocation(query: &[u8], listing: bool) -> Result<bool, String> {
    if !query.contains(&b':') {
        return Err(format!(
            "meta context query {:?} has no namespace (queries are namespace:leaf, e.g. {BASE_ALLOCATION:?})",
            String::from_utf8_lossy(query)
        ));
    }
    Ok(query == BASE_ALLOCATION.as_bytes() || (listing && query == b"base:"))
}

/// The `base:allocation` flags of an extent.
pub fn state_flags(a: Allocation) -> u32 {
    match a {
        Allocation::Hole => STATE_HOLE | STATE_ZERO,
        Allocation::Data => 0,
    }
}

/// Room for the descriptors of a BLOCK_STATUS reply for `len` bytes at `offset`: one per page
/// the range touches (the most extents it can have), at most [`MAX_EXTENTS`], one with
/// `NBD_CMD_FLAG_REQ_ONE`.
pub fn descriptor_room(offset: u64, len: u32, req_one: bool) -> usize {
    let pages = ((offset % compcache_store::PAGE_SIZE as u64) + len as u64).div_ceil(compcache_store::PAGE_SIZE as u64);
    let n = if req_one { 1 } else { (pages as usize).clamp(1, MAX_EXTENTS) };
    n * DESCRIPTOR_BYTES
}

/// Encodes block status descriptors for `extents` into `out`, as many as fit; returns the
/// bytes written. The extents come from a range of at most `u32::MAX` bytes, so each length
/// fits a descriptor.
pub fn encode_extents(out: &mut [u8], extents: impl Iterator<Item = Extent>) -> usize {
    let mut n = 0;
    for (d, e) in out.chunks_exact_mut(DESCRIPTOR_BYTES).zip(extents) {
        let len = u32::try_from(e.len_bytes).expect("an extent of a request is no longer than its 32-bit length");
        d[0..4].copy_from_slice(&len.to_be_bytes());
        d[4..8].copy_from_slice(&state_flags(e.allocation).to_be_bytes());
        n += DESCRIPTOR_BYTES;
    }
    n
}

/// The option data [`parse_request`] reads, for tests (the server never sends one).
#[cfg(test)]
pub(crate) fn encode_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::encode_request as request;

    #[test]
    fn requests_parse_and_malformed_ones_are_refused() {
        let d = request("compcache", &["base:allocation", "qemu:dirty-bitmap:x"]);
        let r = parse_request(&d).unwrap();
        assert_eq!(r.export, b"compcache");
        assert_eq!(r.queries, vec![&b"base:allocation"[..], b"qemu:dirty-bitmap:x"]);
        assert_eq!(parse_request(&request("", &[])).unwrap(), MetaRequest { export: b"", queries: vec![] });

        assert!(parse_request(&d[..d.len() - 1]).unwrap_err().contains("overruns"));
        assert!(parse_request(&d[..3]).unwrap_err().contains("export name length"));
        let mut extra = d.clone();
        extra.push(0);
        assert!(parse_request(&extra).unwrap_err().contains("after the last"));
        let mut many = request("", &[]);
        many[7] = 200; // 200 queries announced, none sent
        assert!(parse_request(&many).unwrap_err().contains("query length"));
    }

    #[test]
    fn queries_select_base_allocation_only() {
        assert_eq!(selects_base_allocation(b"base:allocation", false), Ok(true));
        assert_eq!(selects_base_allocation(b"base:allocation", true), Ok(true));
        assert_eq!(selects_base_allocation(b"base:", true), Ok(true), "the wildcard lists");
        assert_eq!(selects_base_allocation(b"base:", false), Ok(false), "and selects nothing");
        assert_eq!(selects_base_allocation(b"base:other", true), Ok(false));
        assert_eq!(selects_base_allocation(b"qemu:dirty-bitmap:a", false), Ok(false), "unknown namespaces are ignored");
        assert!(selects_base_allocation(b"allocation", false).unwrap_err().contains("no namespace"));
    }

    #[test]
    fn descriptors_and_their_room() {
        let extents = [Extent { len_bytes: 8192, allocation: Allocation::Data }, Extent { len_bytes: 100, allocation: Allocation::Hole }];
        let mut out = [0u8; 24];
        assert_eq!(encode_extents(&mut out, extents.into_iter()), 16);
        assert_eq!((be32(&out[0..4]), be32(&out[4..8])), (8192, 0));
        assert_eq!((be32(&out[8..12]), be32(&out[12..16])), (100, STATE_HOLE | STATE_ZERO));
        assert_eq!(encode_extents(&mut out[..8], extents.into_iter()), 8, "as many as fit");

        assert_eq!(descriptor_room(0, 4096, false), 8);
        assert_eq!(descriptor_room(4095, 2, false), 16, "two pages touched");
        assert_eq!(descriptor_room(0, u32::MAX, true), 8);
        assert_eq!(descriptor_room(0, u32::MAX, false), MAX_EXTENTS * 8);
    }
}
