//! Flat Avro records of whole blocks -> column buffers, in one pass: `esa_avro_blocks`.
//!
//! `schemas/avro/decode.py` finds where the records of a group of blocks start with numpy
//! (candidates and pointer doubling) because Python cannot afford a walk record by record; here
//! the walk is the cheap way. Every field of every record is read in order, as the Avro 1.11
//! specification ("Binary Encoding") lays it out: an int, long or enum as a zig-zag varint of at
//! most 10 bytes, a float or double as 4 or 8 little-endian bytes, a string or bytes as a long
//! length and that many bytes, a `[null, T]` union as its branch (a long) and then T unless the
//! branch is null.
//!
//! The checks are those of the numpy decoder, so that either gives the same columns or refuses
//! the same bytes: each block holds exactly its stated count of records and ends where its last
//! record ends; a varint ends within 10 bytes and inside its block; an int fits 32 bits; an enum
//! index names a symbol; a union branch is one of the two; a length is not negative and stays
//! inside its block; a string is valid UTF-8 (each value on its own); a column of strings or
//! bytes holds under 2^31 bytes (Arrow's int32 offsets). Anything else gives `None`: the caller
//! then decodes the blocks the slow way, which names what is wrong.
//!
//! `decode_blocks(data, sizes, counts, fields)`: `data` is the blocks' bytes back to back,
//! `sizes[i]` the bytes and `counts[i]` the records of block i, and `fields` one
//! `(kind, value_branch, null_branch, symbols)` per field (kind 0 int, 1 long, 2 enum, 3 float,
//! 4 double, 5 string, 6 bytes; branches -1 outside a union). It returns one
//! `(values, offsets, present)` per field: `values` the int64 values (int, long, enum), the raw
//! little-endian floats, or the strings' bytes back to back; `offsets` the int32 Arrow offsets of
//! a string or bytes column (else None); `present` one byte per record, 1 where the value is not
//! null, or None when none is null. A null's value is 0 (or empty). The GIL is released while
//! the blocks are read.
//!
//! `encode_rows(rows, pieces)`: the other way, flat records from column buffers, for the writers
//! (`schemas/avro/encode.py`); `crc32c_many(data, offsets)`: the CRC32C of every string of a
//! binary column, for the check of each report's `payload_crc32c` (`schemas/avro/crc32c.py`).
//! Both are documented below.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

const MAX_VARINT_BYTES: usize = 10;
const INT: u8 = 0;
const LONG: u8 = 1;
const ENUM: u8 = 2;
const FLOAT: u8 = 3;
const DOUBLE: u8 = 4;
const STRING: u8 = 5;
const BYTES: u8 = 6;
/// Arrow's string and binary offsets are int32.
const MAX_COLUMN_BYTES: usize = (1 << 31) - 1;

/// One field's decoded values so far.
struct Column {
    kind: u8,
    value_branch: i64,
    null_branch: i64,
    symbols: i64,
    values: Vec<u8>,
    offsets: Vec<u8>,
    present: Vec<u8>,
    nulls: usize,
}

