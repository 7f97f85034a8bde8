//! Parquet's RLE / bit-packing hybrid encoding, for the dictionary indices
//! ([`crate::dict_column`]) and the repetition and definition levels of the columns the
//! writer encodes itself.
//!
//! The format (Parquet `Encodings.md`): a sequence of runs, each a ULEB128 header whose
//! low bit says which kind it is. An *RLE run* (`len << 1`) is followed by the value in
//! `ceil(bit_width / 8)` little-endian bytes; a *bit-packed run* (`groups << 1 | 1`) by
//! `groups × 8` values packed LSB-first, `bit_width` bytes per group. Only the last run
//! may end in padding (the reader knows how many values to take).
//!
//! Telemetry rows are sorted by GPU then time, so identity strings come in runs as long
//! as a GPU's share of a row group: the encoder looks for runs first and spends work per
//! run, not per value. Runs shorter than 8 go into bit-packed groups; when a long run
//! follows literals that do not fill a group, the group is completed from the run,
//! since a bit-packed run in the middle of the data must hold whole groups.

/// Runs shorter than this are never written as an RLE run (a bit-packed run in the
/// middle of the data holds whole groups of 8).
const MIN_RLE_RUN: usize = 8;

/// The shortest run written as an RLE run at `bit_width`: a group, and long enough that
/// its header and value (about 2 bytes, plus the header of the bit-packed run it
/// interrupts) cost less than packing it. At 1 bit that is 32 values: a list's
/// repetition levels (a 0, then a 1 per further item) stay bit-packed, 12 bits for 12
/// items, where RLE runs of 11 would take 32.
fn min_rle_run(bit_width: u8) -> usize {
    MIN_RLE_RUN.max(32usize.div_ceil(usize::from(bit_width.max(1))))
}
/// Groups per bit-packed run header; parquet-rs and Arrow C++ write at most 63 (so the
/// header stays one byte), and so do we.
const MAX_GROUPS_PER_RUN: usize = 63;

/// Bits needed for values `0..=max`.
pub(crate) fn bit_width(max: u32) -> u8 {
    (32 - max.leading_zeros()) as u8
}

/// Appends the RLE / bit-packed encoding of `values` (each below `2^bit_width`) to `out`,
/// calling `on_run(value, len)` for every maximal run of equal values (in order), so the
/// caller can gather statistics per run instead of per value.
pub(crate) fn encode<T>(
    values: &[T],
    bit_width: u8,
    out: &mut Vec<u8>,
    mut on_run: impl FnMut(T, usize),
) where
    T: Copy + PartialEq + Into<u32>,
{
    debug_assert!(bit_width <= 32);
    let min_run = min_rle_run(bit_width);
    let mut literal_start = 0;
    let mut i = 0;
    while i < values.len() {
        let value = values[i];
        let mut end = i + 1;
        while end < values.len() && values[end] == value {
            end += 1;
        }
        let run = end - i;
        on_run(value, run);
        if run >= min_run {
            // Complete the pending literals' last group from the run (at most 7 < run).
            let pending = i - literal_start;
            let borrowed = (MIN_RLE_RUN - pending % MIN_RLE_RUN) % MIN_RLE_RUN;
            if pending > 0 {
                write_bit_packed(&values[literal_start..i + borrowed], bit_width, out);
            }
            let rest = run - if pending > 0 { borrowed } else { 0 };
            if rest > 0 {
                write_rle(value.into(), rest, bit_width, out);
            }
            literal_start = end;
        }
        i = end;
    }
    if literal_start < values.len() {
        write_bit_packed(&values[literal_start..], bit_width, out);
    }
}

