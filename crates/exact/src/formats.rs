//! Quantized formats decoded exactly as each defines them, and the
//! dequantized matrix in float64.
//!
//! - affine (`bits` 2, 3, 4, 5, 6, 8): `w = scale * q + bias`, `q` unsigned,
//!   packed little-endian: element `k` of a row at bit `k * bits` of the
//!   row's bytes (uint32 words for 2, 4, 8; byte triples / quintuples for
//!   3, 5, 6, as MLX's `extract_bits` reads them);
//! - mxfp4: e2m1 codes (4 bits, low nibble first) times an e8m0 scale
//!   `2^(s - 127)` per group of 32;
//! - nvfp4: e2m1 codes times an e4m3 scale per group of 16 (the global
//!   scale, which the pinned `quantized_matmul` refuses, is not applied);
//! - mxfp8: e4m3 codes (one byte) times an e8m0 scale per group of 32.
//!
//! MLX reads e8m0 code 0 as 2^-127 (its `dequantize_scale` builds the
//! bfloat16 bit pattern 0x0040) and e8m0 255 as infinity; both follow
//! from the definition `2^(s - 127)` except 255, which OCP defines as NaN.

use crate::{err, ExactError, Float};

/// The quantization mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Affine,
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl Format {
    /// From MLX's mode name.
    pub fn from_name(mode: &str) -> Result<Self, ExactError> {
        Ok(match mode {
            "affine" => Format::Affine,
            "mxfp4" => Format::Mxfp4,
            "nvfp4" => Format::Nvfp4,
            "mxfp8" => Format::Mxfp8,
            other => return err(format!("unknown quantization mode `{other}`")),
        })
    }
}

/// e2m1 (fp4): sign, 2 exponent bits (bias 1), 1 mantissa bit.
pub fn e2m1(code: u8) -> f64 {
    let sign = if code & 0x8 != 0 { -1.0 } else { 1.0 };
    let exp = (code >> 1) & 0x3;
    let man = f64::from(code & 0x1);
    sign * if exp == 0 {
        man * 0.5
    } else {
        (1.0 + man / 2.0) * 2f64.powi(i32::from(exp) - 1)
    }
}

/// e4m3 (OCP "fn": no infinities; 0x7f / 0xff are NaN): sign, 4 exponent
/// bits (bias 7), 3 mantissa bits.
pub fn e4m3(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = (code >> 3) & 0xf;
    let man = f64::from(code & 0x7);
    if exp == 0xf && code & 0x7 == 0x7 {
        return f64::NAN;
    }
    sign * if exp == 0 {
        man / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f64.powi(i32::from(exp) - 7)
    }
}

/// e8m0: `2^(code - 127)`; code 255 is infinity as MLX reads it.
pub fn e8m0(code: u8) -> f64 {
    if code == 255 {
        f64::INFINITY
    } else {
        2f64.powi(i32::from(code) - 127)
    }
}

/// `v` rounded to nearest even in `f` (the exact value a kernel would hold).
#[inline]
pub fn round_to(v: f64, f: Float) -> f64 {
    match f {
        Float::Bfloat16 => f64::from(half::bf16::from_f64(v)),
        Float::Float16 => f64::from(half::f16::from_f64(v)),
        Float::Float32 => f64::from(v as f32),
    }
}

/// A quantized weight matrix `[rows, cols]` as MLX stores it.
#[derive(Debug, Clone)]
pub struct QuantizedMatrix<'a> {
    pub format: Format,
    pub bits: usize,
    pub group_size: usize,
    pub rows: usize,
    /// Unpacked columns (the layer's input features).
    pub cols: usize,
    /// The packed codes, row-major (the uint32 tensor's bytes).
    pub packed: &'a [u8],
    /// Affine: the scales as values (any float dtype, exactly); fp modes:
    /// unused (see `scale_codes`).
    pub scales: &'a [f64],
    /// fp modes: the uint8 scale codes.
    pub scale_codes: &'a [u8],
    /// Affine only.
    pub biases: &'a [f64],
}

/// One row of codes and per-group scale and bias, exactly.
pub struct DequantizedRow {
    /// The code's value before the scale (`q` for affine, the e2m1 / e4m3
    /// value for fp modes), per column.
    pub code: Vec<f64>,
    /// Per group: scale and bias (bias 0 for fp modes).
    pub scale: Vec<f64>,
    pub bias: Vec<f64>,
}

