//! Field extraction for one event, positional (array events) or by name (map events).
//!
//! Both shapes feed the same [`Fields`] accumulator, so the two layouts cannot drift apart.
//! Fields every release sends (`block_hashes`, `token_ids`, `block_size`) are strict; optional
//! metadata is lenient: a value of an unexpected type is skipped rather than failing the batch,
//! because a future release changing a field we barely use must not blind the index.

use super::msgpack::{DecodeError, Kind, Reader};
use super::wire::{BlockRemoved, BlockStored, EngineHash, KvEvent};

/// Event fields the router reads; everything else is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    /// vLLM's `lora_name`, or SGLang's `metadata` map in the same array slot.
    LoraName,
    ExtraKeys,
    GroupIdx,
    KvCacheSpecKind,
    /// SGLang ≥ 0.5.20 sends `cache_salt` as its own field.
    CacheSalt,
    /// SGLang's `BlockStoredWithMetadata` carries `{"cache_salt": …}`.
    Metadata,
    Ignored,
}

/// BlockStored fields in declaration order; vLLM and SGLang agree on the first six, and
/// vLLM's array releases append the rest in this order. Later positions are ignored.
const STORED_ORDER: [Field; 10] = [
    Field::BlockHashes,
    Field::ParentBlockHash,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraName,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::KvCacheSpecKind,
];

/// BlockRemoved fields in declaration order.
const REMOVED_ORDER: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];

fn field_named(name: &str) -> Field {
    match name {
        "block_hashes" => Field::BlockHashes,
        "parent_block_hash" => Field::ParentBlockHash,
        "token_ids" => Field::TokenIds,
        "block_size" => Field::BlockSize,
        "lora_id" => Field::LoraId,
        "medium" => Field::Medium,
        "lora_name" => Field::LoraName,
        "extra_keys" => Field::ExtraKeys,
        "group_idx" => Field::GroupIdx,
        "kv_cache_spec_kind" => Field::KvCacheSpecKind,
        "cache_salt" => Field::CacheSalt,
        "metadata" => Field::Metadata,
        _ => Field::Ignored,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag<'a> {
    Stored,
    Removed,
    Cleared,
    Unknown(&'a str),
}

impl<'a> Tag<'a> {
    fn from_name(name: &'a str) -> Self {
        match name {
            "BlockStored" => Tag::Stored,
            "BlockRemoved" => Tag::Removed,
            "AllBlocksCleared" => Tag::Cleared,
            other => Tag::Unknown(other),
        }
    }
}

/// What one event said, borrowed from the payload until the event is built.
#[derive(Default)]
struct Fields<'a> {
    block_hashes: Option<Vec<EngineHash>>,
    parent_block_hash: Option<EngineHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<&'a str>,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    /// Bytes of `extra_keys[0]`, read once `lora_name` is known.
    first_extra_keys: Option<&'a [u8]>,
    group_idx: Option<i64>,
    kv_cache_spec_kind: Option<&'a str>,
}

/// Reads one event (array or map) at the cursor.
pub(crate) fn read_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    match r.peek()? {
        Kind::Array => read_array_event(r),
        Kind::Map => read_map_event(r),
        _ => Err(DecodeError::UnexpectedType {
            expected: "event (array or map)",
            offset: r.position(),
        }),
    }
}

fn read_array_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let len = r.array_len()?;
    if len == 0 {
        return Err(DecodeError::UnexpectedType {
            expected: "event tag",
            offset: r.position(),
        });
    }
    let tag = Tag::from_name(r.str()?);
    let order: &[Field] = match tag {
        Tag::Stored => &STORED_ORDER,
        Tag::Removed => &REMOVED_ORDER,
        Tag::Cleared | Tag::Unknown(_) => &[],
    };
    let mut fields = Fields::default();
    for i in 0..len - 1 {
        let field = order.get(i).copied().unwrap_or(Field::Ignored);
        read_field(r, field, &mut fields)?;
    }
    build(tag, fields)
}

fn read_map_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let len = r.map_len()?;
    let tag = find_tag(r, len)?;
    let mut fields = Fields::default();
    for _ in 0..len {
        let key = map_key(r)?.unwrap_or("");
        let field = match (tag, key) {
            (_, "type") | (Tag::Cleared | Tag::Unknown(_), _) => Field::Ignored,
            _ => field_named(key),
        };
        read_field(r, field, &mut fields)?;
    }
    build(tag, fields)
}

/// The `"type"` of a map event. msgspec always writes it first; other writers are scanned for.
fn find_tag<'a>(r: &Reader<'a>, len: usize) -> Result<Tag<'a>, DecodeError> {
    let mut scan = r.clone();
    for _ in 0..len {
        if map_key(&mut scan)? == Some("type") {
            return Ok(Tag::from_name(scan.str()?));
        }
        scan.skip()?;
    }
    Err(DecodeError::MissingField {
        event: "event",
        field: "type",
    })
}

