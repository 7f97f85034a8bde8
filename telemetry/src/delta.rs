//! Parquet's `DELTA_BINARY_PACKED` encoding of a page of integers, for the integer
//! columns the writer encodes itself ([`crate::int_column`]).
//!
//! The format (Parquet `Encodings.md`), with parquet-rs's layout: a header (block size
//! 128, 4 miniblocks per block, the value count, the first value zigzag-ULEB128), then
//! per block of 128 deltas the block's minimum delta (zigzag ULEB128), one bit-width
//! byte per miniblock and the miniblocks: 32 values `delta - min_delta`, bit-packed
//! LSB-first. Deltas wrap at the physical type's width, as readers compute them. In the
//! last block, the last miniblock is padded with zeros and the unused miniblocks have
//! width 0 and no bytes.
//!
//! parquet-rs's encoder spends about 45 instructions per value here (a bit writer that
//! packs one value at a time behind several layers). Here a miniblock is packed by a
//! function per bit width whose shifts and word indices are constants, a shift and an OR
//! per value.

use crate::rle::write_uleb128;

const BLOCK: usize = 128;
const MINIBLOCKS: usize = 4;
const MINIBLOCK: usize = BLOCK / MINIBLOCKS;

/// The physical type's width: where deltas wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Width {
    /// `INT32`; values are passed sign-extended to `i64`.
    W32,
    /// `INT64`.
    W64,
}

/// Delta arithmetic at one width, so the hot loops are compiled once per width.
trait Arithmetic {
    fn delta(value: i64, previous: i64) -> i64;
    /// `delta - min` as the unsigned value of the type's width.
    fn above(delta: i64, min: i64) -> u64;
}

struct Narrow;
struct Wide;

impl Arithmetic for Narrow {
    fn delta(value: i64, previous: i64) -> i64 {
        i64::from((value as i32).wrapping_sub(previous as i32))
    }
    fn above(delta: i64, min: i64) -> u64 {
        u64::from((delta as i32).wrapping_sub(min as i32) as u32)
    }
}

impl Arithmetic for Wide {
    fn delta(value: i64, previous: i64) -> i64 {
        value.wrapping_sub(previous)
    }
    fn above(delta: i64, min: i64) -> u64 {
        delta.wrapping_sub(min) as u64
    }
}

fn zigzag(v: i64, out: &mut Vec<u8>) {
    write_uleb128(((v << 1) ^ (v >> 63)) as u64, out);
}

/// Appends the encoding of `values` to `out`.
pub(crate) fn encode(values: &[i64], width: Width, out: &mut Vec<u8>) {
    // Header, plus per block its min delta, widths and at most 8 bytes per value.
    out.reserve(32 + values.len() * 8 + values.len().div_ceil(BLOCK) * (10 + MINIBLOCKS));
    match width {
        Width::W32 => encode_as::<Narrow>(values, out),
        Width::W64 => encode_as::<Wide>(values, out),
    }
}

fn encode_as<A: Arithmetic>(values: &[i64], out: &mut Vec<u8>) {
    write_uleb128(BLOCK as u64, out);
    write_uleb128(MINIBLOCKS as u64, out);
    write_uleb128(values.len() as u64, out);
    let Some((&first, rest)) = values.split_first() else {
        zigzag(0, out);
        return;
    };
    zigzag(first, out);
    let mut previous = first;
    let mut deltas = [0i64; BLOCK];
    let mut above = [0u64; BLOCK];
    for block in rest.chunks(BLOCK) {
        let n = block.len();
        // Differences of neighbours within the slice (no loop-carried value), so this
        // loop vectorises; the minimum is taken in its own pass.
        deltas[0] = A::delta(block[0], previous);
        for ((d, &v), &p) in deltas[1..n].iter_mut().zip(&block[1..]).zip(block) {
            *d = A::delta(v, p);
        }
        previous = block[n - 1];
        let min = deltas[..n].iter().copied().fold(i64::MAX, i64::min);
        zigzag(min, out);
        // The last miniblock is padded with zeros, which its width must cover too.
        for (a, &d) in above.iter_mut().zip(&deltas[..n]) {
            *a = A::above(d, min);
        }
        above[n..].fill(0);
        let minis = n.div_ceil(MINIBLOCK);
        let widths_at = out.len();
        out.extend_from_slice(&[0; MINIBLOCKS]);
        for (m, mini) in above.chunks_exact(MINIBLOCK).take(minis).enumerate() {
            let mini: &[u64; MINIBLOCK] = mini.try_into().expect("a miniblock");
            let bits = 64 - mini.iter().fold(0, |any, &a| any | a).leading_zeros();
            out[widths_at + m] = bits as u8;
            pack_miniblock(mini, bits, out);
        }
    }
}