impl QuantizedMatrix<'_> {
    /// Checks the sizes against the format; the error names what is off.
    pub fn validate(&self) -> Result<(), ExactError> {
        let bits_ok = match self.format {
            Format::Affine => matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8),
            Format::Mxfp4 | Format::Nvfp4 => self.bits == 4,
            Format::Mxfp8 => self.bits == 8,
        };
        if !bits_ok {
            return err(format!("{:?} with {} bits", self.format, self.bits));
        }
        if self.group_size == 0 || !self.cols.is_multiple_of(self.group_size) {
            return err(format!(
                "{} columns are not a whole number of groups of {}",
                self.cols, self.group_size
            ));
        }
        let row_bits = self.cols * self.bits;
        if !row_bits.is_multiple_of(32) || self.packed.len() != self.rows * row_bits / 8 {
            return err(format!(
                "packed weight holds {} bytes, [{}, {}] at {} bits needs {}",
                self.packed.len(),
                self.rows,
                self.cols,
                self.bits,
                self.rows * row_bits / 8
            ));
        }
        let groups = self.rows * self.cols / self.group_size;
        let (scales, biases) = match self.format {
            Format::Affine => (self.scales.len(), self.biases.len()),
            _ => (self.scale_codes.len(), groups),
        };
        if scales != groups || biases != groups {
            return err(format!(
                "{groups} groups, but {scales} scales and {biases} biases"
            ));
        }
        Ok(())
    }

    /// Row `r`'s codes (as values) and group scales, exactly.
    pub fn row(&self, r: usize) -> DequantizedRow {
        let row_bytes = self.cols * self.bits / 8;
        let bytes = &self.packed[r * row_bytes..(r + 1) * row_bytes];
        let code: Vec<f64> = (0..self.cols)
            .map(|k| {
                let raw = read_bits(bytes, k * self.bits, self.bits);
                match self.format {
                    Format::Affine => f64::from(raw),
                    Format::Mxfp4 | Format::Nvfp4 => e2m1(raw as u8),
                    Format::Mxfp8 => e4m3(raw as u8),
                }
            })
            .collect();
        let groups = self.cols / self.group_size;
        let g0 = r * groups;
        let (scale, bias) = match self.format {
            Format::Affine => (
                self.scales[g0..g0 + groups].to_vec(),
                self.biases[g0..g0 + groups].to_vec(),
            ),
            Format::Nvfp4 => (
                self.scale_codes[g0..g0 + groups]
                    .iter()
                    .map(|&c| e4m3(c))
                    .collect(),
                vec![0.0; groups],
            ),
            Format::Mxfp4 | Format::Mxfp8 => (
                self.scale_codes[g0..g0 + groups]
                    .iter()
                    .map(|&c| e8m0(c))
                    .collect(),
                vec![0.0; groups],
            ),
        };
        DequantizedRow { code, scale, bias }
    }
}

/// `bits` bits at bit offset `at` of a little-endian bit stream.
fn read_bits(bytes: &[u8], at: usize, bits: usize) -> u32 {
    debug_assert!(bits <= 25);
    // The (at most 4) bytes holding the field, little-endian, then one shift
    // (bit by bit, this was the exact oracle's hottest loop).
    let (first, shift) = (at / 8, at % 8);
    let last = (at + bits).div_ceil(8);
    let mut window = 0u32;
    for (i, &b) in bytes[first..last].iter().enumerate() {
        window |= u32::from(b) << (8 * i);
    }
    (window >> shift) & ((1u32 << bits) - 1)
}

/// The dequantized matrix `[rows, cols]` in float64, exactly
/// (`scale * code + bias`).
pub fn dequantize(m: &QuantizedMatrix) -> Result<Vec<f64>, ExactError> {
    m.validate()?;
    let mut out = Vec::with_capacity(m.rows * m.cols);
    for r in 0..m.rows {
        let row = m.row(r);
        for (k, c) in row.code.iter().enumerate() {
            let g = k / m.group_size;
            out.push(row.scale[g] * c + row.bias[g]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp_codes_decode_as_their_formats_define() {
        let lut = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (c, v) in lut.iter().enumerate() {
            assert_eq!(e2m1(c as u8), *v);
            assert_eq!(e2m1(c as u8 | 8), -*v);
        }
        assert_eq!(e4m3(0x38), 1.0);
        assert_eq!(e4m3(0x7e), 448.0);
        assert_eq!(e4m3(0x01), 2f64.powi(-9));
        assert!(e4m3(0x7f).is_nan());
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(0), 2f64.powi(-127));
    }

    #[test]
    fn read_bits_equals_reading_bit_by_bit() {
        let bytes: Vec<u8> = (0..64u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for bits in 1..=8 {
            for at in 0..(bytes.len() * 8 - bits) {
                let slow = (0..bits).fold(0u32, |v, i| {
                    let bit = at + i;
                    v | (u32::from(bytes[bit / 8] >> (bit % 8) & 1) << i)
                });
                assert_eq!(read_bits(&bytes, at, bits), slow, "bits {bits} at {at}");
            }
        }
    }

    #[test]
    fn three_bit_codes_cross_byte_boundaries_as_mlx_extracts_them() {
        // Codes 0..8 at 3 bits, packed little-endian: 24 bits = 3 bytes.
        let mut stream = 0u32;
        for k in 0..8u32 {
            stream |= k << (3 * k);
        }
        let b = stream.to_le_bytes();
        for k in 0..8 {
            assert_eq!(read_bits(&b[..3], k * 3, 3), k as u32);
        }
    }
}