/// Reads a map key: a string, or `None` after skipping a key of another type.
fn map_key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a str>, DecodeError> {
    if r.peek()? == Kind::Str {
        Ok(Some(r.str()?))
    } else {
        r.skip()?;
        Ok(None)
    }
}

fn read_field<'a>(
    r: &mut Reader<'a>,
    field: Field,
    out: &mut Fields<'a>,
) -> Result<(), DecodeError> {
    match field {
        Field::BlockHashes => out.block_hashes = Some(read_hashes(r)?),
        Field::ParentBlockHash => {
            out.parent_block_hash = if r.eat_nil()? {
                None
            } else {
                Some(read_hash(r)?)
            }
        }
        Field::TokenIds => out.token_ids = Some(read_tokens(r)?),
        Field::BlockSize => {
            out.block_size =
                Some(u32::try_from(r.int()?).map_err(|_| DecodeError::OutOfRange("block_size"))?)
        }
        Field::LoraId => out.lora_id = lenient_int(r)?,
        Field::GroupIdx => out.group_idx = lenient_int(r)?,
        Field::Medium => out.medium = lenient_str(r)?,
        Field::KvCacheSpecKind => out.kv_cache_spec_kind = lenient_str(r)?,
        Field::CacheSalt => out.cache_salt = lenient_str(r)?.or(out.cache_salt),
        Field::LoraName if r.peek()? == Kind::Map => read_metadata(r, out)?,
        Field::LoraName => out.lora_name = lenient_str(r)?,
        Field::Metadata => read_metadata(r, out)?,
        Field::ExtraKeys => out.first_extra_keys = first_element(r)?,
        Field::Ignored => r.skip()?,
    }
    Ok(())
}

fn build(tag: Tag<'_>, f: Fields<'_>) -> Result<KvEvent, DecodeError> {
    let missing = |event, field| DecodeError::MissingField { event, field };
    Ok(match tag {
        Tag::Stored => {
            let cache_salt = match f.cache_salt {
                Some(salt) => Some(salt.to_owned()),
                // vLLM salts only the request's first block, which has no parent.
                None if f.parent_block_hash.is_none() => f
                    .first_extra_keys
                    .and_then(|keys| salt_from_extra_keys(keys, f.lora_name)),
                None => None,
            };
            KvEvent::Stored(BlockStored {
                block_hashes: f
                    .block_hashes
                    .ok_or(missing("BlockStored", "block_hashes"))?,
                parent_block_hash: f.parent_block_hash,
                token_ids: f.token_ids.ok_or(missing("BlockStored", "token_ids"))?,
                block_size: f.block_size.ok_or(missing("BlockStored", "block_size"))?,
                lora_id: f.lora_id,
                medium: f.medium.map(str::to_owned),
                lora_name: f.lora_name.map(str::to_owned),
                cache_salt,
                group_idx: f.group_idx,
                kv_cache_spec_kind: f.kv_cache_spec_kind.map(str::to_owned),
            })
        }
        Tag::Removed => KvEvent::Removed(BlockRemoved {
            block_hashes: f
                .block_hashes
                .ok_or(missing("BlockRemoved", "block_hashes"))?,
            medium: f.medium.map(str::to_owned),
            group_idx: f.group_idx,
        }),
        Tag::Cleared => KvEvent::AllCleared,
        Tag::Unknown(name) => KvEvent::Unknown(name.to_owned()),
    })
}

/// A block hash: a signed or unsigned 64-bit int, or bytes whose last 8 form a big-endian id
/// (vLLM's 32-byte sha256 digests; shorter blobs are zero-extended on the left).
fn read_hash(r: &mut Reader<'_>) -> Result<EngineHash, DecodeError> {
    match r.peek()? {
        Kind::Bin => {
            let bytes = r.bin()?;
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(EngineHash(
                tail.iter().fold(0u64, |acc, b| (acc << 8) | *b as u64),
            ))
        }
        _ => {
            let v = r.int()?;
            // Negative ids (Python `hash()`, SGLang's int64) keep their two's-complement bits.
            if v < 0 {
                i64::try_from(v).map(|v| EngineHash(v as u64))
            } else {
                u64::try_from(v).map(EngineHash)
            }
            .map_err(|_| DecodeError::OutOfRange("block hash"))
        }
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<EngineHash>, DecodeError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        out.push(read_hash(r)?);
    }
    Ok(out)
}

fn read_tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        out.push(r.u32()?);
    }
    Ok(out)
}

fn lenient_int(r: &mut Reader<'_>) -> Result<Option<i64>, DecodeError> {
    if r.peek()? == Kind::Int {
        Ok(i64::try_from(r.int()?).ok())
    } else {
        r.skip()?;
        Ok(None)
    }
}

fn lenient_str<'a>(r: &mut Reader<'a>) -> Result<Option<&'a str>, DecodeError> {
    if r.peek()? == Kind::Str {
        Ok(Some(r.str()?))
    } else {
        r.skip()?;
        Ok(None)
    }
}