/// The varint at `*position` (before `end`), moving past it; None when it does not end within
/// 10 bytes or before `end`. Bits beyond 64 are dropped, as the numpy reader drops them.
#[inline(always)]
fn varint(data: &[u8], position: &mut usize, end: usize) -> Option<u64> {
    let mut value: u64 = 0;
    for index in 0..MAX_VARINT_BYTES {
        if *position >= end {
            return None;
        }
        let byte = data[*position];
        *position += 1;
        value |= u64::from(byte & 0x7F) << (7 * index);
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

#[inline(always)]
fn long(data: &[u8], position: &mut usize, end: usize) -> Option<i64> {
    varint(data, position, end).map(|zigzag| ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64))
}

impl Column {
    fn new(kind: u8, value_branch: i64, null_branch: i64, symbols: i64, rows: usize) -> Self {
        let width = match kind {
            FLOAT => 4,
            STRING | BYTES => 16,
            _ => 8,
        };
        let mut offsets = Vec::new();
        if kind == STRING || kind == BYTES {
            offsets.reserve(4 * (rows + 1));
            offsets.extend_from_slice(&0i32.to_le_bytes());
        }
        Column {
            kind,
            value_branch,
            null_branch,
            symbols,
            values: Vec::with_capacity(rows * width),
            offsets,
            present: Vec::with_capacity(if value_branch >= 0 { rows } else { 0 }),
            nulls: 0,
        }
    }

    /// The field of the record at `*position` (its block ends at `end`); false if it is not
    /// valid Avro of this field's type.
    #[inline]
    fn read(&mut self, data: &[u8], position: &mut usize, end: usize) -> bool {
        if self.value_branch >= 0 {
            let Some(branch) = long(data, position, end) else {
                return false;
            };
            if branch == self.null_branch {
                self.present.push(0);
                self.nulls += 1;
                self.push_null();
                return true;
            }
            if branch != self.value_branch {
                return false;
            }
            self.present.push(1);
        }
        match self.kind {
            INT | LONG | ENUM => {
                let Some(value) = long(data, position, end) else {
                    return false;
                };
                let valid = match self.kind {
                    INT => i32::try_from(value).is_ok(),
                    ENUM => value >= 0 && value < self.symbols,
                    _ => true,
                };
                if !valid {
                    return false;
                }
                self.values.extend_from_slice(&value.to_le_bytes());
            }
            FLOAT | DOUBLE => {
                let width = if self.kind == FLOAT { 4 } else { 8 };
                if end - *position < width {
                    return false;
                }
                self.values.extend_from_slice(&data[*position..*position + width]);
                *position += width;
            }
            _ => {
                let Some(length) = long(data, position, end) else {
                    return false;
                };
                if length < 0 || (end - *position) < length as usize {
                    return false;
                }
                let value = &data[*position..*position + length as usize];
                *position += length as usize;
                if self.kind == STRING && !value.is_ascii() && std::str::from_utf8(value).is_err()
                {
                    return false;
                }
                if self.values.len() + value.len() > MAX_COLUMN_BYTES {
                    return false;
                }
                self.values.extend_from_slice(value);
                self.offsets.extend_from_slice(&(self.values.len() as i32).to_le_bytes());
            }
        }
        true
    }

    fn push_null(&mut self) {
        match self.kind {
            FLOAT => self.values.extend_from_slice(&[0; 4]),
            STRING | BYTES => self.offsets.extend_from_slice(&(self.values.len() as i32).to_le_bytes()),
            _ => self.values.extend_from_slice(&[0; 8]),
        }
    }
}

/// Every record of every block into `columns`; false unless each block is exactly its count
/// of valid records and the blocks are exactly `data`.
fn read_blocks(data: &[u8], sizes: &[usize], counts: &[usize], columns: &mut [Column]) -> bool {
    let mut start = 0usize;
    for (&size, &count) in sizes.iter().zip(counts) {
        let Some(end) = start.checked_add(size).filter(|&end| end <= data.len()) else {
            return false;
        };
        let mut position = start;
        for _ in 0..count {
            for column in columns.iter_mut() {
                if !column.read(data, &mut position, end) {
                    return false;
                }
            }
        }
        if position != end {
            return false;
        }
        start = end;
    }
    start == data.len()
}

type Decoded<'py> = (Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>, Option<Bound<'py, PyBytes>>);

/// See the module's documentation.
#[pyfunction]
fn decode_blocks<'py>(
    py: Python<'py>,
    data: &[u8],
    sizes: Vec<usize>,
    counts: Vec<usize>,
    fields: Vec<(u8, i64, i64, i64)>,
) -> PyResult<Option<Vec<Decoded<'py>>>> {
    if sizes.len() != counts.len() || fields.iter().any(|field| field.0 > BYTES) {
        return Ok(None);
    }
    // Each record takes at least a byte per field: a count beyond that must not size anything.
    let mut rows = 0usize;
    for (&size, &count) in sizes.iter().zip(&counts) {
        if count.saturating_mul(fields.len().max(1)) > size {
            return Ok(None);
        }
        rows += count;
    }
    let mut columns: Vec<Column> = fields
        .iter()
        .map(|&(kind, value_branch, null_branch, symbols)| {
            Column::new(kind, value_branch, null_branch, symbols, rows)
        })
        .collect();
    if !py.detach(|| read_blocks(data, &sizes, &counts, &mut columns)) {
        return Ok(None);
    }
    Ok(Some(
        columns
            .iter()
            .map(|column| {
                let offsets = (column.kind == STRING || column.kind == BYTES)
                    .then(|| PyBytes::new(py, &column.offsets));
                let present = (column.nulls > 0).then(|| PyBytes::new(py, &column.present));
                (PyBytes::new(py, &column.values), offsets, present)
            })
            .collect(),
    ))
}

