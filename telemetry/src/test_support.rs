//! Helpers shared by the encoders' tests.

/// A seeded xorshift64 stream: deterministic test data without a dependency.
pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Reads one ULEB128 value at `*at`, advancing it (the reference decoders' reader).
pub(crate) fn read_uleb128(data: &[u8], at: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let b = data[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return v;
        }
    }
}
