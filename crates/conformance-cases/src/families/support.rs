//! Helpers every family shares: results to the host, the port's errors,
//! small tensors built on the host.

use mlx_rs::Array;
use oracle::{DType, HostTensor};

use crate::case::CaseError;

/// A port (`layers`) error as a case error.
pub(crate) fn port(e: impl std::fmt::Display) -> CaseError {
    CaseError::Port(e.to_string())
}

/// Copies an mlx-rs array to the host.
pub(crate) fn host(a: &Array) -> Result<HostTensor, CaseError> {
    Ok(HostTensor::from_array(a)?)
}

/// The short name of a dtype in case names (`bf16`, `f16`, `f32`).
pub(crate) fn dtype_tag(dtype: DType) -> &'static str {
    dtype.tag()
}

/// An int32 tensor of `values` with `shape` (sized by the caller).
pub(crate) fn int32_tensor(values: &[i32], shape: &[usize]) -> HostTensor {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostTensor::new(DType::Int32, shape.to_vec(), bytes).expect("sized by the caller")
}

/// UTF-8 bytes of `text` as a uint8 tensor, so a string comparison reports
/// the first differing byte and feeds the digest.
pub(crate) fn bytes_tensor(text: &str) -> HostTensor {
    HostTensor::new(DType::Uint8, vec![text.len()], text.as_bytes().to_vec())
        .expect("one byte each")
}

/// The port's side of a refusal case: `(1, message)` when `result` is the
/// refusal whose Debug form names `variant`, `(0, "computed")` when it
/// computed; any other error is the port raising where it should not.
pub(crate) fn port_refused<T, E: std::fmt::Debug + std::fmt::Display>(
    result: Result<T, E>,
    variant: &str,
) -> Result<(u8, String), CaseError> {
    match result {
        Err(e) if names_variant(&format!("{e:?}"), variant) => Ok((1, e.to_string())),
        Err(other) => Err(port(other)),
        Ok(_) => Ok((0, "computed".to_owned())),
    }
}

/// Whether an error's Debug form names `variant` as a whole identifier
/// (`Payload(BiasShape { .. })` names `BiasShape` and `Payload`, not
/// `Bias`): a short variant name must not match a longer one.
pub(crate) fn names_variant(debug: &str, variant: &str) -> bool {
    !variant.is_empty()
        && debug
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == variant)
}

/// A refusal case's output: "refused" compared (uint8 `[1]`), and each
/// side's message in the report.
///
/// An unperturbed run where neither side refused is an error, not a pass:
/// the case's breakage no longer breaks anything, so it tests no refusal
/// (the proof mode hands the reference a valid twin on purpose).
pub(crate) fn refusal_output(
    ctx: &crate::case::Ctx,
    path: &str,
    port_said: (u8, String),
    reference: crate::reference::Refusal,
) -> Result<crate::case::CaseOutput, CaseError> {
    if !ctx.perturbed() && port_said.0 == 0 && !reference.raised {
        return Err(CaseError::Harness(
            "both sides computed: this input is no refusal; fix the case's breakage".into(),
        ));
    }
    let mut out = crate::case::CaseOutput::new(path);
    let flag = HostTensor::new(DType::Uint8, vec![1], vec![port_said.0])?;
    out.compare("refused", &flag, &reference.refused);
    Ok(out.with_finding(serde_json::json!({
        "port": port_said.1,
        "reference": reference.message,
    })))
}

#[cfg(test)]
mod tests {
    use super::names_variant;

    #[test]
    fn a_variant_is_named_as_a_whole_identifier() {
        let debug = "Payload(BiasShape { expected: [32], actual: [33] })";
        assert!(names_variant(debug, "BiasShape"));
        assert!(names_variant(debug, "Payload"));
        assert!(!names_variant(debug, "Bias"));
        assert!(!names_variant("RankMismatch { .. }", "Rank"));
        assert!(!names_variant(debug, ""));
    }

    #[test]
    fn an_empty_expected_text_is_refused() {
        let computed: Result<(), crate::case::CaseError> = Ok(());
        let err = crate::reference::refusal(computed, " ").unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