pub(crate) fn write_uleb128(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends one RLE run: `len` copies of `value` (`len` ≥ 1).
pub(crate) fn write_rle(value: u32, len: usize, bit_width: u8, out: &mut Vec<u8>) {
    write_uleb128((len as u64) << 1, out);
    let bytes = usize::from(bit_width).div_ceil(8);
    out.extend_from_slice(&value.to_le_bytes()[..bytes]);
}

/// Appends the repetition levels of `lists` lists of `len` items each (`len` ≥ 1): a 0,
/// then `len - 1` ones, per list. Written from the pattern's bits, a byte per 8 levels,
/// rather than level by level: the per-link counters are a dozen items in every row.
pub(crate) fn write_uniform_repetition(len: usize, lists: usize, out: &mut Vec<u8>) {
    let n = len * lists;
    if n == 0 {
        return;
    }
    if len == 1 {
        return write_rle(0, n, 1, out);
    }
    let mut bits = vec![0xFFu8; n.div_ceil(8)];
    for start in (0..n).step_by(len) {
        bits[start / 8] &= !(1 << (start % 8));
    }
    // Zero the last group's padding.
    if !n.is_multiple_of(8) {
        *bits.last_mut().expect("n > 0") &= (1u8 << (n % 8)) - 1;
    }
    for run in bits.chunks(MAX_GROUPS_PER_RUN) {
        write_uleb128(((run.len() as u64) << 1) | 1, out);
        out.extend_from_slice(run);
    }
}

/// Bit-packs `values` in runs of at most [`MAX_GROUPS_PER_RUN`] groups; the last group is
/// padded with zeros (callers pass whole groups except at the very end of the data).
fn write_bit_packed<T: Copy + Into<u32>>(values: &[T], bit_width: u8, out: &mut Vec<u8>) {
    for chunk in values.chunks(MAX_GROUPS_PER_RUN * 8) {
        let groups = chunk.len().div_ceil(8);
        write_uleb128(((groups as u64) << 1) | 1, out);
        let start = out.len();
        out.resize(start + groups * usize::from(bit_width), 0);
        if bit_width == 0 {
            continue;
        }
        let packed = &mut out[start..];
        let mut acc: u64 = 0;
        let mut bits = 0u32;
        let mut at = 0;
        for &v in chunk {
            acc |= u64::from(v.into()) << bits;
            bits += u32::from(bit_width);
            while bits >= 8 {
                packed[at] = acc as u8;
                at += 1;
                acc >>= 8;
                bits -= 8;
            }
        }
        if bits > 0 {
            packed[at] = acc as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{read_uleb128, xorshift};

    /// A reference decoder written from the format description, independent of the
    /// encoder's run choices.
    fn decode(mut data: &[u8], bit_width: u8, n: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let value_bytes = usize::from(bit_width).div_ceil(8);
        while out.len() < n {
            let mut at = 0;
            let header = read_uleb128(data, &mut at);
            data = &data[at..];
            if header & 1 == 0 {
                let len = (header >> 1) as usize;
                let mut v = [0u8; 4];
                v[..value_bytes].copy_from_slice(&data[..value_bytes]);
                data = &data[value_bytes..];
                out.extend(std::iter::repeat_n(u32::from_le_bytes(v), len));
            } else {
                let count = (header >> 1) as usize * 8;
                let bytes = count * usize::from(bit_width) / 8;
                let (packed, rest) = data.split_at(bytes);
                data = rest;
                for k in 0..count {
                    let mut v = 0u32;
                    for b in 0..usize::from(bit_width) {
                        let bit = k * usize::from(bit_width) + b;
                        v |= u32::from((packed[bit / 8] >> (bit % 8)) & 1) << b;
                    }
                    out.push(v);
                }
            }
        }
        assert!(data.is_empty(), "trailing bytes after {n} values");
        out.truncate(n);
        out
    }

    fn round_trip(values: &[u32]) -> Vec<u8> {
        let bw = bit_width(values.iter().copied().max().unwrap_or(0));
        let mut out = Vec::new();
        let mut runs = Vec::new();
        encode(values, bw, &mut out, |v, len| runs.push((v, len)));
        assert_eq!(decode(&out, bw, values.len()), values, "bit width {bw}");
        let expanded: Vec<u32> = runs
            .iter()
            .flat_map(|&(v, len)| std::iter::repeat_n(v, len))
            .collect();
        assert_eq!(expanded, values, "runs reported");
        assert!(
            runs.windows(2).all(|w| w[0].0 != w[1].0),
            "runs are maximal"
        );
        out
    }

    #[test]
    fn bit_width_counts_the_bits_of_the_largest_value() {
        assert_eq!(bit_width(0), 0);
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(255), 8);
        assert_eq!(bit_width(256), 9);
        assert_eq!(bit_width(u32::MAX), 32);
    }

    #[test]
    fn long_runs_are_rle_runs_of_a_few_bytes() {
        let values: Vec<u32> = [3u32, 5, 3, 0]
            .iter()
            .flat_map(|&v| std::iter::repeat_n(v, 5000))
            .collect();
        let out = round_trip(&values);
        assert_eq!(
            out.len(),
            4 * (2 + 1),
            "4 runs: 2-byte header + 1 value byte"
        );
    }

    #[test]
    fn literals_short_runs_and_their_mix_decode_to_the_input() {
        round_trip(&[]);
        round_trip(&[0]);
        round_trip(&[7; 3]);
        round_trip(&(0..1000).map(|i| (i * 7919) % 1021).collect::<Vec<_>>());
        // Literals that do not fill a group, then a long run; and a long run right after
        // a full group.
        let mut mixed = vec![1, 2, 3];
        mixed.extend([9; 20]);
        mixed.extend((0..8).map(|i| i % 3));
        mixed.extend([4; 8]);
        mixed.extend([5, 5, 6]);
        round_trip(&mixed);
        // More literals than one run header holds.
        round_trip(&(0..2000u32).map(|i| i % 2).collect::<Vec<_>>());
        // Full 32-bit values and a zero bit width (one distinct value, 0).
        round_trip(&[u32::MAX, 0, u32::MAX, 1, 2, 3, 4, 5, 6, 7, 8]);
        round_trip(&[0; 100]);
    }

    #[test]
    fn a_seeded_fuzz_of_run_lengths_and_widths_round_trips() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for _ in 0..300 {
            // A third at 1 or 2 bits, where runs up to 32 or 16 stay bit-packed.
            let max = if next().is_multiple_of(3) {
                (next() % 4) as u32
            } else {
                (next() % 70_000) as u32
            };
            let mut values = Vec::new();
            while values.len() < 3000 {
                let v = (next() % u64::from(max + 1)) as u32;
                let len = 1 + (next() % if next().is_multiple_of(2) { 4 } else { 40 }) as usize;
                values.extend(std::iter::repeat_n(v, len));
            }
            round_trip(&values);
        }
    }

    #[test]
    fn list_repetition_levels_stay_bit_packed() {
        // 100 lists of 12 items: a 0, then eleven 1s, each time.
        let levels: Vec<u32> = (0..1200).map(|i| u32::from(i % 12 != 0)).collect();
        let out = round_trip(&levels);
        // 1200 bits packed, plus a header per 504 values.
        assert_eq!(out.len(), 150 + 3, "{out:?}");
        // Runs of 32 and more at 1 bit are worth an RLE run.
        let mut long = vec![0u32; 5];
        long.extend([1; 40]);
        long.extend([0; 3]);
        assert!(round_trip(&long).len() < 8, "{:?}", round_trip(&long));
    }

    #[test]
    fn uniform_repetition_levels_decode_to_the_pattern() {
        for (len, lists) in [
            (12, 100),
            (1, 77),
            (2, 5),
            (18, 333),
            (7, 1),
            (40, 13),
            (3, 0),
        ] {
            let mut out = Vec::new();
            write_uniform_repetition(len, lists, &mut out);
            let expected: Vec<u32> = (0..len * lists).map(|i| u32::from(i % len != 0)).collect();
            assert_eq!(decode(&out, 1, expected.len()), expected, "{len} × {lists}");
        }
    }

    #[test]
    fn boolean_levels_encode_with_one_bit() {
        let levels: Vec<u8> = (0..100).map(|i| u8::from(i % 3 != 0)).collect();
        let mut out = Vec::new();
        encode(&levels, 1, &mut out, |_, _| {});
        let decoded = decode(&out, 1, levels.len());
        assert_eq!(
            decoded,
            levels.iter().map(|&l| u32::from(l)).collect::<Vec<_>>()
        );
    }
}
