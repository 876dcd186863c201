//! Case parameters as data: the serde forms the descriptions of case
//! families share (a quantization spec as its case-name spelling,
//! `affine-4b-gs64`; dtypes as `mlx.core` names). A description is what
//! the explorer samples, shrinks and keeps (`fixtures/explore/kept.json`),
//! and what builds the registry's fixed cases.

use layers::quantized::{Mode, QuantSpec};

/// `QuantSpec` as its case-name spelling (`affine-4b-gs64`, `nvfp4-4b-gs16`).
pub mod spec {
    use super::*;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(spec: &QuantSpec, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(spec)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QuantSpec, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// `<mode>-<bits>b-gs<group_size>`, validated as `mx.quantize` would.
    pub fn parse(text: &str) -> Result<QuantSpec, String> {
        let bad = || format!("`{text}` is not a spec like `affine-4b-gs64`");
        let mut parts = text.splitn(3, '-');
        let mode: Mode = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let bits = parts
            .next()
            .and_then(|b| b.strip_suffix('b'))
            .and_then(|b| b.parse().ok())
            .ok_or_else(bad)?;
        let group_size = parts
            .next()
            .and_then(|g| g.strip_prefix("gs"))
            .and_then(|g| g.parse().ok())
            .ok_or_else(bad)?;
        QuantSpec::new(mode, bits, group_size).map_err(|e| format!("`{text}`: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_round_trips_through_its_name() {
        for bits in [2, 3, 4, 5, 6, 8] {
            for group_size in [32, 64, 128] {
                let s = QuantSpec::new(Mode::Affine, bits, group_size).unwrap();
                assert_eq!(spec::parse(&s.to_string()).unwrap(), s);
            }
        }
        for mode in [Mode::Mxfp4, Mode::Mxfp8, Mode::Nvfp4] {
            let s = QuantSpec::defaults(mode);
            assert_eq!(spec::parse(&s.to_string()).unwrap(), s);
        }
        for bad in [
            "",
            "affine",
            "affine-4b",
            "affine-4-gs64",
            "affine-7b-gs64",
            "int4-4b-gs64",
        ] {
            assert!(spec::parse(bad).is_err(), "{bad}");
        }
    }
}