/// A miniblock's 32 values of `bits` bits each, LSB-first: `4 × bits` bytes.
fn pack_miniblock(values: &[u64; MINIBLOCK], bits: u32, out: &mut Vec<u8>) {
    macro_rules! by_width {
        ($($b:literal)*) => {
            match bits {
                0 => {}
                $($b => pack_fixed::<$b>(values, out),)*
                _ => unreachable!("a bit width above 64"),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29
        30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57
        58 59 60 61 62 63 64);
}

/// [`pack_miniblock`] for one width: with `BITS` a constant and the loop written out,
/// every value's word and shift fold to constants, so each value costs a shift and an OR
/// (two of each when it straddles words) instead of a running bit position and a branch
/// (LLVM does not unroll the 32-iteration loop by itself).
#[inline(always)]
fn pack_fixed<const BITS: u32>(values: &[u64; MINIBLOCK], out: &mut Vec<u8>) {
    let mut words = [0u64; MINIBLOCK];
    macro_rules! put {
        ($($i:literal)*) => {$({
            let bit: u32 = $i * BITS;
            let (word, shift) = ((bit / 64) as usize, bit % 64);
            words[word] |= values[$i] << shift;
            if shift + BITS > 64 {
                words[word + 1] |= values[$i] >> (64 - shift);
            }
        })*};
    }
    put!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30
        31);
    let bytes = 4 * BITS as usize;
    let mut packed = [0u8; 8 * MINIBLOCK];
    for (to, w) in packed.chunks_exact_mut(8).zip(&words[..bytes.div_ceil(8)]) {
        to.copy_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&packed[..bytes]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{read_uleb128, xorshift};

    /// A reference decoder written from the format description.
    fn decode(data: &[u8], width: Width) -> Vec<i64> {
        let mut at = 0;
        let uleb = |at: &mut usize| read_uleb128(data, at);
        let unzig = |v: u64| ((v >> 1) as i64) ^ -((v & 1) as i64);
        let block = uleb(&mut at) as usize;
        let minis = uleb(&mut at) as usize;
        let n = uleb(&mut at) as usize;
        let first = unzig(uleb(&mut at));
        let mut out = Vec::new();
        if n == 0 {
            return out;
        }
        out.push(first);
        let per_mini = block / minis;
        while out.len() < n {
            let min = unzig(uleb(&mut at));
            let widths: Vec<u32> = (0..minis)
                .map(|_| {
                    u32::from(
                        data[{
                            at += 1;
                            at - 1
                        }],
                    )
                })
                .collect();
            for w in widths {
                if out.len() >= n {
                    break;
                }
                for k in 0..per_mini {
                    let mut v = 0u64;
                    for b in 0..w as usize {
                        let bit = k * w as usize + b;
                        v |= u64::from((data[at + bit / 8] >> (bit % 8)) & 1) << b;
                    }
                    if out.len() < n {
                        let prev = *out.last().unwrap();
                        let next = match width {
                            Width::W32 => i64::from(
                                (prev as i32)
                                    .wrapping_add((min as i32).wrapping_add(v as u32 as i32)),
                            ),
                            Width::W64 => prev.wrapping_add(min.wrapping_add(v as i64)),
                        };
                        out.push(next);
                    }
                }
                at += per_mini * w as usize / 8;
            }
        }
        assert_eq!(at, data.len(), "trailing bytes");
        out
    }

    fn round_trip(values: &[i64], width: Width) {
        let mut out = Vec::new();
        encode(values, width, &mut out);
        assert_eq!(
            decode(&out, width),
            values,
            "{width:?}, {} values",
            values.len()
        );
    }

    #[test]
    fn counters_timestamps_and_constants_round_trip() {
        round_trip(&[], Width::W64);
        round_trip(&[42], Width::W64);
        let ts: Vec<i64> = (0..1000)
            .map(|i| 1_741_910_400_000_000 + i * 1_000_000)
            .collect();
        round_trip(&ts, Width::W64);
        round_trip(&[7; 300], Width::W32);
        let counter: Vec<i64> = (0..517).map(|i| i * i * 31).collect();
        round_trip(&counter, Width::W64);
    }

    #[test]
    fn extremes_wrap_like_the_reader() {
        round_trip(&[i64::MAX, i64::MIN, 0, -1, i64::MAX, 5], Width::W64);
        // u64 counters near the top, stored as i64 bits.
        round_trip(&[u64::MAX as i64, 0, (u64::MAX - 1) as i64], Width::W64);
        // u32 values above i32::MAX, stored as i32 bits sign-extended.
        let u32s: Vec<i64> = [u32::MAX, 0, 1 << 31, 12, u32::MAX - 7]
            .iter()
            .map(|&v| i64::from(v as i32))
            .collect();
        round_trip(&u32s, Width::W32);
        round_trip(&[i64::from(i32::MIN), i64::from(i32::MAX)], Width::W32);
    }

    #[test]
    fn every_bit_width_packs_and_round_trips() {
        // Per width, miniblocks whose deltas span exactly `bits` bits above the minimum
        // delta (i64::MIN, so that 64 bits fit): one of 2^bits - 1 above it, one at it,
        // the rest between; in a block that also has a short last miniblock.
        for bits in 0..=64u32 {
            let top = if bits == 0 {
                0
            } else {
                u64::MAX >> (64 - bits)
            };
            let mut v = 0i64;
            let values: Vec<i64> = (0..150u64)
                .map(|i| {
                    let above = match i % 32 {
                        7 => top,
                        3 => 0,
                        _ => top / (i + 2),
                    };
                    v = v.wrapping_add(i64::MIN.wrapping_add(above as i64));
                    v
                })
                .collect();
            round_trip(&values, Width::W64);
            let mut out = Vec::new();
            encode(&values, Width::W64, &mut out);
            // The header's four ULEB128s, the block's min delta, then its widths.
            let mut at = 0;
            for _ in 0..4 {
                read_uleb128(&out, &mut at);
            }
            read_uleb128(&out, &mut at);
            assert_eq!(u32::from(out[at]), bits, "first miniblock's width");
        }
    }

    #[test]
    fn a_seeded_fuzz_of_lengths_and_ranges_round_trips() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..200 {
            let n = (next() % 700) as usize;
            let shift = next() % 64;
            let w64: Vec<i64> = (0..n).map(|_| (next() >> shift) as i64).collect();
            round_trip(&w64, Width::W64);
            let w32: Vec<i64> = (0..n)
                .map(|_| i64::from((next() >> (shift / 2 + 32)) as i32))
                .collect();
            round_trip(&w32, Width::W32);
        }
    }
}