/// `crc32c_many(data, offsets)`: the CRC32C (Castagnoli, RFC 3720) of each string
/// `data[offsets[i]..offsets[i + 1]]`, as little-endian u32 values back to back; `offsets` is
/// little-endian int64 values back to back (one more than the strings), as an Arrow binary
/// column's (widened) or a payload batch's. `None` when the offsets are not that, decrease or
/// leave `data`. The `crc32c` crate computes each CRC (SSE 4.2's or ARMv8's CRC32C instruction
/// where the processor has it, found at run time; tables otherwise). The GIL is released while
/// they are computed.
#[pyfunction]
fn crc32c_many<'py>(
    py: Python<'py>,
    data: &[u8],
    offsets: &[u8],
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(bounds) = int64s(offsets)
        .filter(|bounds| !bounds.is_empty() && valid_offsets(bounds, bounds.len() - 1, data))
    else {
        return Ok(None);
    };
    let values = py.detach(|| {
        let mut out = Vec::with_capacity(4 * (bounds.len() - 1));
        for pair in bounds.windows(2) {
            let crc = crc32c::crc32c(&data[pair[0] as usize..pair[1] as usize]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    });
    Ok(Some(PyBytes::new(py, &values)))
}

/// One field (or run of fields) of every row for `encode_rows`.
enum Piece<'a> {
    /// The same bytes in every row (constant fields, already encoded).
    Constant(&'a [u8]),
    /// An int or long per row: its zig-zag varint.
    Long(Vec<i64>),
    /// A string or bytes value per row: its length (a long), then its bytes.
    Binary(&'a [u8], Vec<i64>),
    /// Bytes already encoded, entry `index[row]` of a list (or entry `row` without an index).
    Pick(&'a [u8], Vec<i64>, Option<Vec<i64>>),
}

fn int64s(bytes: &[u8]) -> Option<Vec<i64>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|chunk| i64::from_le_bytes(chunk.try_into().unwrap()))
            .collect(),
    )
}

/// Offsets that start at 0 or more, never decrease and end inside `data`, `count + 1` of them.
fn valid_offsets(offsets: &[i64], count: usize, data: &[u8]) -> bool {
    offsets.len() == count + 1
        && offsets[0] >= 0
        && offsets.windows(2).all(|pair| pair[0] <= pair[1])
        && (offsets[count] as u64) <= data.len() as u64
}

