//! Query values: `None` is skipped, sequences repeat the key.

/// A value a query parameter can take.
///
/// Scalars give one value, `Option::None` gives none (the parameter is skipped), and sequences
/// (`Vec`, slices, arrays) repeat the key once per element. A `serde_json::Value` follows the same
/// rules (`null` skipped, arrays repeated, strings as is, objects as JSON text).
pub trait QueryValue {
    /// Appends this value's query values to `out`.
    fn append_values(&self, out: &mut Vec<String>);
}

impl<T: QueryValue + ?Sized> QueryValue for &T {
    fn append_values(&self, out: &mut Vec<String>) {
        (**self).append_values(out);
    }
}

impl QueryValue for str {
    fn append_values(&self, out: &mut Vec<String>) {
        out.push(self.to_owned());
    }
}

impl QueryValue for String {
    fn append_values(&self, out: &mut Vec<String>) {
        out.push(self.clone());
    }
}

macro_rules! display_values {
    ($($t:ty),*) => {$(
        impl QueryValue for $t {
            fn append_values(&self, out: &mut Vec<String>) {
                out.push(self.to_string());
            }
        }
    )*};
}

display_values!(
    bool, char, i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, f32, f64
);

impl<T: QueryValue> QueryValue for Option<T> {
    fn append_values(&self, out: &mut Vec<String>) {
        if let Some(value) = self {
            value.append_values(out);
        }
    }
}

impl<T: QueryValue> QueryValue for [T] {
    fn append_values(&self, out: &mut Vec<String>) {
        for value in self {
            value.append_values(out);
        }
    }
}

impl<T: QueryValue, const N: usize> QueryValue for [T; N] {
    fn append_values(&self, out: &mut Vec<String>) {
        self.as_slice().append_values(out);
    }
}

impl<T: QueryValue> QueryValue for Vec<T> {
    fn append_values(&self, out: &mut Vec<String>) {
        self.as_slice().append_values(out);
    }
}

impl QueryValue for serde_json::Value {
    fn append_values(&self, out: &mut Vec<String>) {
        match self {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(values) => values.as_slice().append_values(out),
            other => out.push(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(value: impl QueryValue) -> Vec<String> {
        let mut out = Vec::new();
        value.append_values(&mut out);
        out
    }

    #[test]
    fn values_follow_the_rules() {
        assert_eq!(values("a"), ["a"]);
        assert_eq!(values(5_u32), ["5"]);
        assert_eq!(values(None::<&str>), Vec::<String>::new());
        assert_eq!(values(Some(true)), ["true"]);
        assert_eq!(values(["x", "y"]), ["x", "y"]);
        assert_eq!(values(vec![Some(1), None, Some(3)]), ["1", "3"]);
        assert_eq!(
            values(serde_json::json!([null, "s", 2, { "a": 1 }])),
            ["s", "2", "{\"a\":1}"]
        );
    }
}
