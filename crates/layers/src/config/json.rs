//! Typed reads of JSON values with dotted key names for errors.

use serde_json::{Map, Value};

use super::ConfigError;

/// The JSON type of `v`, in words.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn shown(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 60 {
        format!("{} {}…", kind(v), text.chars().take(57).collect::<String>())
    } else {
        format!("{} {}", kind(v), text)
    }
}

/// One JSON object and its dotted position in the file.
#[derive(Clone, Copy)]
pub(crate) struct Obj<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) prefix: &'a str,
}

impl<'a> Obj<'a> {
    pub(crate) fn root(map: &'a Map<String, Value>) -> Self {
        Obj { map, prefix: "" }
    }

    pub(crate) fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    /// The value at `k`; JSON `null` counts as present (the reference keeps
    /// an explicit `None`).
    pub(crate) fn get(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k)
    }

    pub(crate) fn wrong(&self, k: &str, expected: &'static str, v: &Value) -> ConfigError {
        ConfigError::WrongType {
            key: self.key(k),
            expected,
            got: shown(v),
        }
    }

    /// A non-negative integer, or `None` when absent.
    pub(crate) fn opt_usize(&self, k: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a non-negative integer", v)),
        }
    }

    /// An integer token id, or `None` when absent.
    pub(crate) fn opt_i32(&self, k: &str) -> Result<Option<i32>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(k, "an integer that fits int32", v)),
        }
    }

    /// A number (integer or float) as f64, or `None` when absent.
    pub(crate) fn opt_f64(&self, k: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a number", v)),
        }
    }

    /// A string, or `None` when absent.
    pub(crate) fn opt_str(&self, k: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(k, "a string", v)),
        }
    }

    /// A list of non-negative integers, or `None` when absent.
    pub(crate) fn opt_usize_list(&self, k: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => {
                let items = v
                    .as_array()
                    .ok_or_else(|| self.wrong(k, "a list of non-negative integers", v))?;
                items
                    .iter()
                    .map(|i| {
                        i.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| self.wrong(k, "a list of non-negative integers", v))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
        }
    }

    /// A required key: present, else [`ConfigError::MissingKey`].
    pub(crate) fn require<T>(
        &self,
        k: &str,
        value: Option<T>,
        reference: &'static str,
    ) -> Result<T, ConfigError> {
        value.ok_or_else(|| ConfigError::MissingKey {
            key: self.key(k),
            reference,
        })
    }
}
