//! Reading typed fields out of a JSON value while remembering where they
//! came from, so that a field of the wrong type becomes an error naming the
//! file and the field (`jobs[3].read.iops`) instead of a panic.

use std::str::FromStr;

use serde_json::Value;

use crate::error::ReportError;

/// A JSON value, the file it is in and its path within that file.
#[derive(Clone, Copy)]
pub(crate) struct Node<'a> {
    file: &'a str,
    path: Path<'a>,
    value: &'a Value,
}

/// A field's path, built lazily: only an error spells it out.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn text(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Key(Path::Root, key) => (*key).to_string(),
            Path::Key(parent, key) => format!("{}.{key}", parent.text()),
            Path::Index(parent, index) => format!("{}[{index}]", parent.text()),
        }
    }
}

/// What a JSON value is, in words, for error messages.
fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Node<'a> {
    /// The whole document of `file`.
    pub(crate) fn root(file: &'a str, value: &'a Value) -> Node<'a> {
        Node {
            file,
            path: Path::Root,
            value,
        }
    }

    /// An error about this field.
    pub(crate) fn error(&self, problem: impl Into<String>) -> ReportError {
        let field = match self.path {
            Path::Root => "(top level)".to_string(),
            path => path.text(),
        };
        ReportError::Field {
            file: self.file.to_string(),
            field,
            problem: problem.into(),
        }
    }

    fn wrong_type(&self, wanted: &str) -> ReportError {
        self.error(format!("should be {wanted}, found {}", kind_of(self.value)))
    }

    /// The member `key` of this object, which must be present.
    pub(crate) fn get<R>(
        &self,
        key: &str,
        read: impl FnOnce(Node<'_>) -> Result<R, ReportError>,
    ) -> Result<R, ReportError> {
        match self.opt(key, read)? {
            Some(found) => Ok(found),
            None => {
                let path = Path::Key(&self.path, key);
                let missing = Node {
                    file: self.file,
                    path,
                    value: self.value,
                };
                Err(missing.error("is missing"))
            }
        }
    }

    /// The member `key` of this object, or `None` when it is absent or null.
    pub(crate) fn opt<R>(
        &self,
        key: &str,
        read: impl FnOnce(Node<'_>) -> Result<R, ReportError>,
    ) -> Result<Option<R>, ReportError> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong_type("an object"));
        };
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => {
                let path = Path::Key(&self.path, key);
                read(Node {
                    file: self.file,
                    path,
                    value,
                })
                .map(Some)
            }
        }
    }

    /// Reads every element of this array.
    pub(crate) fn items<R>(
        &self,
        mut read: impl FnMut(Node<'_>) -> Result<R, ReportError>,
    ) -> Result<Vec<R>, ReportError> {
        let Value::Array(items) = self.value else {
            return Err(self.wrong_type("an array"));
        };
        items
            .iter()
            .enumerate()
            .map(|(index, value)| {
                let path = Path::Index(&self.path, index);
                read(Node {
                    file: self.file,
                    path,
                    value,
                })
            })
            .collect()
    }

    /// Reads every member of this object, in the file's order.
    pub(crate) fn entries<R>(
        &self,
        mut read: impl FnMut(&str, Node<'_>) -> Result<R, ReportError>,
    ) -> Result<Vec<R>, ReportError> {
        let Value::Object(map) = self.value else {
            return Err(self.wrong_type("an object"));
        };
        map.iter()
            .map(|(key, value)| {
                let path = Path::Key(&self.path, key);
                read(
                    key,
                    Node {
                        file: self.file,
                        path,
                        value,
                    },
                )
            })
            .collect()
    }

    /// This value as a string.
    pub(crate) fn str(&self) -> Result<String, ReportError> {
        self.value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| self.wrong_type("a string"))
    }

    /// This value as a number.
    pub(crate) fn f64(&self) -> Result<f64, ReportError> {
        self.value
            .as_f64()
            .ok_or_else(|| self.wrong_type("a number"))
    }

    /// This value as a whole number of zero or more.
    pub(crate) fn u64(&self) -> Result<u64, ReportError> {
        self.value
            .as_u64()
            .ok_or_else(|| self.wrong_type("a whole number"))
    }

    /// This value as a boolean.
    pub(crate) fn bool(&self) -> Result<bool, ReportError> {
        self.value
            .as_bool()
            .ok_or_else(|| self.wrong_type("true or false"))
    }

    /// This value as a list of strings.
    pub(crate) fn strings(&self) -> Result<Vec<String>, ReportError> {
        self.items(|item| item.str())
    }

    /// A string holding a value of type `T` (fio writes `"iodepth": "32"`);
    /// `what` describes `T` for the error.
    pub(crate) fn parsed<T: FromStr>(&self, what: &str) -> Result<T, ReportError> {
        let text = self.str()?;
        text.trim()
            .parse()
            .map_err(|_| self.error(format!("should be {what}, found \"{text}\"")))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn errors_spell_out_the_path() {
        let value = json!({"jobs": [{"read": {"iops": 1}}, {"read": {"iops": "x"}}]});
        let root = Node::root("r.json", &value);
        let error = root
            .get("jobs", |jobs| {
                jobs.items(|job| job.get("read", |read| read.get("iops", |n| n.f64())))
            })
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "r.json: field `jobs[1].read.iops` should be a number, found a string"
        );
    }

    #[test]
    fn missing_and_null_fields() {
        let value = json!({"a": null});
        let root = Node::root("f", &value);
        assert_eq!(root.opt("a", |n| n.f64()).unwrap(), None);
        let error = root.get("b", |n| n.f64()).unwrap_err();
        assert_eq!(error.to_string(), "f: field `b` is missing");
    }

    #[test]
    fn parsed_strings() {
        let value = json!({"iodepth": "32", "bad": "deep"});
        let root = Node::root("f", &value);
        assert_eq!(
            root.get("iodepth", |n| n.parsed::<u32>("a count")).unwrap(),
            32
        );
        let error = root.get("bad", |n| n.parsed::<u32>("a count")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "f: field `bad` should be a count, found \"deep\""
        );
    }
}
