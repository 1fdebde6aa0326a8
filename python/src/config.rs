//! `Context(**config)`: keyword settings on top of the `FERRYLINK_*` environment.
//!
//! Each keyword is one of the library's variables (`ferrylink::transport::config::VARIABLES`)
//! without its `FERRYLINK_` prefix, in lower case (`transport="native"`,
//! `timeout_ms=5000`): the same names, values and checks as the environment, through
//! `Config::from_lookup`. A keyword wins over the variable; a variable no keyword names
//! applies as it does for Rust programs.

use crate::errors;
use ferrylink::transport::config::VARIABLES;
use ferrylink::transport::Config;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use std::collections::HashMap;

const PREFIX: &str = "FERRYLINK_";

/// The keyword of a variable: `FERRYLINK_TIMEOUT_MS` → `timeout_ms`.
fn keyword_of(variable: &str) -> String {
    variable.strip_prefix(PREFIX).unwrap_or(variable).to_ascii_lowercase()
}

/// The keywords `Context` takes, each with the variable it stands for, its default and
/// what it accepts: `{keyword: (variable, default, accepts)}`.
#[pyfunction]
pub(crate) fn config_keys(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let keys = PyDict::new(py);
    for v in VARIABLES {
        keys.set_item(keyword_of(v.name), (v.name, v.default, v.expected))?;
    }
    Ok(keys)
}

/// A keyword's value as the text a variable would hold: `True`/`False` as 1/0, numbers in
/// decimal, strings as they are.
fn value_text(key: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(if flag.is_true() { "1" } else { "0" }.to_owned());
    }
    if value.is_instance_of::<PyInt>() || value.is_instance_of::<PyString>() {
        return Ok(value.str()?.to_string());
    }
    if let Ok(path) = value.call_method0("__fspath__") {
        return Ok(path.str()?.to_string());
    }
    let type_name = value.get_type().name()?;
    Err(PyTypeError::new_err(format!("Context({key}=...) takes a str, int, bool or path, not {type_name}")))
}

/// The configuration of `Context(**kwargs)`: the environment's variables, overridden by
/// the keywords. An unknown keyword is a `TypeError` listing the known ones; a value the
/// variable does not accept is a `ConfigError` naming the variable.
pub(crate) fn config_from(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Config> {
    let mut given: HashMap<String, String> = HashMap::new();
    if let Some(kwargs) = kwargs {
        for (key, value) in kwargs.iter() {
            let key: String = key.extract()?;
            let Some(variable) = VARIABLES.iter().find(|v| keyword_of(v.name) == key) else {
                let known: Vec<String> = VARIABLES.iter().map(|v| keyword_of(v.name)).collect();
                return Err(PyTypeError::new_err(format!(
                    "Context() got an unknown setting {key:?}; the settings are: {}",
                    known.join(", ")
                )));
            };
            given.insert(variable.name.to_owned(), value_text(&key, &value)?);
        }
    }
    let from_env = |name: &str| match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(value)) => Some(value.to_string_lossy().into_owned()),
    };
    Config::from_lookup(|name| given.get(name).cloned().or_else(|| from_env(name)))
        .map_err(|e| errors::error(py, "ConfigError", e.to_string()))
}

/// The settings in force, `{keyword: value}`, each spelt as its variable would be.
pub(crate) fn settings_of<'py>(py: Python<'py>, config: &Config) -> PyResult<Bound<'py, PyDict>> {
    let settings = PyDict::new(py);
    for v in VARIABLES {
        settings.set_item(keyword_of(v.name), (v.show)(config))?;
    }
    Ok(settings)
}
