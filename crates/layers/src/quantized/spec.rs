//! The quantization spec `(mode, bits, group_size)`.

use std::fmt;

use crate::ffi::Mode;

use super::SpecError;

/// How a matrix is quantized: `mode`, `bits` per element and `group_size`
/// elements sharing one scale (and, for affine, one bias).
///
/// The fields are public so a caller can describe any spec, even one the
/// reference rejects; [`QuantSpec::validate`] (run by every constructor that
/// takes a spec) checks it against the combinations `mlx.core.quantize`
/// accepts in mlx 0.32.2:
///
/// | mode   | bits             | group_size   |
/// |--------|------------------|--------------|
/// | affine | 2, 3, 4, 5, 6, 8 | 32, 64, 128  |
/// | mxfp4  | 4                | 32           |
/// | mxfp8  | 8                | 32           |
/// | nvfp4  | 4                | 16           |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// The quantization mode.
    pub mode: Mode,
    /// Bits per quantized element.
    pub bits: i32,
    /// Elements per scale (and bias).
    pub group_size: i32,
}

impl QuantSpec {
    /// A validated spec.
    ///
    /// # Errors
    /// [`SpecError`] when the reference rejects the combination.
    pub fn new(mode: Mode, bits: i32, group_size: i32) -> Result<Self, SpecError> {
        let spec = QuantSpec {
            mode,
            bits,
            group_size,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The mode's default `group_size` and `bits`, as
    /// `mlx.nn.layers.quantized._defaults_for_mode` picks them when both are
    /// `None` (always valid).
    pub const fn defaults(mode: Mode) -> Self {
        let (group_size, bits) = mode.defaults();
        QuantSpec {
            mode,
            bits,
            group_size,
        }
    }

    /// Checks the combination as `mlx.core.quantize` does (mlx 0.32.2):
    /// group size first, then bits.
    ///
    /// # Errors
    /// [`SpecError::UnsupportedGroupSize`] or [`SpecError::UnsupportedBits`],
    /// with the reference's message.
    pub fn validate(&self) -> Result<(), SpecError> {
        let (group_ok, bits_ok) = match self.mode {
            Mode::Affine => (
                matches!(self.group_size, 32 | 64 | 128),
                matches!(self.bits, 2 | 3 | 4 | 5 | 6 | 8),
            ),
            mode => {
                let (group_size, bits) = mode.defaults();
                (self.group_size == group_size, self.bits == bits)
            }
        };
        if !group_ok {
            return Err(SpecError::UnsupportedGroupSize {
                mode: self.mode,
                group_size: self.group_size,
            });
        }
        if !bits_ok {
            return Err(SpecError::UnsupportedBits {
                mode: self.mode,
                bits: self.bits,
            });
        }
        Ok(())
    }
}

impl fmt::Display for QuantSpec {
    /// `affine-4b-gs64`, the spelling case names use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}b-gs{}", self.mode, self.bits, self.group_size)
    }
}
