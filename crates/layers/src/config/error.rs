//! The one error type of config reading.

use std::path::PathBuf;

/// A `config.json` the layers cannot be built from. Every variant names the
/// key (dotted from the file's root, e.g. `text_config.rope_parameters`),
/// what the reference does with it, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the config: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not JSON.
    #[error("{}:{line}:{column}: not valid JSON ({message}); fix the file or re-download it", .path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// serde_json's message.
        message: String,
    },
    /// JSON whose root is not an object.
    #[error("{}: a config must be a JSON object, found {got}", .path.display())]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// What the root is.
        got: &'static str,
    },
    /// A key the reference requires and has no default for.
    #[error("`{key}` is missing: {reference}; add it (the model's original config.json has it)")]
    MissingKey {
        /// Dotted key.
        key: String,
        /// What the reference does without it.
        reference: &'static str,
    },
    /// A key of the wrong JSON type.
    #[error("`{key}` must be {expected}, found {got}")]
    WrongType {
        /// Dotted key.
        key: String,
        /// The JSON type the reference needs.
        expected: &'static str,
        /// What the file holds (type and value).
        got: String,
    },
    /// A value of the right type that the reference rejects, or that
    /// builds no valid layer.
    #[error("`{key}` = {value} is invalid: {why}")]
    InvalidValue {
        /// Dotted key.
        key: String,
        /// The value as written.
        value: String,
        /// Why, and what the reference does.
        why: String,
    },
    /// `rope_parameters` without one of the keys mlx-vlm's `TextConfig`
    /// requires (`ValueError: rope_parameters must contain keys …`).
    #[error("`{key}` lacks {missing:?}: mlx-vlm's TextConfig requires mrope_section, type (or rope_type), rope_theta and partial_rotary_factor (ValueError at load); add the missing keys")]
    RopeParametersIncomplete {
        /// Dotted key of the `rope_parameters` object.
        key: String,
        /// The required keys it lacks, sorted.
        missing: Vec<&'static str>,
    },
    /// A `model_type` this reader does not cover.
    #[error("`{key}` = {got:?} is not {expected}; this reader covers {expected} only")]
    ModelType {
        /// Dotted key.
        key: String,
        /// The model types accepted.
        expected: &'static str,
        /// What the file says.
        got: String,
    },
    /// Any of the above, in a file.
    #[error("{}: {source}", .path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The error with the file it came from.
    pub(crate) fn in_file(self, path: impl Into<PathBuf>) -> ConfigError {
        match self {
            e @ (ConfigError::Read { .. }
            | ConfigError::Json { .. }
            | ConfigError::NotAnObject { .. }
            | ConfigError::InFile { .. }) => e,
            e => ConfigError::InFile {
                path: path.into(),
                source: Box::new(e),
            },
        }
    }

    /// The dotted key the error is about, if any (for tests and reports).
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::MissingKey { key, .. }
            | ConfigError::WrongType { key, .. }
            | ConfigError::InvalidValue { key, .. }
            | ConfigError::RopeParametersIncomplete { key, .. }
            | ConfigError::ModelType { key, .. } => Some(key),
            ConfigError::InFile { source, .. } => source.key(),
            _ => None,
        }
    }
}
