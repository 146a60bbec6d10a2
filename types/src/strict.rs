//! Reads parsed JSON into a request type the way its JSON Schema (the OpenAPI document) reads
//! it; the server reads every request body through it.
//!
//! serde's derived structs also accept a JSON array, matched to the fields by position, so
//! `[["true"]]` would read as a task whose command is `["true"]` and `[null, null]` as
//! empty queue limits; JSON Schema counts `1.0` as an integer where serde refuses it. Through
//! [`from_value`], a struct reads only from a JSON object, at any depth, and an integer field
//! also from a number without a fraction. Everything else reads as `serde_json` reads it.

use serde::de::value::{Error, MapDeserializer, SeqDeserializer, StringDeserializer};
use serde::de::{self, DeserializeOwned, IntoDeserializer, Unexpected, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::Value;

/// `T` from `value`, structs from objects only; the error is serde's, after the path of the
/// field at fault (`tasks[0].run_at: …`).
pub fn from_value<T: DeserializeOwned>(
    value: Value,
) -> Result<T, serde_path_to_error::Error<Error>> {
    serde_path_to_error::deserialize(Strict(value))
}

/// A JSON value as a deserializer with the rules above.
struct Strict(Value);

impl Strict {
    fn unexpected(&self) -> Unexpected<'_> {
        match &self.0 {
            Value::Null => Unexpected::Unit,
            Value::Bool(b) => Unexpected::Bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => Unexpected::Unsigned(u),
                (_, Some(i), _) => Unexpected::Signed(i),
                (_, _, f) => Unexpected::Float(f.unwrap_or(f64::NAN)),
            },
            Value::String(s) => Unexpected::Str(s),
            Value::Array(_) => Unexpected::Seq,
            Value::Object(_) => Unexpected::Map,
        }
    }

    /// An integer field: a float without a fraction reads as the integer it equals.
    fn integer<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if let Value::Number(n) = &self.0
            && let Some(f) = n.as_f64()
            && !n.is_i64()
            && !n.is_u64()
            && f.fract() == 0.0
        {
            // Beyond the i64 range the visitor refuses the float as out of range.
            if f >= i64::MIN as f64 && f < i64::MAX as f64 {
                return visitor.visit_i64(f as i64);
            }
        }
        de::Deserializer::deserialize_any(self, visitor)
    }
}

impl<'de> IntoDeserializer<'de, Error> for Strict {
    type Deserializer = Strict;

    fn into_deserializer(self) -> Strict {
        self
    }
}

impl<'de> de::Deserializer<'de> for Strict {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(Strict));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Object(fields) => {
                let mut map = MapDeserializer::new(fields.into_iter().map(|(k, v)| (k, Strict(v))));
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            // The request types' enums are unit variants, written as their names.
            Value::String(s) => visitor.visit_enum(StringDeserializer::<Error>::new(s)),
            _ => Err(de::Error::invalid_type(self.unexpected(), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.integer(visitor)
    }

    forward_to_deserialize_any! {
        bool i128 u128 f32 f64 char str string bytes byte_buf unit unit_struct seq tuple
        tuple_struct map identifier
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::from_value;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        n: i32,
        #[serde(default)]
        x: Option<f64>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Outer {
        items: Vec<Inner>,
        #[serde(default)]
        any: Option<serde_json::Value>,
    }

    #[test]
    fn structs_read_from_objects_only() {
        let err = from_value::<Inner>(json!([1, null])).unwrap_err();
        assert!(
            err.to_string().contains("invalid type: sequence"),
            "an array is not a struct: {err}"
        );
        let err = from_value::<Outer>(json!({"items": [[1]]})).unwrap_err();
        assert!(
            err.to_string().contains("invalid type: sequence"),
            "nor is it one inside another: {err}"
        );
        let err = from_value::<Inner>(json!({"n": 1, "y": 2})).unwrap_err();
        assert!(err.to_string().contains("unknown field `y`"), "{err}");
        assert_eq!(
            from_value::<Outer>(json!({"items": [{"n": 2, "x": 1}], "any": [1.0, {"a": null}]}))
                .unwrap(),
            Outer {
                items: vec![Inner { n: 2, x: Some(1.0) }],
                any: Some(json!([1.0, {"a": null}])),
            },
            "objects, arrays of them and free JSON read as serde_json reads them"
        );
    }

    #[test]
    fn integers_read_from_floats_without_a_fraction() {
        assert_eq!(from_value::<Inner>(json!({"n": 3.0})).unwrap().n, 3);
        let err = from_value::<Inner>(json!({"n": 3.5})).unwrap_err();
        assert!(
            err.to_string().contains("invalid type: floating point"),
            "{err}"
        );
        let err = from_value::<Inner>(json!({"n": 1e10})).unwrap_err();
        assert!(
            err.to_string().contains("invalid value"),
            "out of range: {err}"
        );
    }
}