#[inline(always)]
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[inline(always)]
fn varint_length(value: i64) -> usize {
    let bits = 64 - (zigzag(value) | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Writes the zig-zag varint of `value` at `out[*at..]`, moving past it.
#[inline(always)]
fn put_long(out: &mut [u8], at: &mut usize, value: i64) {
    let mut rest = zigzag(value);
    while rest >= 0x80 {
        out[*at] = (rest as u8) | 0x80;
        *at += 1;
        rest >>= 7;
    }
    out[*at] = rest as u8;
    *at += 1;
}

#[inline(always)]
fn put_bytes(out: &mut [u8], at: &mut usize, bytes: &[u8]) {
    out[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

fn picked(offsets: &[i64], index: &Option<Vec<i64>>, row: usize) -> std::ops::Range<usize> {
    let entry = index.as_ref().map_or(row, |index| index[row] as usize);
    offsets[entry] as usize..offsets[entry + 1] as usize
}

/// The bytes every row takes: the first pass, so that the second writes into one buffer of the
/// exact size (no growing, each page of it touched once).
fn encoded_size(rows: usize, pieces: &[Piece]) -> usize {
    let mut total = 0usize;
    for piece in pieces {
        total += match piece {
            Piece::Constant(bytes) => bytes.len() * rows,
            Piece::Long(values) => values.iter().map(|&value| varint_length(value)).sum(),
            Piece::Binary(_, offsets) => offsets
                .windows(2)
                .map(|pair| {
                    let length = (pair[1] - pair[0]) as usize;
                    varint_length(length as i64) + length
                })
                .sum(),
            Piece::Pick(_, offsets, index) => {
                (0..rows).map(|row| picked(offsets, index, row).len()).sum()
            }
        };
    }
    total
}

fn join_rows(rows: usize, pieces: &[Piece], out: &mut [u8], row_offsets: &mut [u8]) {
    let mut at = 0usize;
    row_offsets[..8].copy_from_slice(&0i64.to_le_bytes());
    for row in 0..rows {
        for piece in pieces {
            match piece {
                Piece::Constant(bytes) => put_bytes(out, &mut at, bytes),
                Piece::Long(values) => put_long(out, &mut at, values[row]),
                Piece::Binary(data, offsets) => {
                    let (begin, end) = (offsets[row] as usize, offsets[row + 1] as usize);
                    put_long(out, &mut at, (end - begin) as i64);
                    put_bytes(out, &mut at, &data[begin..end]);
                }
                Piece::Pick(data, offsets, index) => {
                    put_bytes(out, &mut at, &data[picked(offsets, index, row)])
                }
            }
        }
        row_offsets[8 * (row + 1)..8 * (row + 2)].copy_from_slice(&(at as i64).to_le_bytes());
    }
}

type PieceArgument<'py> = (
    u8,
    Bound<'py, PyBytes>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
);

/// `encode_rows(rows, pieces)`: the Avro binary of `rows` records whose encoding is the
/// `pieces` one after another in every row, as `(bytes, row offsets)` (the row offsets
/// little-endian int64, `rows + 1` of them). A piece is `(kind, a, b, c)`: kind 0, the bytes `a`
/// in every row (constant fields, already encoded); 1, a long per row (`a`: little-endian int64
/// values), written as a zig-zag varint (Avro's int and long, an enum's index); 2, a string or
/// bytes per row (`a` the values back to back, `b` their little-endian int64 offsets), written
/// as its length and its bytes; 3, already encoded bytes per row, entry `c[row]` (or entry `row`
/// when `c` is None) of the list `a` with offsets `b`. `None` when a piece is not that (a count
/// other than `rows`, offsets that decrease or leave their data, an index out of its list):
/// the caller then encodes the slow way. The GIL is released while the rows are written.
#[pyfunction]
fn encode_rows<'py>(
    py: Python<'py>,
    rows: usize,
    pieces: Vec<PieceArgument<'py>>,
) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
    let mut parsed: Vec<Piece> = Vec::with_capacity(pieces.len());
    for (kind, a, b, c) in &pieces {
        let a = a.as_bytes();
        let piece = match kind {
            0 => Some(Piece::Constant(a)),
            1 => int64s(a)
                .filter(|values| values.len() == rows)
                .map(Piece::Long),
            2 => b
                .as_ref()
                .and_then(|b| int64s(b.as_bytes()))
                .filter(|offsets| valid_offsets(offsets, rows, a))
                .map(|offsets| Piece::Binary(a, offsets)),
            3 => {
                let offsets = b.as_ref().and_then(|b| int64s(b.as_bytes()));
                let entries = offsets
                    .as_ref()
                    .map_or(0, |offsets| offsets.len().saturating_sub(1));
                let offsets = offsets.filter(|offsets| valid_offsets(offsets, entries, a));
                match (offsets, c) {
                    (Some(offsets), None) if entries == rows => Some(Piece::Pick(a, offsets, None)),
                    (Some(offsets), Some(c)) => int64s(c.as_bytes())
                        .filter(|index| {
                            index.len() == rows
                                && index
                                    .iter()
                                    .all(|&entry| entry >= 0 && (entry as usize) < entries)
                        })
                        .map(|index| Piece::Pick(a, offsets, Some(index))),
                    _ => None,
                }
            }
            _ => None,
        };
        match piece {
            Some(piece) => parsed.push(piece),
            None => return Ok(None),
        }
    }
    let size = py.detach(|| encoded_size(rows, &parsed));
    let mut row_offsets = vec![0u8; 8 * (rows + 1)];
    let data = PyBytes::new_with(py, size, |out| {
        py.detach(|| join_rows(rows, &parsed, out, &mut row_offsets));
        Ok(())
    })?;
    Ok(Some((data, PyBytes::new(py, &row_offsets))))
}

#[pymodule]
fn esa_avro_blocks(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(decode_blocks, module)?)?;
    module.add_function(wrap_pyfunction!(crc32c_many, module)?)?;
    module.add_function(wrap_pyfunction!(encode_rows, module)?)?;
    Ok(())
}