/// SGLang's metadata: a map with `cache_salt` (msgspec default), or `[cache_salt]` if a
/// release ever makes it array-like.
fn read_metadata<'a>(r: &mut Reader<'a>, out: &mut Fields<'a>) -> Result<(), DecodeError> {
    match r.peek()? {
        Kind::Map => {
            for _ in 0..r.map_len()? {
                if map_key(r)? == Some("cache_salt") {
                    out.cache_salt = lenient_str(r)?;
                } else {
                    r.skip()?;
                }
            }
        }
        Kind::Array => {
            for i in 0..r.array_len()? {
                if i == 0 {
                    out.cache_salt = lenient_str(r)?;
                } else {
                    r.skip()?;
                }
            }
        }
        _ => r.skip()?,
    }
    Ok(())
}

/// Skips `extra_keys` (one entry per block, or nil) and returns the bytes of its first entry.
fn first_element<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
    if r.peek()? != Kind::Array {
        r.skip()?;
        return Ok(None);
    }
    let n = r.array_len()?;
    let mut first = None;
    for i in 0..n {
        let start = r.position();
        r.skip()?;
        if i == 0 {
            first = Some(r.slice(start, r.position()));
        }
    }
    Ok(first)
}

/// vLLM ≥ 0.17 builds a block's extra keys as `lora_name? + mm keys + [cache_salt] +
/// prompt-embeds digests`, salt on the first block only. Multimodal keys are tuples and digests
/// are bytes, so the salt is the last string after a leading LoRA name.
fn salt_from_extra_keys(bytes: &[u8], lora_name: Option<&str>) -> Option<String> {
    let mut r = Reader::new(bytes);
    let n = r.array_len().ok()?;
    let mut salt = None;
    for i in 0..n {
        if r.peek().ok()? == Kind::Str {
            let s = r.str().ok()?;
            let is_lora_key = i == 0 && lora_name == Some(s);
            if !is_lora_key {
                salt = Some(s);
            }
        } else {
            r.skip().ok()?;
        }
    }
    salt.map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn salt(keys: &[u8], lora: Option<&str>) -> Option<String> {
        salt_from_extra_keys(keys, lora)
    }

    #[test]
    fn salt_is_the_last_string_after_the_lora_name() {
        // ("tenant",)
        assert_eq!(salt(b"\x91\xa6tenant", None).as_deref(), Some("tenant"));
        // ("ad", ["img", 8], "tenant", b"\x01")
        let keys = b"\x94\xa2ad\x92\xa3img\x08\xa6tenant\xc4\x01\x01";
        assert_eq!(salt(keys, Some("ad")).as_deref(), Some("tenant"));
        // ("ad",) is the LoRA key of an unsalted request.
        assert_eq!(salt(b"\x91\xa2ad", Some("ad")), None);
        // ("ad", "ad"): salt equal to the adapter name.
        assert_eq!(salt(b"\x92\xa2ad\xa2ad", Some("ad")).as_deref(), Some("ad"));
        assert_eq!(salt(b"\xc0", None), None);
    }

    #[test]
    fn bytes_hashes_use_the_last_eight_bytes() {
        let mut p = vec![0xc4, 32];
        p.extend((0u8..32).collect::<Vec<_>>());
        let h = read_hash(&mut Reader::new(&p)).unwrap();
        assert_eq!(
            h,
            EngineHash(u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31]))
        );
        let h = read_hash(&mut Reader::new(&[0xc4, 2, 1, 2])).unwrap();
        assert_eq!(h, EngineHash(0x0102));
    }

    #[test]
    fn map_events_with_the_type_last_and_sglang_metadata() {
        // {"block_hashes": [1], 7: "x", "metadata": {"a": [1], "cache_salt": "t"},
        //  "token_ids": [], "block_size": 16, "type": "BlockStored"}
        let mut p = vec![0x86, 0xac];
        p.extend_from_slice(b"block_hashes");
        p.extend_from_slice(&[0x91, 0x01, 0x07, 0xa1, b'x', 0xa8]);
        p.extend_from_slice(b"metadata");
        p.extend_from_slice(&[0x82, 0xa1, b'a', 0x91, 0x01, 0xaa]);
        p.extend_from_slice(b"cache_salt");
        p.extend_from_slice(&[0xa1, b't', 0xa9]);
        p.extend_from_slice(b"token_ids");
        p.extend_from_slice(&[0x90, 0xaa]);
        p.extend_from_slice(b"block_size");
        p.extend_from_slice(&[0x10, 0xa4]);
        p.extend_from_slice(b"type");
        p.push(0xab);
        p.extend_from_slice(b"BlockStored");
        let KvEvent::Stored(s) = read_event(&mut Reader::new(&p)).unwrap() else {
            panic!("not a BlockStored");
        };
        assert_eq!(s.block_hashes, vec![EngineHash(1)]);
        assert_eq!(s.cache_salt.as_deref(), Some("t"));
        assert_eq!(s.block_size, 16);
    }

    #[test]
    fn negative_hashes_keep_their_bits() {
        let h = read_hash(&mut Reader::new(&[0xff])).unwrap();
        assert_eq!(h, EngineHash(u64::MAX));
    }
}
